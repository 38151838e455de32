"""The command that rebuilds one step folder, as a printed "Fix:" can say it: `snakemake <its sentinel>`.

A missing sentinel under a complete tree is an intermediate file to Snakemake: plain `snakemake` sees the
final outputs complete and does nothing. Naming the sentinel as the target reruns exactly the step that
writes it (its outputs come back byte for byte, so nothing downstream reruns). The command carries the
config options the run was planned with (its plan record, records/plans.py) and starts with `cd` when
the tree's working directory is not the current one. Targets come first: Snakemake's --configfile takes
every word after it as a file.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from rffm.records.layout import RUNS, SENTINEL_NAME, planned_steps, results_root
from rffm.records.plans import latest, run_folders, workdir_of
from rffm.records.store import PosixStore

DEFAULT_CONFIG = "config/config.yaml"  # the Snakefile's own configfile
DEFAULT_SNAKEFILE = "workflow/Snakefile"  # where Snakemake looks from the working directory


def plan_record(results: Path, folder: str) -> dict[str, Any] | None:
    """The plan record that speaks for a step folder: its run's, else the first run's whose plan writes it."""
    store = PosixStore(results)
    parts = folder.split("/")
    runs = [parts[1]] if parts[0] == RUNS and len(parts) > 1 else run_folders(results)
    for run in runs:
        found = latest(store, run)
        if found and (parts[0] == RUNS or folder in planned_steps({"runs": {}, **found[1]["plan"]})):
            return found[1]
    return None


def config_options(record: dict[str, Any]) -> list[str]:
    """The snakemake options that plan as the record says (the files read, the --config overrides)."""
    files = [f["path"] for f in record.get("files", [])]
    options = []
    if record.get("replaced"):
        options += ["--configfile", *files, "--replace-workflow-config"]
    elif [f for f in files if f != DEFAULT_CONFIG]:
        options += ["--configfile", *[f for f in files if f != DEFAULT_CONFIG]]
    if record.get("overrides"):
        options += ["--config", *[f"{key}={_yaml(value)}" for key, value in sorted(record["overrides"].items())]]
    return options


def _yaml(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def rebuild_command(sentinel_path: str | Path, cwd: str | Path | None = None, remove: bool = False) -> str:
    """The shell command, from `cwd` (default: here), that makes the workflow write this sentinel again
    (`remove`: deleting it first, for a step whose outputs no longer match it)."""
    sentinel_path = Path(sentinel_path)
    results = results_root(sentinel_path.parent.absolute())
    if results is None:
        target = shlex.quote(str(sentinel_path))
        return f"rm -f {target} && snakemake {target} --cores all" if remove else f"snakemake {target} --cores all"
    folder = sentinel_path.parent.absolute().relative_to(results).as_posix()
    record = plan_record(results, folder)
    configured = os.path.normpath((record or {}).get("results") or results.name)
    workdir = workdir_of(results, record)
    here = Path(cwd or os.getcwd()).absolute()
    target = f"{configured.rstrip('/')}/{folder}/{SENTINEL_NAME}"
    snakefile = (record or {}).get("snakefile") or DEFAULT_SNAKEFILE
    where = [] if snakefile == DEFAULT_SNAKEFILE else ["-s", snakefile]
    # --cores: Snakemake needs it for local execution; results never depend on it (threads come from the config)
    command = shlex.join(["snakemake", *where, target, "--cores", "all", *(config_options(record) if record else [])])
    command = f"rm -f {shlex.quote(target)} && {command}" if remove else command
    return command if workdir == here else f"cd {shlex.quote(str(workdir))} && {command}"
