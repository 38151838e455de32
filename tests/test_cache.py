from pathlib import Path

import numpy as np
import pytest
import torch

from rffm import backbone, cache, pretrain, staging
from rffm.dataset import read_split
from rffm.errors import ConfigError, IntegrityError

DATASET = {
    "name": "t",
    "source": "synthetic",
    "seed": 2,
    "synthetic": {
        "classes": ["BPSK", "QPSK", "WBFM"],
        "snr_db": {"min": 0, "max": 10, "step": 10},
        "examples_per_class_snr": 10,
        "length": 32,
    },
}
BACKBONE = {"name": "b", "source": "random", "dataset": "t", "arch": {"patch": 8, "dim": 16, "depth": 1, "heads": 2}}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("inputs")
    staging.stage(DATASET, root / "ds")
    pretrain.create(BACKBONE, root / "ds", root / "bb")
    return root / "ds", root / "bb"


def test_cache_holds_bf16_hidden_states_of_train_and_val_only(inputs, tmp_path: Path):
    dataset_dir, backbone_dir = inputs
    cache.build(dataset_dir, backbone_dir, tmp_path / "c", tmp_path / "prov.json", batch_size=7)
    splits, meta = cache.open_cache(tmp_path / "c", "test")
    assert set(splits) == {"train", "val"} and not list((tmp_path / "c").glob("test*"))
    model = backbone.load(backbone_dir / "backbone.pt")
    train = read_split(dataset_dir / "train.h5")
    with torch.no_grad():
        expected = model(torch.from_numpy(train["iq"])).to(torch.bfloat16).float()
    hidden, labels = splits["train"].gather(np.arange(len(train["label"])))
    assert hidden.dtype == torch.float32 and torch.equal(hidden, expected)
    assert np.array_equal(labels.numpy(), train["label"])
    assert (tmp_path / "c/train.hidden.bf16").stat().st_size == hidden.numel() * 2


def test_cache_is_identical_whatever_the_batch_size(inputs, tmp_path: Path):
    dataset_dir, backbone_dir = inputs
    cache.build(dataset_dir, backbone_dir, tmp_path / "a", tmp_path / "a.json", batch_size=5)
    cache.build(dataset_dir, backbone_dir, tmp_path / "b", tmp_path / "b.json", batch_size=64)
    for name in cache.output_names() + ["sentinel.json"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_a_changed_cache_is_refused_by_its_readers(inputs, tmp_path: Path):
    dataset_dir, backbone_dir = inputs
    cache.build(dataset_dir, backbone_dir, tmp_path / "c", tmp_path / "prov.json")
    stored = np.memmap(tmp_path / "c/val.hidden.bf16", dtype=np.uint16, mode="r+")
    stored[0] ^= 1
    stored.flush()
    with pytest.raises(IntegrityError, match="val.hidden.bf16"):
        cache.open_cache(tmp_path / "c", "train_epoch")


def test_disk_budget_refusal_names_both_numbers(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda path: type("U", (), {"free": 1000})())
    with pytest.raises(ConfigError, match=r"need 1.1x 2000 bytes.*free 1000 bytes"):
        cache.check_disk_budget(tmp_path, 2000)
