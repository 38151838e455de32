"""`rffm prune`: remove what the plan no longer has (stale step folders), dry run first.

Stale is not broken: the outputs of a removed run, of epochs beyond the configured count, of a
dataset or backbone no run uses any more stay valid records of what was computed; they only stop
counting for `rffm verify` and `rffm status`. Prune deletes them on request. It never touches the
records of the results store — the ledger, the artifacts, the memo of completed steps — nor the logs,
nor the launch and plan records of a run the plan still has, and never a qualified run's folders (its
test result) unless that run is named on the command line (`--delete-qualified RUN`). A run the plan no
longer has goes whole once nothing of it is kept: its launch and plan records too, so that no command
judges it by them again (it would stay "pending" for good).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rffm.records.layout import KEPT, QUALIFICATION, RUNS, SENTINEL_NAME, run_folder
from rffm.records.plans import Judgment


def stale_folders(results_dir: str | Path, config: dict[str, Any] | Judgment) -> list[Path]:
    """Step folders with a sentinel that the plan (a judgment, or a config) does not write (never a kept record), and
    the folders of runs it does not have that hold no step folder (only their launch and plan records are left)."""
    results = Path(results_dir)
    judgment = config if isinstance(config, Judgment) else Judgment(config)
    stale = []
    for sentinel_path in sorted(results.rglob(SENTINEL_NAME)):
        folder = sentinel_path.parent.relative_to(results).as_posix()
        if folder.split("/")[0] not in KEPT and not judgment.is_planned(folder):
            stale.append(sentinel_path.parent)
    runs = results / RUNS
    for folder in sorted(runs.iterdir()) if runs.is_dir() else []:
        if folder.is_dir() and not judgment.has_run(folder.name) and not any(folder.rglob(SENTINEL_NAME)):
            stale.append(folder)
    return stale


def qualified_stale_runs(results_dir: str | Path, stale: list[Path]) -> list[str]:
    """Runs whose qualification folder is among the stale folders: deleting them would delete a test result."""
    results = Path(results_dir)
    return sorted({f.parent.name for f in stale if f.name == QUALIFICATION and f.parent.parent == results / RUNS})


def prune(
    results_dir: str | Path, config: dict[str, Any] | Judgment, delete: bool = False, qualified: list[str] | None = None
) -> tuple[list[Path], list[str]]:
    """(the stale step folders, removed when `delete`; the qualified runs whose folders are kept because they were
    not named in `qualified`). Folders left empty are removed too, and so is the folder of a run the plan no longer
    has once no step folder of it is left (its launch and plan records with it)."""
    judgment = config if isinstance(config, Judgment) else Judgment(config)
    stale = stale_folders(results_dir, judgment)
    kept = [run for run in qualified_stale_runs(results_dir, stale) if run not in (qualified or [])]
    keep = [Path(results_dir) / run_folder(run) for run in kept]
    if delete:
        removed = [folder for folder in stale if not any(folder.is_relative_to(run) for run in keep)]
        for folder in removed:
            shutil.rmtree(folder)
        for folder in {path.parent for path in removed}:
            while folder != Path(results_dir) and folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent
        for run in {path.relative_to(results_dir).parts[1] for path in removed if path.is_relative_to(Path(results_dir) / RUNS)}:
            folder = Path(results_dir) / run_folder(run)
            if folder.exists() and not judgment.has_run(run) and not any(folder.rglob(SENTINEL_NAME)):
                shutil.rmtree(folder)  # only its launch and plan records (and unfinished step folders) were left
    return stale, kept
