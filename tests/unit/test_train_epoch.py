import json
from pathlib import Path

import pytest
from cached_tiny import BACKBONE, build_cache

from conftest import train_one_epoch
from rffm.errors import ConfigError, IntegrityError
from rffm.training import epoch as train

SPEC = {"run": "r", "train": {"lr": 0.01, "batch_size": 8, "seed": 0}}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """The cache record (results/caches/t__b); its memo is in root/scratch, and no epoch memo is kept."""
    return build_cache(tmp_path_factory.mktemp("cache"))


def epoch(spec: dict, record: Path, number: int, previous: Path | None, out: Path) -> Path:
    """One epoch trained for real (an empty memo store: nothing is restored)."""
    return train_one_epoch(spec, record, number, previous, out, record.parents[2] / "scratch", memo_store=out.parent / "memo")


def run(cache_dir: Path, out: Path, epochs: int, spec=SPEC) -> list[dict]:
    for number in range(1, epochs + 1):
        epoch(spec, cache_dir, number, out / str(number - 1) if number > 1 else None, out / str(number))
    return [json.loads((out / str(e) / "metrics.json").read_text()) for e in range(1, epochs + 1)]


def test_epochs_learn_and_resume_bit_for_bit(cache_dir: Path, tmp_path: Path):
    metrics = run(cache_dir, tmp_path / "a", 4)
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
    # rerun epoch 3 from epoch 2's checkpoint in a different directory: identical bytes
    epoch(SPEC, cache_dir, 3, tmp_path / "a/2", tmp_path / "again3")
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
        epoch(other, cache_dir, 2, tmp_path / "a/1", tmp_path / "a/2")


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


def test_a_completed_epoch_is_kept_and_restored_not_trained_again(cache_dir: Path, tmp_path: Path):
    """The memo (rffm.records.memo): what a preempted VM, a killed group job or a fresh node finds."""
    scratch = cache_dir.parents[2] / "scratch"
    memo = tmp_path / "kept"
    first = train_one_epoch(SPEC, cache_dir, 1, None, tmp_path / "a/1", scratch, memo_store=memo)
    again = train_one_epoch(SPEC, cache_dir, 1, None, tmp_path / "b/1", scratch, memo_store=memo)
    for name in ("checkpoint.pt", "metrics.json", "sentinel.json"):
        assert (tmp_path / "a/1" / name).read_bytes() == (tmp_path / "b/1" / name).read_bytes(), name
    assert json.loads((tmp_path / "b/1/provenance.json").read_text())["restored_from"].startswith(str(memo))
    assert first.read_bytes() == again.read_bytes()
    other = {**SPEC, "train": {**SPEC["train"], "lr": 0.02}}  # another identity: trained, not restored
    train_one_epoch(other, cache_dir, 1, None, tmp_path / "c/1", scratch, memo_store=memo)
    assert "restored_from" not in json.loads((tmp_path / "c/1/provenance.json").read_text())


def test_a_diverged_epoch_stops_and_leaves_no_sentinel(cache_dir: Path, tmp_path: Path):
    spec = {**SPEC, "train": {**SPEC["train"], "lr": 1e30, "warmup_steps": 0}}
    with pytest.raises(ConfigError, match=r"diverged.*Fix: lower runs\.r\.train\.lr"):
        epoch(spec, cache_dir, 1, None, tmp_path / "d/1")
    assert not (tmp_path / "d/1/sentinel.json").exists()


def test_a_multi_layer_cache_trains_a_layer_mixing_head(tmp_path: Path):
    spec = {
        **BACKBONE,
        "source": "pretrain",
        "arch": {**BACKBONE["arch"], "stem": "rf", "output_layers": 2},
        "pretrain": {"epochs": 1, "min_steps": 0},
    }
    metrics = run(build_cache(tmp_path, spec), tmp_path / "run", 3)
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
    checkpoint = __import__("torch").load(tmp_path / "run/3/checkpoint.pt", weights_only=True)
    assert checkpoint["head_config"]["layers"] == 2 and "layer_weights" in checkpoint["head"]
