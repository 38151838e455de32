from pathlib import Path

import numpy as np

from rffm.dataset import SplitWriter, content_ids, read_split, split_attrs, write_split

ATTRS = {"classes": ["A", "B"], "sample_rate": 1.0, "source": {"kind": "test"}, "split": "train", "split_seed": 1, "dataset": "x"}


def test_streamed_split_has_the_same_bytes_as_a_one_shot_write(tmp_path: Path):
    rng = np.random.default_rng(0)
    iq = rng.standard_normal((700, 2, 64)).astype(np.float32)
    labels, snrs = rng.integers(0, 2, 700), rng.uniform(-10, 10, 700).astype(np.float32)
    write_split(tmp_path / "whole.h5", iq, labels, snrs, ATTRS)
    writer = SplitWriter(tmp_path / "streamed.h5", 700, 64)
    for start, size in ((0, 1), (1, 300), (301, 0), (301, 99), (400, 300)):  # blocks that do not align with chunks
        writer.append(iq[start : start + size])
    assert not (tmp_path / "streamed.h5").exists()
    writer.finish(labels, snrs, content_ids(iq), ATTRS)
    writer.commit()
    assert (tmp_path / "streamed.h5").read_bytes() == (tmp_path / "whole.h5").read_bytes()
    assert np.array_equal(read_split(tmp_path / "streamed.h5")["iq"], iq) and split_attrs(tmp_path / "streamed.h5")["count"] == 700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["streamed.h5", "whole.h5"]


def test_discard_leaves_nothing(tmp_path: Path):
    writer = SplitWriter(tmp_path / "x.h5", 10, 8)
    writer.append(np.zeros((4, 2, 8), np.float32))
    writer.discard()
    writer.discard()
    assert list(tmp_path.iterdir()) == []
