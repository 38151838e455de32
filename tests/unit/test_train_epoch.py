import json
from pathlib import Path

import pytest

from conftest import cache_build, make_backbone, stage, train_one_epoch
from rffm.errors import IntegrityError
from rffm.training import epoch as train

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
BACKBONE = {"name": "b", "source": "random", "dataset": "t", "arch": {"patch": 8, "dim": 16, "depth": 1, "heads": 2}}
SPEC = {"run": "r", "train": {"lr": 0.01, "batch_size": 8, "seed": 0}}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cache")
    stage(DATASET, root / "ds")
    make_backbone(BACKBONE, root / "ds", root / "bb")
    cache_build(root / "ds", root / "bb", root / "scratch/t__b", root / "prov.json")
    return root / "scratch/t__b"


def run(cache_dir: Path, out: Path, epochs: int, spec=SPEC) -> list[dict]:
    for epoch in range(1, epochs + 1):
        train_one_epoch(spec, cache_dir, epoch, out / str(epoch - 1) if epoch > 1 else None, out / str(epoch))
    return [json.loads((out / str(e) / "metrics.json").read_text()) for e in range(1, epochs + 1)]


def test_epochs_learn_and_resume_bit_for_bit(cache_dir: Path, tmp_path: Path):
    metrics = run(cache_dir, tmp_path / "a", 4)
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
    # rerun epoch 3 from epoch 2's checkpoint in a different directory: identical bytes
    train_one_epoch(SPEC, cache_dir, 3, tmp_path / "a/2", tmp_path / "again3")
    for name in ("checkpoint.pt", "metrics.json"):
        assert (tmp_path / "again3" / name).read_bytes() == (tmp_path / "a/3" / name).read_bytes()


def test_an_epoch_does_not_depend_on_the_total_epoch_count(cache_dir: Path, tmp_path: Path):
    run(cache_dir, tmp_path / "short", 2, {**SPEC, "train": {**SPEC["train"], "epochs": 2}})
    run(cache_dir, tmp_path / "long", 2, {**SPEC, "train": {**SPEC["train"], "epochs": 9}})
    assert (tmp_path / "short/2/checkpoint.pt").read_bytes() == (tmp_path / "long/2/checkpoint.pt").read_bytes()


def test_resuming_from_a_checkpoint_of_other_params_is_refused(cache_dir: Path, tmp_path: Path):
    run(cache_dir, tmp_path / "a", 1)
    other = {**SPEC, "train": {**SPEC["train"], "lr": 0.5}}
    with pytest.raises(IntegrityError, match="different training params"):
        train_one_epoch(other, cache_dir, 2, tmp_path / "a/1", tmp_path / "a/2")


def test_lr_schedule_has_warmup_then_per_epoch_decay():
    assert train.lr_factor(0, 10, 5, 0.5) == pytest.approx(0.2)
    assert train.lr_factor(9, 10, 5, 0.5) == 1.0
    assert train.lr_factor(10, 10, 5, 0.5) == 0.5


def test_an_epoch_writes_tensorboard_scalars_to_aip_tensorboard_log_dir(cache_dir: Path, tmp_path: Path, monkeypatch):
    pytest.importorskip("tensorboardX")
    from test_tensorboard import read_scalars

    monkeypatch.setenv("AIP_TENSORBOARD_LOG_DIR", str(tmp_path / "tb"))
    logged = run(cache_dir, tmp_path / "with", 2)
    scalars = read_scalars(tmp_path / "tb" / "r")
    assert scalars["accuracy/val"] == pytest.approx({1: logged[0]["val_accuracy"], 2: logged[1]["val_accuracy"]})
    monkeypatch.delenv("AIP_TENSORBOARD_LOG_DIR")
    run(cache_dir, tmp_path / "without", 2)
    # a side output only: the epoch's files and sentinel are byte-identical without it
    for name in ("checkpoint.pt", "metrics.json", "sentinel.json"):
        assert (tmp_path / "with/2" / name).read_bytes() == (tmp_path / "without/2" / name).read_bytes()
