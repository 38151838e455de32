"""The epoch checkpoint store: completed epochs mirrored out of the results tree and restored on relaunch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cache_build, make_backbone, stage, train_one_epoch
from rffm.ops import checkpoints

DATASET = {
    "name": "t",
    "source": "synthetic",
    "seed": 4,
    "synthetic": {"classes": ["BPSK", "GFSK"], "snr_db": {"min": 10, "max": 10, "step": 1}, "examples_per_class_snr": 16, "length": 32},
}
BACKBONE = {"name": "b", "source": "random", "dataset": "t", "arch": {"patch": 8, "dim": 16, "depth": 1, "heads": 2}}
SPEC = {"run": "r", "train": {"lr": 0.01, "batch_size": 8, "seed": 0}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A cache, two trained epochs, and a store holding both."""
    root = tmp_path_factory.mktemp("store")
    stage(DATASET, root / "ds")
    make_backbone(BACKBONE, root / "ds", root / "bb")
    cache_build(root / "ds", root / "bb", root / "scratch/t__b", root / "prov.json")
    epochs = root / "results/runs/r/epochs"
    for epoch in (1, 2):
        train_one_epoch(SPEC, root / "scratch/t__b", epoch, epochs / str(epoch - 1) if epoch > 1 else None, epochs / str(epoch))
        checkpoints.mirror(epochs / str(epoch), root / "store", "r", epoch)
    return root / "scratch/t__b", epochs, root / "store"


def files(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in ("checkpoint.pt", "metrics.json", "sentinel.json")}


def restored_from(epoch_dir: Path) -> str | None:
    return json.loads((epoch_dir / "provenance.json").read_text()).get("restored_from")


def test_a_mirrored_epoch_is_restored_byte_identical(trained, tmp_path: Path):
    cache_dir, epochs, store = trained
    assert files(store / "runs/r/epochs/2") == files(epochs / "2")
    fresh = tmp_path / "results/runs/r/epochs"
    train_one_epoch(SPEC, cache_dir, 1, None, fresh / "1", checkpoint_store=store)
    train_one_epoch(SPEC, cache_dir, 2, fresh / "1", fresh / "2", checkpoint_store=store)
    assert files(fresh / "2") == files(epochs / "2")
    assert restored_from(fresh / "2") == str(store / "runs/r/epochs/2")
    assert json.loads((fresh / "2/provenance.json").read_text())["computed_by"]["epoch"] == 2


def test_an_epoch_of_other_params_or_a_damaged_one_is_not_restored(trained, tmp_path: Path):
    cache_dir, epochs, store = trained
    other = {"run": "r", "train": {**SPEC["train"], "lr": 0.02}}
    train_one_epoch(other, cache_dir, 1, None, tmp_path / "other/1", checkpoint_store=store)
    assert restored_from(tmp_path / "other/1") is None
    damaged = tmp_path / "store"
    checkpoints.mirror(epochs / "1", damaged, "r", 1)
    (damaged / "runs/r/epochs/1/checkpoint.pt").write_bytes(b"torn write")
    train_one_epoch(SPEC, cache_dir, 1, None, tmp_path / "1", checkpoint_store=damaged)
    assert restored_from(tmp_path / "1") is None and files(tmp_path / "1") == files(epochs / "1")
