"""Names and places of everything the workflow writes: one source for the package and the Snakefile."""

from __future__ import annotations

from pathlib import Path

# ---- leaf file names: every file a step writes is named here, and only here ----
SENTINEL_NAME = "sentinel.json"
PROVENANCE_NAME = "provenance.json"
BACKBONE_NAME, PRETRAIN_LOG = "backbone.pt", "pretrain_log.json"  # a backbone folder's files
CACHE_META = "meta.json"  # a cache directory's description of its arrays (cache_files lists the rest)
CHECKPOINT_NAME, METRICS_NAME = "checkpoint.pt", "metrics.json"  # an epoch's files (a sweep's: its bundle and table)
EPOCH_FILES = (CHECKPOINT_NAME, METRICS_NAME)
SELECTION_NAME = "selection.json"  # a selection's record (the chosen epoch and its artifact)
HISTORY_NAME = "history.json"  # a reference's training history (train_reference)
ACCURACY_FIGURE, CONFUSION_FIGURE = "accuracy_vs_snr.png", "confusion_matrix.png"  # a qualification's figures
TRAINING_CURVES, SELECTION_EVIDENCE = "training_curves.png", "selection_evidence.png"  # the validation report's
CACHE_LIFECYCLE, CACHE_LIFECYCLE_SUMMARY = "cache_lifecycle.png", "cache_lifecycle_summary.json"  # the profiling report's
MANIFEST_SUMMARY = "manifest_summary.html"  # the qualification report's
COMPARISON_FIGURE, COMPARISON_TABLE = "comparison.png", "comparison.json"  # the comparison report's
MANIFEST_NAME = "run_manifest.json"  # the qualification's terminal record
MODEL_CARD = "model_card.json"  # a selection's and an export's description of its model
EXPORT_PROGRAM, EXPORT_ONNX, EXPORT_WEIGHTS = "model.pt2", "model.onnx", "weights.safetensors"  # an export's files
EXPORT_FILES = (EXPORT_PROGRAM, EXPORT_ONNX, EXPORT_WEIGHTS, MODEL_CARD)
PROGRAM_SIGNATURE = "rffm_signature.json"  # a record inside the .pt2 (torch.export.load(extra_files=...))
DEVICE_LOCKS = ".devices"  # under a node's `scratch`: one lock file per GPU a job of a group job holds (rffm.runtime.devices)

SPLITS = ("train", "val", "test")
CACHED_SPLITS = ("train", "val")  # the test split is never cached


def split_file(split: str) -> str:
    return f"{split}.h5"


def hidden_file(split: str) -> str:
    return f"{split}.hidden.bf16"


def cache_files() -> list[str]:
    """Every file a cache directory holds besides its sentinel."""
    names = [CACHE_META]
    for split in CACHED_SPLITS:
        names += [hidden_file(split), f"{split}.labels.npy", f"{split}.snr.npy"]
    return names


DATASETS, BACKBONES, CACHES = "datasets", "backbones", "caches"  # the results store's folders of shared steps


def dataset_folder(dataset: str) -> str:
    """A staged dataset's step folder, relative to results."""
    return f"{DATASETS}/{dataset}"


def backbone_folder(backbone: str) -> str:
    """A backbone's step folder, relative to results."""
    return f"{BACKBONES}/{backbone}"


def cache_folder(dataset: str, backbone: str) -> str:
    """The folder of the record of a dataset's hidden-state cache under a backbone, relative to results."""
    return f"{CACHES}/{dataset}__{backbone}"


RUNS = "runs"  # the results store's folder of runs and references
# The step folders inside a run's folder (runs/<run>/...).
EPOCHS, SELECTION, QUALIFICATION, EXPORT, PROFILING, REPORT = "epochs", "selection", "qualification", "export", "profiling", "report"


def run_folder(run: str) -> str:
    """A run's (or reference's) folder, relative to results."""
    return f"{RUNS}/{run}"


def epochs_folder(run: str) -> str:
    """The folder of a run's epoch step folders, relative to results."""
    return f"{run_folder(run)}/{EPOCHS}"


def epoch_folder(run: str, epoch: int | str) -> str:
    """One epoch's step folder, relative to results."""
    return f"{epochs_folder(run)}/{epoch}"


def selection_folder(run: str) -> str:
    return f"{run_folder(run)}/{SELECTION}"


def qualification_folder(run: str) -> str:
    return f"{run_folder(run)}/{QUALIFICATION}"


def export_folder(run: str) -> str:
    return f"{run_folder(run)}/{EXPORT}"


def profiling_folder(run: str) -> str:
    """A profiled run's traces and lifecycle summary, relative to results."""
    return f"{run_folder(run)}/{PROFILING}"


REPORTS = ("validation", "qualification", "profiling")  # a run's report figures, by the stage they show


def report_folder(run: str, part: str) -> str:
    """The folder of a run's report figures of one stage (REPORTS), relative to results."""
    return f"{run_folder(run)}/{REPORT}/{part}"


COMPARISON_FOLDER = f"{REPORT}/comparison"  # the floor | frozen | end-to-end figure of every qualified result
LAUNCH = "launch"  # a run's launch and plan records (records/launch.py, records/plans.py)


def launch_folder(run: str) -> str:
    return f"{run_folder(run)}/{LAUNCH}"


def log_file(rule: str, name: str = "") -> str:
    """A job's log, relative to results (a rule with one job: logs/<rule>.log)."""
    return f"logs/{rule}/{name}.log" if name else f"logs/{rule}.log"


def results_root(folder: Path) -> Path | None:
    """The results tree a step folder (as given: absolute or resolved) lies in; None outside any results tree.

    The parent of its datasets/, backbones/, caches/ or runs/ folder (runs/<run>/report/<part> included);
    of report/comparison, the parent of report/."""
    if folder.as_posix().endswith(f"/{COMPARISON_FOLDER}"):
        return folder.parent.parent
    return next((parent.parent for parent in folder.parents if parent.name in (RUNS, DATASETS, BACKBONES, CACHES)), None)


def root_of(path: str, folder: str) -> str:
    """The results root a step folder (relative to results) lies in, from that folder's path as a job sees it."""
    path = path.rstrip("/")
    if path != folder and not path.endswith(f"/{folder}"):
        raise ValueError(f"{path} is not the step folder {folder}")
    return path[: -len(folder)].rstrip("/") or "."


ARTIFACTS = "artifacts"  # the results store's folder of selected heads, by content


def artifact_name(sha256: str) -> str:
    """A selected head's file name: its content address."""
    return f"sha256-{sha256}.pt"


EXPORTS = "exports"  # the results store's folder of exported classifiers' files, by content


def export_name(sha256: str, suffix: str) -> str:
    """An exported file's key in the results store: its content address, keeping its kind (.pt2, .onnx, .safetensors)."""
    return f"{EXPORTS}/sha256-{sha256}{suffix}"


LEDGER = "ledger"  # the test-split ledger (records/ledger.py)
MEMO = "memo"  # completed epochs, by identity (records/memo.py)
TENSORBOARD = "tensorboard"  # `rffm tensorboard`'s default event-log folder
RUNNING = "running"  # a running step's heartbeat, one file per step folder (rffm.runtime.progress; `rffm status`): no rule output
# Folders of the results store that hold records, never rule outputs: kept whatever the config says.
KEPT = (LEDGER, ARTIFACTS, MEMO, EXPORTS)


def planned_steps(config: dict) -> set[str]:
    """The step folders (relative to results) the config's full plan (final_qualification) writes sentinels in."""
    folders = set()
    for name, run in config.get("runs", {}).items():
        dataset, backbone = run["dataset"], run["backbone"]
        folders |= {dataset_folder(dataset), backbone_folder(backbone), cache_folder(dataset, backbone)}
        spec = config["backbones"].get(backbone, {})
        if spec.get("dataset"):
            folders.add(dataset_folder(spec["dataset"]))
        folders |= {epoch_folder(name, epoch) for epoch in range(1, run["train"]["epochs"] + 1)}
        folders |= {selection_folder(name), qualification_folder(name)}
        if run.get("export", True):
            folders.add(export_folder(name))
        folders |= {report_folder(name, "validation"), report_folder(name, "qualification")}
        if run.get("profiling"):
            folders |= {profiling_folder(name), report_folder(name, "profiling")}
    for name, reference in config.get("references", {}).items():  # end-to-end references: trained and qualified
        folders |= {dataset_folder(reference["dataset"]), selection_folder(name), qualification_folder(name)}
    if config.get("references"):
        folders.add(COMPARISON_FOLDER)
    return folders
