from pathlib import Path

import h5py
import numpy as np
import pytest
import xxhash

from rffm.data import splits as dataset
from rffm.data.splits import SplitWriter, content_ids, map_iq, read_split, split_attrs, write_split
from rffm.errors import DataError
from rffm.records import files

ATTRS = {"classes": ["A", "B"], "sample_rate": 1.0, "source": {"kind": "test"}, "split": "train", "split_seed": 1, "dataset": "x"}


def test_split_bytes_do_not_depend_on_how_the_rows_were_appended(tmp_path: Path):
    rng = np.random.default_rng(0)
    iq = rng.standard_normal((700, 2, 64)).astype(np.float32)
    labels, snrs = rng.integers(0, 2, 700), rng.uniform(-10, 10, 700).astype(np.float32)
    write_split(tmp_path / "whole.h5", iq, labels, snrs, ATTRS)
    writer = SplitWriter(tmp_path / "streamed.h5", 700, 64)
    for start, size in ((0, 1), (1, 300), (301, 0), (301, 99), (400, 300)):
        writer.append(iq[start : start + size])
    assert np.array_equal(writer.read(250, 420), iq[250:420])  # what compact() reads back before finishing
    assert not (tmp_path / "streamed.h5").exists()
    writer.finish(labels, snrs, content_ids(iq), ATTRS)
    writer.commit()
    assert (tmp_path / "streamed.h5").read_bytes() == (tmp_path / "whole.h5").read_bytes()
    split = read_split(tmp_path / "streamed.h5")
    assert np.array_equal(split["iq"], iq) and np.array_equal(split["label"], labels)
    assert split_attrs(tmp_path / "streamed.h5")["count"] == 700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["streamed.h5", "whole.h5"]


def test_iq_is_one_contiguous_little_endian_block(tmp_path: Path):
    iq = np.arange(5 * 2 * 8, dtype=np.float32).reshape(5, 2, 8)
    write_split(tmp_path / "s.h5", iq, np.zeros(5, np.int64), np.zeros(5, np.float32), ATTRS)
    with h5py.File(tmp_path / "s.h5", "r") as handle:
        offset = handle["iq"].id.get_offset()
    raw = (tmp_path / "s.h5").read_bytes()[offset : offset + iq.nbytes]
    assert np.array_equal(np.frombuffer(raw, "<f4").reshape(iq.shape), iq)  # readers may pread rows directly


def test_content_ids_are_xxh3_128_of_each_example():
    iq = np.random.default_rng(1).standard_normal((3, 2, 16)).astype(np.float32)
    ids = content_ids(iq[:, :, :])
    assert [i.decode() for i in ids] == [xxhash.xxh3_128_hexdigest(example.tobytes()) for example in iq]
    assert content_ids(iq[::-1])[0] == ids[2]  # a strided view hashes the same bytes


def test_appending_more_rows_than_declared_is_refused(tmp_path: Path):
    writer = SplitWriter(tmp_path / "x.h5", 2, 8)
    with pytest.raises(RuntimeError, match="3 rows appended to a split of 2"):
        writer.append(np.zeros((3, 2, 8), np.float32))
    writer.discard()
    assert list(tmp_path.iterdir()) == []


def test_discard_leaves_nothing(tmp_path: Path):
    writer = SplitWriter(tmp_path / "x.h5", 10, 8)
    writer.append(np.zeros((4, 2, 8), np.float32))
    writer.discard()
    writer.discard()
    assert list(tmp_path.iterdir()) == []


def test_map_iq_refuses_a_split_whose_iq_is_not_one_plain_block(tmp_path: Path):
    with h5py.File(tmp_path / "old.h5", "w") as handle:
        handle.create_dataset("iq", data=np.zeros((4, 2, 8), np.float32), chunks=(2, 2, 8))
    with pytest.raises(DataError, match="old.h5: its IQ is not one contiguous little-endian float32 block"):
        map_iq(tmp_path / "old.h5")


def test_settling_written_rows_to_disk_changes_no_byte(tmp_path: Path, monkeypatch):
    iq = np.random.default_rng(2).standard_normal((300, 2, 64)).astype(np.float32)
    labels, snrs = np.zeros(300, np.int64), np.zeros(300, np.float32)
    write_split(tmp_path / "kept.h5", iq, labels, snrs, ATTRS)
    monkeypatch.setattr(dataset, "SETTLE_BYTES", 4096)  # settle after every append
    settled = []
    monkeypatch.setattr(dataset, "settle", lambda fd, offset, length: (settled.append(length), files.settle(fd, offset, length)))
    writer = SplitWriter(tmp_path / "settled.h5", 300, 64)
    for start in range(0, 300, 40):
        writer.append(iq[start : start + 40])
    assert len(settled) == 7 and sum(settled) == 280 * 2 * 64 * 4  # all but the last append, on disk and dropped
    assert np.array_equal(writer.read(0, 300), iq)  # read back from disk
    writer.finish(labels, snrs, content_ids(iq), ATTRS)
    writer.commit()
    assert (tmp_path / "settled.h5").read_bytes() == (tmp_path / "kept.h5").read_bytes()
