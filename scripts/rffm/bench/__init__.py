"""Benchmarks (`rffm bench cache|sweep|grid|plan|scale|staging`): measured side by side, never imported by a step."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

PROC = Path("/proc")  # the kernel's process table: one folder per pid


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


def _ancestors() -> set[int]:
    """This process and every process above it."""
    chain, pid = set(), os.getpid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            pid = int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return chain


def other_schedulers() -> list[int]:
    """Process ids of snakemake schedulers and rffm commands (a killed scheduler's steps) running on this machine,
    other than this process and those above it."""
    own = _ancestors()
    found = []
    for entry in PROC.glob("[0-9]*"):
        try:
            names = [Path(word.decode(errors="replace")).name for word in (entry / "cmdline").read_bytes().split(b"\0")[:2]]
        except OSError:
            continue
        if int(entry.name) not in own and ("snakemake" in names or "rffm" in names):
            found.append(int(entry.name))
    return sorted(found)


def require_idle(bench: str) -> None:
    """Stop with one line when another scheduler shares the cores: its jobs would spoil the timings."""
    from rffm.errors import RffmError

    if pids := other_schedulers():
        listed = " ".join(str(pid) for pid in pids)
        raise RffmError(
            f"rffm bench {bench}: {len(pids)} other snakemake or rffm process(es) are running (pid {listed}); their jobs share "
            f"the cores and spoil the timings (or wait for them to finish). Fix: kill {listed}"
        )
