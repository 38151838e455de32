"""Names and places of everything the workflow writes: one source for the package and the Snakefile."""

from __future__ import annotations

SENTINEL_NAME = "sentinel.json"
PROVENANCE_NAME = "provenance.json"
SPLITS = ("train", "val", "test")
CACHED_SPLITS = ("train", "val")  # the test split is never cached


def split_file(split: str) -> str:
    return f"{split}.h5"


def hidden_file(split: str) -> str:
    return f"{split}.hidden.bf16"


def cache_files() -> list[str]:
    """Every file a cache directory holds besides its sentinel."""
    names = ["meta.json"]
    for split in CACHED_SPLITS:
        names += [hidden_file(split), f"{split}.labels.npy", f"{split}.snr.npy"]
    return names


def dataset_folder(dataset: str) -> str:
    """A staged dataset's step folder, relative to results."""
    return f"datasets/{dataset}"


def backbone_folder(backbone: str) -> str:
    """A backbone's step folder, relative to results."""
    return f"backbones/{backbone}"


def cache_folder(dataset: str, backbone: str) -> str:
    """The folder of the record of a dataset's hidden-state cache under a backbone, relative to results."""
    return f"caches/{dataset}__{backbone}"


def run_folder(run: str) -> str:
    """A run's (or reference's) folder, relative to results."""
    return f"runs/{run}"


ARTIFACTS = "artifacts"  # the results store's folder of selected heads, by content
MODEL_CARD = "model_card.json"


def artifact_name(sha256: str) -> str:
    """A selected head's file name: its content address."""
    return f"sha256-{sha256}.pt"


EXPORTS = "exports"  # the results store's folder of exported classifiers' files, by content


def export_name(sha256: str, suffix: str) -> str:
    """An exported file's key in the results store: its content address, keeping its kind (.pt2, .onnx, .safetensors)."""
    return f"{EXPORTS}/sha256-{sha256}{suffix}"


# Folders of the results store that hold records, never rule outputs: kept whatever the config says.
KEPT = ("ledger", ARTIFACTS, "memo", EXPORTS)


def planned_steps(config: dict) -> set[str]:
    """The step folders (relative to results) the config's full plan (final_qualification) writes sentinels in."""
    folders = set()
    for name, run in config.get("runs", {}).items():
        dataset, backbone = run["dataset"], run["backbone"]
        folders |= {dataset_folder(dataset), backbone_folder(backbone), cache_folder(dataset, backbone)}
        spec = config["backbones"].get(backbone, {})
        if spec.get("dataset"):
            folders.add(dataset_folder(spec["dataset"]))
        folders |= {f"{run_folder(name)}/epochs/{epoch}" for epoch in range(1, run["train"]["epochs"] + 1)}
        folders |= {f"{run_folder(name)}/{step}" for step in ("selection", "qualification", "report/validation", "report/qualification")}
        folders.add(f"{run_folder(name)}/export")
        if run.get("profiling"):
            folders |= {f"{run_folder(name)}/profiling", f"{run_folder(name)}/report/profiling"}
    for name, reference in config.get("references", {}).items():  # end-to-end references: trained and qualified
        folders |= {dataset_folder(reference["dataset"]), f"{run_folder(name)}/selection", f"{run_folder(name)}/qualification"}
    if config.get("references"):
        folders.add("report/comparison")
    return folders
