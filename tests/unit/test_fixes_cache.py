"""Issue 34: refusals of a staged split and of the scratch disk whose printed Fix no other test follows; each is
provoked, its Fix is done as written (stage_dataset run again, the headroom or scratch it names), and the same call
then reads the split or builds the cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from cached_tiny import BACKBONE, DATASET

from conftest import cache_build, make_backbone, stage
from fixes import fix_of
from rffm.data import cache_local
from rffm.data.splits import map_iq, read_split
from rffm.errors import ConfigError, DataError


@pytest.fixture
def staged(tmp_path: Path) -> Path:
    return stage(DATASET, tmp_path / "datasets/t").parent


def test_an_unreadable_split_is_fixed_by_rerunning_stage_dataset(staged: Path):
    (staged / "train.h5").write_bytes(b"half a file")  # a copy cut short
    with pytest.raises(DataError) as caught:
        map_iq(staged / "train.h5")
    assert fix_of(caught) == "rerun stage_dataset."
    stage(DATASET, staged)
    assert map_iq(staged / "train.h5").shape[1:] == (2, 32)


def test_a_split_missing_an_array_is_fixed_by_rerunning_stage_dataset(staged: Path):
    with h5py.File(staged / "val.h5", "a") as handle:
        del handle["content_id"]
    with pytest.raises(DataError) as caught:
        read_split(staged / "val.h5")
    assert fix_of(caught) == "rerun stage_dataset."
    stage(DATASET, staged)
    assert set(read_split(staged / "val.h5")) == {"iq", "label", "snr_db", "content_id"}


def test_a_split_of_the_older_chunked_format_is_fixed_by_rerunning_stage_dataset(staged: Path):
    with h5py.File(staged / "train.h5", "a") as handle:
        iq = handle["iq"][()]
        del handle["iq"]
        handle.create_dataset("iq", data=iq, chunks=(1, 2, 32), compression="gzip")  # how splits were once written
    with pytest.raises(DataError) as caught:
        map_iq(staged / "train.h5")
    assert fix_of(caught) == "rerun stage_dataset."
    stage(DATASET, staged)
    assert np.array_equal(map_iq(staged / "train.h5"), iq)


def small_disk(monkeypatch, small: Path) -> None:
    """The filesystem under `small` has 20 KiB free (too little for the tiny cache), any other its real free space."""
    real = shutil.disk_usage

    def usage(path):
        return type("Usage", (), {"free": 20 << 10})() if Path(path).is_relative_to(small) else real(path)

    monkeypatch.setattr(cache_local.shutil, "disk_usage", usage)


@pytest.mark.parametrize("follow", ["headroom", "scratch"])
def test_a_full_scratch_disk_is_fixed_by_another_disk_or_no_headroom_check(staged: Path, tmp_path: Path, monkeypatch, follow: str):
    make_backbone(BACKBONE, staged, tmp_path / "backbones/b")
    small_disk(monkeypatch, tmp_path / "small")
    with pytest.raises(ConfigError) as caught:
        cache_build(staged, tmp_path / "backbones/b", tmp_path / "caches/t__b", tmp_path / "small/scratch")
    fix = fix_of(caught)
    assert fix == (
        "free space, point `scratch` (or --hidden-state-cache-directory) at a larger local disk, "
        "or lower `cache.disk_headroom` (0 disables the check) if you know the cache fits."
    )
    if follow == "headroom":
        record = cache_build(staged, tmp_path / "backbones/b", tmp_path / "caches/t__b", tmp_path / "small/scratch", disk_headroom=0)
        assert (tmp_path / "small/scratch/t__b").is_dir()
    else:
        record = cache_build(staged, tmp_path / "backbones/b", tmp_path / "caches/t__b", tmp_path / "large/scratch")
        assert (tmp_path / "large/scratch/t__b").is_dir()
    assert record.is_file()
