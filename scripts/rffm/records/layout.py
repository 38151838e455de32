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


ARTIFACT_DIR = "artifact"


def artifact_name(sha256: str) -> str:
    """A selected head's file name: its content address."""
    return f"sha256-{sha256}.pt"
