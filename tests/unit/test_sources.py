"""Readers of each source layout: what they read equals what was written, in the documented order."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

import rfdata
from rffm.data import radioml, sources, synthetic
from rffm.data.sigmf import SigmfSource


def spec(source: str, **options) -> dict:
    return {"name": "d", "source": source, "seed": 0, **options}


def test_class_names_normalise_to_one_vocabulary():
    same = {"QAM16": "16QAM", "qam-16": "16QAM", "16-QAM": "16QAM", "4PAM": "PAM4", "pam_4": "PAM4", "8-psk": "8PSK"}
    same |= {"am_dsb": "AM-DSB", "AM-DSB-SC": "AM-DSB-SC", "wbfm": "WBFM", "2PSK": "BPSK", "oqpsk": "OQPSK", "QAM256": "256QAM"}
    for raw, canonical in same.items():
        assert sources.canonical_class(raw) == canonical, raw
    assert sources.canonical_class("LoRa") is None
    assert sources.canonical_class("LoRa", {"LoRa": "LORA-CSS"}) == "LORA-CSS"  # a new name is kept as written
    assert sources.canonical_class("mystery", {"mystery": "qam64"}) == "64QAM"
    classes, mapping = sources.normalise_classes(["QAM16", "BPSK", "16QAM"], spec("hdf5"), str)
    assert classes == ["16QAM", "BPSK"] and mapping.tolist() == [0, 1, 0]
    # every name the sources produce is in the vocabulary, and no two vocabulary names collide
    assert set(synthetic.CLASSES) | set(radioml.RML2018_CLASSES) <= set(sources.VOCABULARY)
    assert len(sources.VOCABULARY_BY_KEY) == len(sources.VOCABULARY)


def test_rml2018_class_order_is_the_corrected_one_not_classes_txt():
    assert radioml.RML2018_CLASSES[:6] == ["OOK", "4ASK", "8ASK", "BPSK", "QPSK", "8PSK"]
    assert radioml.RML2018_CLASSES[12] == "16QAM" and radioml.RML2018_CLASSES[-3:] == ["FM", "GMSK", "OQPSK"]
    assert len(radioml.RML2018_CLASSES) == 24 and set(sources.PRESETS["rml2018-normal"]) < set(radioml.RML2018_CLASSES)


def test_rml2016_fixture_is_a_python2_style_pickle_that_plain_pickle_reads(tmp_path: Path):
    data = rfdata.rml2016_data(per_key=4)
    path = rfdata.write_rml2016_pickle(tmp_path / "RML2016.10a_dict.pkl", data)
    raw = path.read_bytes()
    assert raw.startswith(b"(dp0\n(S'") and b"cnumpy.core.multiarray\n_reconstruct\n" in raw  # protocol 0, Python-2 STRING keys
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy.core is numpy._core in numpy 2
        loaded = pickle.loads(raw, encoding="latin1")
    assert loaded.keys() == data.keys() and all(np.array_equal(loaded[k], data[k]) for k in data)


@pytest.mark.parametrize("protocol", ["py2", 2, 5])
def test_rml2016_rows_are_sorted_by_class_then_snr_and_read_back_exactly(tmp_path: Path, protocol):
    data = rfdata.rml2016_data(per_key=4)
    path = tmp_path / "rml.pkl"
    if protocol == "py2":
        rfdata.write_rml2016_pickle(path, data)
    else:  # a copy re-pickled by Python 3 must work too
        path.write_bytes(pickle.dumps(data, protocol=protocol))
    source = radioml.Rml2016Source(spec("radioml2016", radioml2016={"path": str(path)}), tmp_path)
    try:
        assert source.classes == ["BPSK", "GFSK", "16QAM", "QPSK"]  # sorted raw names BPSK, GFSK, QAM16, QPSK
        labels, snrs = source.index()
        assert labels.tolist() == np.repeat([0, 1, 2, 3], 8).tolist() and snrs.tolist() == [0] * 4 + [10] * 4 + ([0] * 4 + [10] * 4) * 3
        rows = np.array([0, 3, 4, 13, 20, 31])
        expected = [
            data[(m, s)][r % 4]
            for m, s, r in [("BPSK", 0, 0), ("BPSK", 0, 3), ("BPSK", 10, 4), ("GFSK", 10, 13), ("QAM16", 10, 20), ("QPSK", 10, 31)]
        ]
        assert np.array_equal(source.read(rows), np.stack(expected))
        assert list(tmp_path.iterdir()) == [path]  # the spool file is anonymous
        assert source.locate(13) == f"{path}: key ('GFSK', 10) row 1"
    finally:
        source.close()


def test_rml2018_reads_the_same_through_raw_and_h5py_paths(tmp_path: Path):
    x, columns, snrs = rfdata.rml2018_data(["BPSK", "QPSK", "16QAM"], per_key=3, length=64)
    plain = rfdata.write_rml2018_hdf5(tmp_path / "plain.h5", x, columns, snrs)
    packed = rfdata.write_rml2018_hdf5(tmp_path / "packed.h5", x, columns, snrs, chunks=(4, 64, 2), compression="gzip")
    rows = np.array([0, 1, 2, 5, 9, 10, 17])
    reads = []
    for path, raw in ((plain, True), (packed, False)):
        source = radioml.Rml2018Source(spec("radioml2018", radioml2018={"path": str(path)}), tmp_path)
        assert (source.reader.fd is not None) == raw
        labels, snr = source.index()
        assert [source.classes[i] for i in labels[[0, 6, 12]]] == ["BPSK", "QPSK", "16QAM"] and snr[:6].tolist() == [0, 0, 0, 10, 10, 10]
        reads.append(source.read(rows))
        source.close()
    assert np.array_equal(reads[0], reads[1]) and np.array_equal(reads[0], x[rows].transpose(0, 2, 1))


def test_rml2018_accepts_a_flat_z(tmp_path: Path):
    x, columns, snrs = rfdata.rml2018_data(["BPSK"], per_key=2, length=16)
    path = rfdata.write_rml2018_hdf5(tmp_path / "flat.h5", x, columns, snrs)
    with h5py.File(path, "a") as handle:
        del handle["Z"]
        handle["Z"] = snrs
    source = radioml.Rml2018Source(spec("radioml2018", radioml2018={"path": str(path)}), tmp_path)
    assert source.index()[1].tolist() == [0, 0, 10, 10]
    source.close()


def test_sigmf_windows_equal_the_samples_in_both_datatypes(tmp_path: Path):
    samples = (np.arange(1000) % 97 - 48 + 1j * (np.arange(1000) % 89 - 44)) / 64
    notes = [
        (0, 300, {"core:label": "qam16", "rffm:snr_db": 4}),
        (300, 100, {"core:comment": "no label"}),
        (400, 600, {"core:label": "BPSK"}),
    ]
    cf32 = rfdata.write_sigmf(tmp_path / "a", samples, notes, "cf32_le")
    ci16 = rfdata.write_sigmf(tmp_path / "b", samples, notes, "ci16_le")
    options = {"recordings": [str(cf32), str(tmp_path / "b")], "window": 100, "stride": 50}
    source = SigmfSource(spec("sigmf", sigmf=options), tmp_path)
    assert source.classes == ["BPSK", "16QAM"]  # vocabulary order, whatever the recording order
    labels, snrs = source.index()
    per_recording = [1] * 5 + [0] * 11  # 16QAM: starts 0..200 by 50; BPSK: 400..900 by 50
    assert labels.tolist() == per_recording * 2
    assert snrs[:5].tolist() == [4] * 5 and np.isnan(snrs[5:16]).all()
    iq = source.read(np.arange(32))
    expected = np.stack([samples[s : s + 100] for s in [0, 50, 100, 150, 200, *range(400, 901, 50)]])
    assert np.allclose(iq[:16, 0] + 1j * iq[:16, 1], expected, atol=1e-7)
    # ci16: the fixture stores round(8192 x), the sigmf package reads counts / 32768
    assert np.allclose(iq[16:, 0] + 1j * iq[16:, 1], expected / 4, atol=1 / 32768)
    assert "b.sigmf-meta: annotation 2, window at sample 500" in source.locate(23)
    assert sources.input_files(spec("sigmf", sigmf=options)) == [
        str(cf32),
        str(cf32.with_suffix(".sigmf-data")),
        str(ci16),
        str(ci16.with_suffix(".sigmf-data")),
    ]


def test_hdf5_source_reads_the_canonical_layout_with_unknown_snr(tmp_path: Path):
    iq = np.random.default_rng(0).standard_normal((10, 2, 32)).astype(np.float32)
    path = rfdata.write_canonical_hdf5(tmp_path / "x.h5", iq, np.arange(10) % 3, ["qpsk", "QAM64", "wbfm"])
    source = sources.Hdf5Source(spec("hdf5", hdf5={"path": str(path)}), tmp_path)
    labels, snrs = source.index()
    assert source.classes == ["QPSK", "64QAM", "WBFM"] and labels.tolist() == (np.arange(10) % 3).tolist() and np.isnan(snrs).all()
    assert source.reader.fd is not None and np.array_equal(source.read(np.array([1, 2, 7])), iq[[1, 2, 7]])
    source.close()


def test_synthetic_source_streams_exactly_what_the_generator_makes(tmp_path: Path):
    options = {"classes": ["QPSK", "GFSK"], "snr_db": {"min": 0, "max": 5, "step": 5}, "examples_per_class_snr": 3, "length": 32}
    source = sources.SyntheticSource(spec("synthetic", synthetic=options, seed=7), tmp_path)
    iq, labels, snrs = synthetic.generate(source.gen, 7)
    got_labels, got_snrs = source.index()
    assert np.array_equal(got_labels, labels) and np.array_equal(got_snrs, snrs)
    assert np.array_equal(source.read(np.arange(12)), iq) and np.array_equal(source.read(np.array([4, 10])), iq[[4, 10]])


def test_pread_rows_reads_scattered_rows_with_few_reads(tmp_path: Path):
    data = np.arange(200 * 16, dtype=np.uint8).reshape(200, 16) % 251
    path = tmp_path / "rows.bin"
    data.tofile(path)
    rows = np.array([0, 1, 2, 4, 5, 9, 100, 101, 199])
    fd = os.open(path, os.O_RDONLY)
    try:
        assert np.array_equal(sources.pread_rows(fd, rows * 16, 16, path), data[rows])
        with pytest.raises(Exception, match="file ends at byte 3200"):
            sources.pread_rows(fd, np.array([199 * 16, 200 * 16]), 16, path)
    finally:
        os.close(fd)


def test_input_files_name_what_the_workflow_tracks(tmp_path: Path):
    assert sources.input_files(spec("synthetic")) == []
    assert sources.input_files(spec("radioml2018", radioml2018={"path": "data/x.hdf5"})) == ["data/x.hdf5"]
    assert sources.input_files(spec("sigmf", sigmf={"recordings": ["missing/dir/"], "window": 8})) == [
        "missing/dir.sigmf-meta",
        "missing/dir.sigmf-data",
    ]


def test_example_configs_are_complete_and_valid():
    import yaml

    from conftest import REPO
    from rffm import config

    schema = REPO / "workflow/schemas/config.schema.yaml"
    for name in ("radioml2016", "radioml2018", "sigmf", "hdf5"):
        example = yaml.safe_load((REPO / f"config/examples/{name}.yaml").read_text())
        assert config.problems(example, schema) == [], name
        assert {spec["source"] for spec in example["datasets"].values()} == {name}


def test_a_source_without_its_options_block_is_one_readable_line():
    from conftest import REPO, tiny_config
    from rffm import config

    bad = tiny_config()
    bad["datasets"]["tiny"]["source"] = "radioml2018"
    bad["datasets"]["tiny"]["select"] = {"classes": "normal", "max_per_class_snr": 0}
    problems = config.problems(bad, REPO / "workflow/schemas/config.schema.yaml")
    missing = "datasets.tiny.radioml2018: missing; source 'radioml2018' needs it"
    assert f"{missing}. Fix: add its options block (config/examples/radioml2018.yaml)" in problems
    assert "datasets.tiny.select.classes: 'normal' is not allowed. Fix: use one of rml2018-normal" in problems
    assert any(p.startswith("datasets.tiny.select.max_per_class_snr: 0 is less than the minimum of 1. Fix:") for p in problems)
