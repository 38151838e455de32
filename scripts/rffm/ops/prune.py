"""`rffm prune`: remove what the current config no longer plans (stale step folders), dry run first.

Stale is not broken: the outputs of a removed run, of epochs beyond the configured count, of a
dataset or backbone no run uses any more stay valid records of what was computed; they only stop
counting for `rffm verify` and `rffm status`. Prune deletes them on request. It never touches the
records of the results store — the ledger, the artifacts, the memo of completed steps — nor a run's
launch records, nor the logs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rffm.records.layout import KEPT, SENTINEL_NAME, planned_steps


def stale_folders(results_dir: str | Path, config: dict) -> list[Path]:
    """Step folders with a sentinel that the config's plan does not write (never a kept record)."""
    results = Path(results_dir)
    planned = planned_steps(config)
    stale = []
    for sentinel_path in sorted(results.rglob(SENTINEL_NAME)):
        folder = sentinel_path.parent.relative_to(results).as_posix()
        if folder.split("/")[0] not in KEPT and folder not in planned:
            stale.append(sentinel_path.parent)
    return stale


def prune(results_dir: str | Path, config: dict, delete: bool = False) -> list[Path]:
    """The stale step folders (removed when `delete`), and run folders left empty but for their launch records."""
    stale = stale_folders(results_dir, config)
    if delete:
        for folder in stale:
            shutil.rmtree(folder)
        for folder in {path.parent for path in stale}:
            while folder != Path(results_dir) and folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent
    return stale
