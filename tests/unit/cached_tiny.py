"""What the head-training tests share (test_train_epoch, test_sweep): a tiny dataset, a random backbone, their cache."""

from __future__ import annotations

from pathlib import Path

from conftest import cache_build, make_backbone, stage

DATASET = {
    "name": "t",
    "source": "synthetic",
    "seed": 3,
    "synthetic": {
        "classes": ["BPSK", "WBFM", "GFSK"],
        "snr_db": {"min": 10, "max": 10, "step": 1},
        "examples_per_class_snr": 24,
        "length": 32,
    },
}
SMALL = {"patch": 8, "dim": 16, "depth": 1, "heads": 2, "stem": "iq", "output_layers": 1}  # not the default backbone: small and fast
BACKBONE = {"name": "b", "source": "random", "dataset": "t", "arch": SMALL}


def build_cache(root: Path, backbone: dict = BACKBONE) -> Path:
    """Stage DATASET, build `backbone` and their cache under root: returns the record results/caches/t__b (its memo: root/scratch)."""
    stage(DATASET, root / "results/datasets/t")
    make_backbone(backbone, root / "results/datasets/t", root / "results/backbones/b")
    cache_build(root / "results/datasets/t", root / "results/backbones/b", root / "results/caches/t__b", root / "scratch")
    return root / "results/caches/t__b"
