from pathlib import Path

import numpy as np
import pytest

from rffm import staging
from rffm.dataset import read_split, split_attrs
from rffm.errors import ConfigError, DataError

SPEC = {
    "name": "t",
    "source": "synthetic",
    "seed": 4,
    "splits": {"train": 0.5, "val": 0.25, "test": 0.25},
    "synthetic": {
        "classes": ["BPSK", "QPSK", "GFSK"],
        "snr_db": {"min": 0, "max": 10, "step": 5},
        "examples_per_class_snr": 8,
        "length": 32,
    },
}


def test_stage_writes_three_disjoint_stratified_splits(tmp_path: Path):
    staging.stage(SPEC, tmp_path)
    splits = {name: read_split(tmp_path / f"{name}.h5") for name in ("train", "val", "test")}
    assert [len(splits[n]["label"]) for n in ("train", "val", "test")] == [36, 18, 18]
    for split in splits.values():
        pairs = list(zip(split["label"].tolist(), split["snr_db"].tolist(), strict=True))
        counts = {pair: pairs.count(pair) for pair in set(pairs)}
        assert len(counts) == 9 and len(set(counts.values())) == 1  # every (class, SNR) equally
    ids = [set(s["content_id"].tolist()) for s in splits.values()]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    attrs = split_attrs(tmp_path / "test.h5")
    assert attrs["classes"] == ["BPSK", "QPSK", "GFSK"] and attrs["split_seed"] == 4 and attrs["split"] == "test"


def test_staging_is_byte_identical_for_the_same_seed_and_differs_for_another(tmp_path: Path):
    staging.stage(SPEC, tmp_path / "a")
    staging.stage(SPEC, tmp_path / "b")
    staging.stage({**SPEC, "seed": 5}, tmp_path / "c")
    for name in ("train.h5", "val.h5", "test.h5", "sentinel.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a/train.h5").read_bytes() != (tmp_path / "c/train.h5").read_bytes()


def test_duplicate_content_across_splits_is_leakage():
    labels = np.array([0, 1, 0, 1, 0, 1])
    ids = np.array([b"a", b"b", b"c", b"d", b"e", b"a"], dtype="S32")
    index = {"train": np.array([0, 1]), "val": np.array([2, 3]), "test": np.array([4, 5])}
    with pytest.raises(DataError, match="occurs in both 'train' and 'test'"):
        staging.check_splits("d", ["x", "y"], labels, index, ids)


def test_a_split_too_small_for_the_fractions_is_refused(tmp_path: Path):
    spec = {**SPEC, "synthetic": {**SPEC["synthetic"], "examples_per_class_snr": 1, "snr_db": {"min": 0, "max": 0, "step": 1}}}
    with pytest.raises(DataError, match="too small for the requested split fractions"):
        staging.stage(spec, tmp_path)
    assert not list(tmp_path.glob("*"))


def test_bad_fractions_and_sources_are_config_errors(tmp_path: Path):
    with pytest.raises(ConfigError, match="sum to 1"):
        staging.stage({**SPEC, "splits": {"train": 0.9, "val": 0.2, "test": 0.2}}, tmp_path)
    with pytest.raises(ConfigError, match="unknown source"):
        staging.stage({**SPEC, "source": "tape"}, tmp_path)
