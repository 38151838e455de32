import json
from pathlib import Path

import h5py
import numpy as np
import pytest

import rfdata
from conftest import stage
from rffm.data import staging, synthetic
from rffm.data.splits import read_split, split_attrs
from rffm.errors import ConfigError, DataError
from rffm.records.files import xxh3_parts
from rffm.records.sentinel import sentinel_problems

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
    stage(SPEC, tmp_path)
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
    stage(SPEC, tmp_path / "a")
    stage(SPEC, tmp_path / "b")
    stage({**SPEC, "seed": 5}, tmp_path / "c")
    for name in ("train.h5", "val.h5", "test.h5", "sentinel.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a/train.h5").read_bytes() != (tmp_path / "c/train.h5").read_bytes()


def test_a_split_too_small_for_the_fractions_is_refused(tmp_path: Path):
    spec = {**SPEC, "synthetic": {**SPEC["synthetic"], "examples_per_class_snr": 1, "snr_db": {"min": 0, "max": 0, "step": 1}}}
    with pytest.raises(DataError, match="too small for the requested split fractions"):
        stage(spec, tmp_path)
    assert not list(tmp_path.glob("*"))


def test_bad_fractions_and_sources_are_config_errors(tmp_path: Path):
    with pytest.raises(ConfigError, match="sum to 1"):
        stage({**SPEC, "splits": {"train": 0.9, "val": 0.2, "test": 0.2}}, tmp_path)
    with pytest.raises(ConfigError, match="unknown source"):
        stage({**SPEC, "source": "tape"}, tmp_path)


def old_stratified_split(labels, snr_db, fractions, seed):
    """The split before streaming (one flatnonzero per stratum): the new one must choose the same rows."""
    rng = np.random.default_rng([seed, 1])
    strata = np.stack([labels.astype(np.float64), np.nan_to_num(snr_db.astype(np.float64), nan=-1e9)], axis=1)
    keys, inverse = np.unique(strata, axis=0, return_inverse=True)
    parts = {name: [] for name in ("train", "val", "test")}
    for stratum in range(len(keys)):
        rows = rng.permutation(np.flatnonzero(inverse.ravel() == stratum))
        n_test, n_val = int(round(len(rows) * fractions["test"])), int(round(len(rows) * fractions["val"]))
        parts["test"].append(rows[:n_test])
        parts["val"].append(rows[n_test : n_test + n_val])
        parts["train"].append(rows[n_test + n_val :])
    return {name: np.sort(np.concatenate(rows)) for name, rows in parts.items()}


def test_split_is_unchanged_from_the_in_memory_implementation():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 5, 3000)
    snrs = rng.choice([-10.0, 0.0, 10.0, np.nan], 3000).astype(np.float32)
    fractions = {"train": 0.6, "val": 0.2, "test": 0.2}
    new, old = staging.stratified_split(labels, snrs, fractions, 9), old_stratified_split(labels, snrs, fractions, 9)
    assert all(np.array_equal(new[name], old[name]) for name in old)


def hdf5_spec(tmp_path: Path, iq: np.ndarray, labels: np.ndarray, classes: list[str], snrs=None, **extra) -> dict:
    path = rfdata.write_canonical_hdf5(tmp_path / "in.h5", iq, labels, classes, snrs)
    return {
        "name": "h",
        "source": "hdf5",
        "seed": 2,
        "hdf5": {"path": str(path)},
        "splits": {"train": 0.5, "val": 0.25, "test": 0.25},
        **extra,
    }


def four_class_source(tmp_path: Path, **extra) -> dict:
    gen = synthetic.SyntheticSpec(
        classes=["BPSK", "QPSK", "16QAM", "GFSK"], snr_db=[-10.0, 0.0, 10.0], examples_per_class_snr=12, length=32
    )
    iq, labels, snrs = synthetic.generate(gen, 1)
    return hdf5_spec(tmp_path, iq, labels, gen.classes, snrs, **extra)


def test_selection_subsets_classes_in_the_given_order_snr_range_and_cap(tmp_path: Path):
    spec = four_class_source(tmp_path, select={"classes": ["qam16", "BPSK"], "snr_db": {"min": 0}, "max_per_class_snr": 8})
    stage(spec, tmp_path / "a")
    splits = [read_split(tmp_path / "a" / f"{name}.h5") for name in ("train", "val", "test")]
    assert split_attrs(tmp_path / "a/train.h5")["classes"] == ["16QAM", "BPSK"]
    labels = np.concatenate([s["label"] for s in splits])
    snrs = np.concatenate([s["snr_db"] for s in splits])
    assert sorted(set(snrs.tolist())) == [0.0, 10.0] and len(labels) == 2 * 2 * 8
    assert all(((labels == c) & (snrs == s)).sum() == 8 for c in (0, 1) for s in (0.0, 10.0))
    # the cap's choice follows the seed
    stage(spec, tmp_path / "b")
    stage({**spec, "seed": 3}, tmp_path / "c")
    ids = {
        d: np.sort(np.concatenate([read_split(tmp_path / d / f"{n}.h5")["content_id"] for n in ("train", "val", "test")])) for d in "abc"
    }
    assert np.array_equal(ids["a"], ids["b"]) and not np.array_equal(ids["a"], ids["c"])


def test_normalisation_choices(tmp_path: Path):
    rng = np.random.default_rng(0)
    iq = (rng.standard_normal((24, 2, 16)) * rng.uniform(0.001, 10, (24, 1, 1))).astype(np.float32)
    iq[5] = 0.0  # an all-zero example stays zero
    for how in ("none", "rms", "peak"):
        stage(hdf5_spec(tmp_path, iq, np.arange(24) % 2, ["BPSK", "QPSK"], normalize=how), tmp_path / how)
        stored = np.concatenate([read_split(tmp_path / how / f"{n}.h5")["iq"] for n in ("train", "val", "test")])
        power = (stored.astype(np.float64) ** 2).sum(axis=1)
        nonzero = power.sum(axis=1) > 0
        assert nonzero.sum() == 23
        if how == "rms":
            assert np.allclose(power[nonzero].mean(axis=1), 1.0, atol=1e-5)
        if how == "peak":
            assert np.allclose(power[nonzero].max(axis=1), 1.0, atol=1e-5)
        if how == "none":
            assert not np.allclose(power[nonzero].mean(axis=1), 1.0, atol=0.1)
    assert split_attrs(tmp_path / "rms/train.h5")["source"]["normalize"] == "rms"


def test_duplicates_can_be_dropped_and_are_counted(tmp_path: Path):
    gen = synthetic.SyntheticSpec(classes=["BPSK", "QPSK"], snr_db=[0.0], examples_per_class_snr=16, length=16)
    iq, labels, snrs = synthetic.generate(gen, 4)
    iq = np.concatenate([iq, iq[:6]])  # six exact copies
    labels, snrs = np.concatenate([labels, labels[:6]]), np.concatenate([snrs, snrs[:6]])
    spec = hdf5_spec(tmp_path, iq, labels, gen.classes, snrs)
    with pytest.raises(DataError, match="duplicate content across splits"):
        stage(spec, tmp_path / "strict")
    sentinel = stage({**spec, "duplicates": "drop"}, tmp_path / "dropped")
    body = json.loads(sentinel.read_text())
    summary = body["dataset"]["duplicates"]
    assert summary["mode"] == "drop" and summary["dropped"] == 6 == summary["across_splits"] + summary["within_split"]
    assert summary["across_splits"] > 0  # the copies landed in other splits too
    ids = [read_split(tmp_path / "dropped" / f"{n}.h5")["content_id"] for n in ("train", "val", "test")]
    every = np.concatenate(ids)
    assert len(every) == 32 == len(set(every.tolist())) and sum(body["dataset"]["counts"].values()) == 32
    for name, split_ids in zip(("train", "val", "test"), ids, strict=True):
        arrays = read_split(tmp_path / "dropped" / f"{name}.h5")
        assert np.array_equal(arrays["content_id"], split_ids) and len(arrays["iq"]) == len(arrays["label"]) == len(split_ids)


def test_a_crash_mid_stream_leaves_no_split_and_no_sentinel(tmp_path: Path, monkeypatch):
    stage(SPEC, tmp_path)
    reads = []

    def failing_read(self, rows):
        reads.append(len(rows))
        if len(reads) == 2:
            raise OSError("disk went away")
        return real_read(self, rows)

    real_read = staging.SyntheticSource.read
    monkeypatch.setattr(staging.SyntheticSource, "read", failing_read)
    monkeypatch.setattr(staging, "block_rows", lambda length: 10)
    for name in ("train.h5", "val.h5", "test.h5", "sentinel.json"):
        (tmp_path / name).unlink()
    with pytest.raises(OSError, match="disk went away"):
        stage(SPEC, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["provenance.json"]  # from the first staging


def test_progress_reports_rate_and_eta(tmp_path: Path, capfd, monkeypatch):
    monkeypatch.setenv("RFFM_PLAIN_PROGRESS", "1")
    stage(SPEC, tmp_path)
    err = capfd.readouterr().err
    assert "[stage_dataset t] 72/72 example (100%)" in err and "example/s" in err and "eta" in err


def test_temporary_files_of_a_killed_staging_are_removed(tmp_path: Path):
    (tmp_path / ".train.h5.abc123.tmp").write_bytes(b"half a split")
    (tmp_path / "keep.txt").write_text("not ours")
    stage(SPEC, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "provenance.json", "sentinel.json", "test.h5", "train.h5", "val.h5"]


def test_huge_finite_samples_are_not_mistaken_for_inf(tmp_path: Path):
    iq = np.random.default_rng(2).standard_normal((16, 2, 8)).astype(np.float32)
    iq[3] = 3e38  # finite, but its sum overflows float32
    stage(hdf5_spec(tmp_path, iq, np.arange(16) % 2, ["BPSK", "QPSK"]), tmp_path / "out")
    stored = np.concatenate([read_split(tmp_path / "out" / f"{n}.h5")["iq"] for n in ("train", "val", "test")])
    assert (stored == np.float32(3e38)).all(axis=(1, 2)).sum() == 1


def test_split_records_cover_every_byte_without_reading_the_iq_back(tmp_path: Path):
    out = stage(SPEC, tmp_path / "d")
    body = json.loads(out.read_text())
    for split in ("train", "val", "test"):
        path, record = tmp_path / "d" / f"{split}.h5", body["outputs"][f"{split}.h5"]
        assert set(record) == {"bytes", "parts", "xxh3_128_of_parts"}
        with h5py.File(path, "r") as handle:
            offset, size = handle["iq"].id.get_offset(), handle["iq"].id.get_storage_size()
        assert record["parts"] == [offset, offset + size]  # the digest kept while writing is the one read back
        assert record["xxh3_128_of_parts"] == xxh3_parts(path, record["parts"])
    assert sentinel_problems(out) == []
