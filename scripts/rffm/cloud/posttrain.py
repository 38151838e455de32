"""`rffm posttrain`: the whole workflow in one process (Snakemake API, local executor) for single-job launchers.

A Cloud Batch job or a Vertex AI custom job runs one container command; this is it. The
launcher's output directories arrive as AIP_MODEL_DIR (the selected artifact and its model card
are copied there), AIP_CHECKPOINT_DIR (config `checkpoint_store`: every completed epoch is kept
there and restored from there on relaunch, rffm.records.memo) and AIP_TENSORBOARD_LOG_DIR. Vertex AI passes them as gs://
URIs; they are used through the Cloud Storage FUSE mount (/gcs/<bucket>/..., RFFM_GCS_MOUNT).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from rffm import config as rffm_config
from rffm.errors import ConfigError
from rffm.ops.unlock import clear_stale_lock
from rffm.records.files import atomic_write_bytes, read_json
from rffm.records.layout import (
    EXPORT,
    EXPORT_FILES,
    MANIFEST_NAME,
    MEMO,
    METRICS_NAME,
    MODEL_CARD,
    QUALIFICATION,
    SELECTION,
    SELECTION_NAME,
    run_folder,
)

PROCEDURES = ("validation_selection", "final_qualification")
GCS_MOUNT_ENV = "RFFM_GCS_MOUNT"
SNAKEFILE_ENV = "RFFM_SNAKEFILE"
# Hook point for TensorBoard event logs: steps that write them read this variable, set here to a filesystem path.
TENSORBOARD_ENV = "AIP_TENSORBOARD_LOG_DIR"


def storage_path(value: str | None, variable: str, environ=os.environ) -> Path | None:
    """A launcher-given directory as a local path: gs://bucket/x maps to the FUSE mount /gcs/bucket/x."""
    if not value:
        return None
    if value.startswith("gs://"):
        return Path(environ.get(GCS_MOUNT_ENV, "/gcs")) / value[len("gs://") :].rstrip("/")
    if "://" in value:
        raise ConfigError(f"{variable}={value}: only local paths and gs:// URIs (through the /gcs FUSE mount) are supported")
    return Path(value)


def default_snakefile() -> Path:
    """The workflow this package belongs to (RFFM_SNAKEFILE overrides)."""
    if os.environ.get(SNAKEFILE_ENV):
        return Path(os.environ[SNAKEFILE_ENV])
    return Path(__file__).resolve().parents[3] / "workflow" / "Snakefile"


def load_config(configs: list[str | Path], overrides: dict[str, str]) -> dict[str, Any]:
    """The merged configuration the workflow will see, with the schema's defaults filled in."""
    for path in configs:
        if not Path(path).is_file():
            raise ConfigError(f"--config {path}: no such file")
    return rffm_config.merge(rffm_config.load(configs), overrides)


def run_workflow(snakefile: Path, workdir: Path, configs: list[str | Path], overrides: dict[str, str], procedure: str, cores: int) -> None:
    """Run the procedure's target with the local executor, resuming whatever a killed launch left incomplete."""
    print(f"rffm posttrain: {clear_stale_lock(workdir)}")  # a relaunch after a kill finds the dead run's lock
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    config_settings = ConfigSettings(configfiles=[Path(c).resolve() for c in configs], config=overrides, replace_workflow_config=True)
    with SnakemakeApi(OutputSettings(printshellcmds=True, show_failed_logs=True)) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=cores), config_settings=config_settings, snakefile=snakefile, workdir=workdir
        )
        dag_api = workflow_api.dag(dag_settings=DAGSettings(targets={procedure}, force_incomplete=True))
        dag_api.execute_workflow(executor="local")


def copy_model_files(results: Path, run_dir: Path, target: Path, procedure: str) -> list[Path]:
    """Copy a run's selected artifact, model card and selection (and manifest after qualification) into target."""
    selection = read_json(run_dir / SELECTION / SELECTION_NAME)
    files = {
        Path(selection["artifact_path"]).name: (results / selection["artifact_path"], 0o444),
        MODEL_CARD: (run_dir / SELECTION / MODEL_CARD, 0o644),
        SELECTION_NAME: (run_dir / SELECTION / SELECTION_NAME, 0o644),
    }
    if procedure == "final_qualification":
        files[MANIFEST_NAME] = (run_dir / QUALIFICATION / MANIFEST_NAME, 0o644)
        files["qualification_metrics.json"] = (run_dir / QUALIFICATION / METRICS_NAME, 0o644)
        # the deployable classifier (rules/export.smk) in its own folder: the artifact URI a Model Registry upload names
        for name in EXPORT_FILES:
            if (run_dir / EXPORT / name).is_file():
                files[f"{EXPORT}/{name}"] = (run_dir / EXPORT / name, 0o444)
    written = []
    for name, (source, mode) in files.items():
        atomic_write_bytes(target / name, source.read_bytes(), mode=mode)
        written.append(target / name)
    return written


def posttrain(
    configs: list[str | Path],
    cache_dir: str | Path,
    procedure: str = "final_qualification",
    directory: str | Path = ".",
    cores: int | None = None,
    snakefile: str | Path | None = None,
) -> int:
    """Run the workflow to `procedure` in this process and export the results to the AIP_* directories; the exit status."""
    from snakemake.exceptions import print_exception

    if procedure not in PROCEDURES:
        raise ConfigError(f"--procedure {procedure}: choose one of {', '.join(PROCEDURES)}")
    snakefile = Path(snakefile) if snakefile else default_snakefile()
    if not snakefile.is_file():
        raise ConfigError(
            f"Snakefile {snakefile} not found. Fix: pass --snakefile, or set {SNAKEFILE_ENV} to the checkout's workflow/Snakefile"
        )
    workdir, cache_dir = Path(directory).resolve(), Path(cache_dir).resolve()
    model_dir = storage_path(os.environ.get("AIP_MODEL_DIR"), "AIP_MODEL_DIR")
    store = storage_path(os.environ.get("AIP_CHECKPOINT_DIR"), "AIP_CHECKPOINT_DIR")
    tensorboard = storage_path(os.environ.get(TENSORBOARD_ENV), TENSORBOARD_ENV)
    # execution settings: where the cache lives on this machine, where completed epochs are kept for a relaunch
    overrides = {"scratch": str(cache_dir), **({"checkpoint_store": str(store)} if store is not None else {})}
    config = load_config(configs, overrides)
    if tensorboard is not None:  # the jobs are subprocesses of this one and inherit it
        os.environ[TENSORBOARD_ENV] = str(tensorboard)
    try:
        run_workflow(snakefile, workdir, configs, overrides, procedure, cores or os.cpu_count() or 1)
    except Exception as exc:  # Snakemake reports job failures and config errors as exceptions
        print_exception(exc)
        return 1
    runs = sorted(config["runs"])
    for run in runs:
        run_dir = workdir / config["results"] / run_folder(run)
        if model_dir is not None:
            target = model_dir if len(runs) == 1 else model_dir / run
            for path in copy_model_files(workdir / config["results"], run_dir, target, procedure):
                print(f"rffm posttrain: {run}: exported {path}")
        if store is not None:
            print(f"rffm posttrain: {run}: completed epochs kept in {store / MEMO}")
        if procedure == "final_qualification":
            print(f"run manifest: {run_dir / QUALIFICATION / MANIFEST_NAME}", file=sys.stdout)
    return 0
