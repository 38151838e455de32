"""Benchmarks (`rffm bench cache|sweep|grid|plan|scale|staging`): measured side by side, never imported by a step."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def work_folder(prefix: str, parent: str | Path | None, keep: bool) -> Iterator[Path]:
    """A fresh folder for a bench's data under `parent` (default: the system's temp dir); removed afterwards, its
    immutable ledger entries released first, unless `keep` (then named on stderr: stdout ends with the figures)."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield work
    finally:
        if keep:
            print(f"kept: {work}", file=sys.stderr)
        else:
            from rffm.ops.clean import release_immutable

            release_immutable([work])
            shutil.rmtree(work, ignore_errors=True)
