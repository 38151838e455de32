"""The malformed-input battery: each kind of bad input fails staging with its own message naming the file,
the field and the fix, and leaves nothing in the output directory."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest

import rfdata
from conftest import stage
from rffm.errors import ConfigError, DataError

SPLITS = {"train": 0.5, "val": 0.25, "test": 0.25}


def rml2016(tmp: Path, data=None, raw: bytes | None = None, **extra) -> dict:
    path = tmp / "RML2016.10a_dict.pkl"
    if raw is not None:
        path.write_bytes(raw)
    else:
        rfdata.write_rml2016_pickle(path, rfdata.rml2016_data(per_key=4) if data is None else data)
    return {"source": "radioml2016", "radioml2016": {"path": str(path)}, **extra}


def rml2016_with(key, array) -> callable:
    def build(tmp: Path) -> dict:
        data = rfdata.rml2016_data(per_key=4)
        data[key] = array
        return rml2016(tmp, data)

    return build


def rml2018(tmp: Path, edit=None, **extra) -> dict:
    x, columns, snrs = rfdata.rml2018_data(["BPSK", "QPSK"], per_key=4, length=32)
    path = rfdata.write_rml2018_hdf5(tmp / "GOLD_XYZ_OSC.0001_1024.hdf5", x, columns, snrs)
    if edit:
        with h5py.File(path, "a") as handle:
            edit(handle)
    return {"source": "radioml2018", "radioml2018": {"path": str(path)}, "select": {"classes": ["BPSK", "QPSK"]}, **extra}


def replace(name: str, value) -> callable:
    def edit(handle):
        del handle[name]
        handle[name] = value

    return edit


def poke(name: str, index, value) -> callable:
    def edit(handle):
        handle[name][index] = value

    return edit


def sigmf(tmp: Path, edit_meta=None, edit_data=None, window: int = 64, **options) -> dict:
    meta = rfdata.sigmf_recording(tmp / "rec", ["BPSK", "QPSK"], windows=4, window=window)
    data = meta.with_suffix(".sigmf-data")
    if edit_meta:
        rfdata.edit_json(meta, edit_meta)
    if edit_data:
        edit_data(data)
    return {"source": "sigmf", "sigmf": {"recordings": [str(meta)], "window": window, **options}}


def hdf5(tmp: Path, classes=("BPSK", "QPSK"), labels=None, iq=None) -> dict:
    rng = np.random.default_rng(0)
    iq = rng.standard_normal((32, 2, 16)).astype(np.float32) if iq is None else iq
    labels = np.arange(32) % 2 if labels is None else labels
    path = tmp / "mine.h5"
    with h5py.File(path, "w") as handle:
        handle["iq"], handle["label"] = iq, labels
        if classes is not None:
            handle.attrs["classes"] = json.dumps(list(classes))
    return {"source": "hdf5", "hdf5": {"path": str(path)}}


class Evil:
    def __reduce__(self):
        return (os.system, ("true",))


def drop_annotation_count(body):
    del body["annotations"][0]["core:sample_count"]


def annotation_past_end(body):
    body["annotations"][0]["core:sample_count"] = 10**6


def duplicated_rows(tmp: Path) -> dict:
    iq = np.random.default_rng(1).standard_normal((32, 2, 16)).astype(np.float32)
    iq[1::2] = iq[0::2]  # every example twice, same class
    return hdf5(tmp, labels=np.repeat(np.arange(16) % 2, 2), iq=iq)


# kind -> (builder, error type, fragments the message must contain besides "Fix:")
CASES = {
    "rml2016 not a pickle": (
        lambda t: rml2016(t, raw=b"\x89HDF\r\n garbage"),
        DataError,
        ["RML2016.10a_dict.pkl", "not an RML2016 pickle"],
    ),
    "rml2016 not a dict": (lambda t: rml2016(t, raw=pickle.dumps([1, 2], protocol=2)), DataError, ["holds list, not a non-empty dict"]),
    "rml2016 bad key": (
        lambda t: rml2016(t, raw=pickle.dumps({"QPSK": np.zeros((4, 2, 128), np.float32)}, protocol=2)),
        DataError,
        ["dict key 'QPSK' is not a (modulation, snr_db) pair"],
    ),
    "rml2016 snr off grid": (
        rml2016_with(("QPSK", 19), np.zeros((4, 2, 128), np.float32)),
        DataError,
        ["key ('QPSK', 19)", "outside the RML2016 grid"],
    ),
    "rml2016 wrong shape": (
        rml2016_with(("QPSK", 2), np.zeros((4, 128, 2), np.float32)),
        DataError,
        ["key ('QPSK', 2)", "float32 [4, 128, 2], expected float32 [n, 2, L]"],
    ),
    "rml2016 wrong dtype": (
        rml2016_with(("QPSK", 2), np.zeros((4, 2, 128), np.float64)),
        DataError,
        ["key ('QPSK', 2)", "array is float64"],
    ),
    "rml2016 unknown class": (
        rml2016_with(("FOO", 2), np.random.default_rng(2).standard_normal((4, 2, 128)).astype(np.float32)),
        DataError,
        ["key ('FOO', snr)", "class 'FOO' is not in the class vocabulary", "class_map"],
    ),
    "rml2016 foreign code": (
        lambda t: rml2016(t, raw=pickle.dumps({("QPSK", 0): Evil()}, protocol=2)),
        DataError,
        ["refers to posix.system"],
    ),
    "rml2018 missing dataset": (
        lambda t: rml2018(t, lambda h: h.__delitem__("Z")),
        DataError,
        ["GOLD_XYZ_OSC.0001_1024.hdf5", "dataset 'Z' is missing"],
    ),
    "rml2018 X transposed": (
        lambda t: rml2018(t, replace("X", np.zeros((16, 2, 32), np.float32))),
        DataError,
        ["dataset 'X' is float32 [16, 2, 32]", "use source: hdf5"],
    ),
    "rml2018 X not float32": (
        lambda t: rml2018(t, replace("X", np.zeros((16, 32, 2), np.int16))),
        DataError,
        ["dataset 'X' is int16 [16, 32, 2]"],
    ),
    "rml2018 Y width": (
        lambda t: rml2018(t, replace("Y", np.eye(11, dtype=np.int64)[np.arange(16) % 11])),
        DataError,
        ["dataset 'Y' is int64 [16, 11]"],
    ),
    "rml2018 Y not one-hot": (
        lambda t: rml2018(t, poke("Y", (5, 7), 1)),
        DataError,
        ["dataset 'Y': 1 row(s)", "not one-hot", "first: row 5"],
    ),
    "rml2018 Y rows mismatch": (
        lambda t: rml2018(t, replace("Y", np.eye(24, dtype=np.int64)[:15])),
        DataError,
        ["dataset 'Y' is int64 [15, 24]", "one row per X row"],
    ),
    "rml2018 snr off grid": (
        lambda t: rml2018(t, poke("Z", (9, 0), 31)),
        DataError,
        ["dataset 'Z': row 9 has SNR 31 dB", "outside the RML2018 grid"],
    ),
    "rml2018 NaN samples": (
        lambda t: rml2018(t, poke("X", (np.s_[7:10], 3, 1), np.nan)),
        DataError,
        ["X[7]", "NaN or Inf samples in 3 selected example(s)"],
    ),
    "rml2018 Inf samples": (lambda t: rml2018(t, poke("X", (12, 0, 0), np.inf)), DataError, ["X[12]", "NaN or Inf samples in 1 selected"]),
    "rml2018 not hdf5": (
        lambda t: rml2016(t) | {"source": "radioml2018", "radioml2018": {"path": str(t / "RML2016.10a_dict.pkl")}},
        DataError,
        ["not a readable HDF5 file"],
    ),
    "rml2018 missing file": (
        lambda t: {"source": "radioml2018", "radioml2018": {"path": str(t / "nowhere.hdf5")}},
        DataError,
        ["nowhere.hdf5: no such file", "datasets.d.radioml2018.path"],
    ),
    "sigmf size vs datatype": (
        lambda t: sigmf(t, edit_data=lambda p: p.write_bytes(p.read_bytes() + b"abc")),
        DataError,
        ["rec.sigmf-data", "not a whole number of cf32_le samples", "core:datatype"],
    ),
    "sigmf annotation past end": (
        lambda t: sigmf(t, annotation_past_end, verify_checksum=False),
        DataError,
        ["rec.sigmf-meta: annotation 0", "core:sample_count", "holds"],
    ),
    "sigmf real datatype": (
        lambda t: sigmf(t, lambda b: b["global"].update({"core:datatype": "rf32_le"})),
        DataError,
        ["core:datatype is 'rf32_le'", "complex"],
    ),
    "sigmf missing data": (
        lambda t: sigmf(t, edit_data=lambda p: p.unlink()),
        DataError,
        ["rec.sigmf-data: the data file of rec.sigmf-meta is missing"],
    ),
    "sigmf checksum": (
        lambda t: sigmf(t, edit_data=lambda p: p.write_bytes(b"\0" * 8 + p.read_bytes()[8:])),
        DataError,
        ["sha512 does not match global core:sha512"],
    ),
    "sigmf no sample_count": (lambda t: sigmf(t, drop_annotation_count), DataError, ["annotation 0 ('BPSK') has no core:sample_count"]),
    "sigmf snr not a number": (
        lambda t: sigmf(t, lambda b: b["annotations"][0].update({"rffm:snr_db": "high"})),
        DataError,
        ["annotation 0 field 'rffm:snr_db' is 'high'"],
    ),
    "sigmf window too long": (
        lambda t: (lambda s: s | {"sigmf": {**s["sigmf"], "window": 4096}})(sigmf(t)),
        DataError,
        ["no labelled window of 4096 samples", "core:label"],
    ),
    "sigmf unknown label": (
        lambda t: sigmf(t, lambda b: b["annotations"][0].update({"core:label": "LoRa"})),
        DataError,
        ["annotation 0: core:label", "'LoRa'", "class_map"],
    ),
    "hdf5 no classes": (lambda t: hdf5(t, classes=None), DataError, ["mine.h5: attribute 'classes' is missing"]),
    "hdf5 label out of range": (
        lambda t: hdf5(t, labels=np.r_[np.arange(31) % 2, 5]),
        DataError,
        ["dataset 'label' row 31 is 5, outside 0..1"],
    ),
    "hdf5 iq wrong layout": (
        lambda t: hdf5(t, iq=np.random.default_rng(4).standard_normal((32, 16, 2)).astype(np.float32)),
        DataError,
        ["dataset 'iq' is float32 [32, 16, 2]", "[N, 2, L]"],
    ),
    "unknown selected class": (
        lambda t: rml2018(t, select={"classes": ["BPSK", "GFSK"]}),
        ConfigError,
        ["datasets.d.select.classes: 'GFSK' is not a class of"],
    ),
    "empty class": (
        lambda t: hdf5(t, classes=("BPSK", "QPSK", "8PSK"), labels=np.arange(32) % 2),
        DataError,
        ["mine.h5: class(es) 8PSK have no examples", "select.classes"],
    ),
    "empty after snr range": (
        lambda t: rml2018(t, select={"snr_db": {"min": 20}, "classes": ["BPSK", "QPSK"]}),
        DataError,
        ["have no examples with SNR in [20, inf] dB"],
    ),
    "split too small": (
        lambda t: rml2018(t, splits={"train": 0.9, "val": 0.05, "test": 0.05}),
        DataError,
        ["split 'val' has no examples", "too small for the requested split fractions"],
    ),
    "duplicates across splits": (
        duplicated_rows,
        DataError,
        ["mine.h5: iq[", "same IQ as", "duplicate content across splits", "duplicates: drop"],
    ),
}


@pytest.mark.parametrize("kind", CASES)
def test_malformed_input_fails_clearly_and_leaves_nothing(tmp_path: Path, kind: str):
    build, error, fragments = CASES[kind]
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    spec = {"name": "d", "seed": 0, "splits": SPLITS} | build(data)
    with pytest.raises(error) as caught:
        stage(spec, out)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{kind}: {fragment!r} not in {message!r}"
    assert "Fix:" in message and "\n" not in message
    assert not out.exists() or not list(out.iterdir()), f"{kind} left {list(out.iterdir())}"


def test_every_kind_has_its_own_message(tmp_path: Path):
    messages = set()
    for number, (build, error, _) in enumerate(CASES.values()):
        data = tmp_path / f"d{number}"
        data.mkdir()
        with pytest.raises(error) as caught:
            stage({"name": "d", "seed": 0, "splits": SPLITS} | build(data), tmp_path / f"o{number}")
        messages.add(str(caught.value).replace(str(data), "").split("Fix:")[0])
    assert len(messages) == len(CASES)


def test_a_failed_restaging_removes_the_old_sentinel(tmp_path: Path):
    spec = {"name": "d", "seed": 0, "splits": SPLITS} | rml2018(tmp_path)
    stage(spec, tmp_path / "out")
    assert (tmp_path / "out/sentinel.json").exists()
    with h5py.File(tmp_path / "GOLD_XYZ_OSC.0001_1024.hdf5", "a") as handle:
        handle["X"][3, 0, 0] = np.nan
    with pytest.raises(DataError, match="NaN"):
        stage(spec, tmp_path / "out")
    assert not (tmp_path / "out/sentinel.json").exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "provenance.json",
        "test.h5",
        "train.h5",
        "val.h5",
    ]  # the old, untouched


def edit_hdf5(path: str, edit) -> None:
    with h5py.File(path, "a") as handle:
        edit(handle)


def edit_meta(spec: dict, edit) -> None:
    rfdata.edit_json(Path(spec["sigmf"]["recordings"][0]), edit)


def transposed_iq(handle) -> None:
    iq = handle["iq"][()]
    del handle["iq"]
    handle["iq"] = iq.transpose(0, 2, 1)


REPAIRED = np.random.default_rng(3).standard_normal((3, 32, 2)).astype(np.float32)  # examples of their own, not copies

# kind -> (the words of the printed Fix this follows, what a user does on reading them: to the dataset entry or its files)
FOLLOWED = {
    "rml2016 unknown class": ("datasets.d.class_map: {'FOO': <class name>}", lambda s: s.update(class_map={"FOO": "foo"})),
    "rml2018 NaN samples": (
        "repair or remove those examples",
        lambda s: edit_hdf5(s["radioml2018"]["path"], poke("X", np.s_[7:10], REPAIRED)),
    ),
    "rml2018 Inf samples": ("repair or remove those examples", lambda s: edit_hdf5(s["radioml2018"]["path"], poke("X", 12, REPAIRED[0]))),
    "rml2018 missing file": (
        "correct the path",
        lambda s: s.update(radioml2018=rml2018(Path(s["radioml2018"]["path"]).parent)["radioml2018"]),
    ),
    "sigmf real datatype": ("set core:datatype", lambda s: edit_meta(s, lambda b: b["global"].update({"core:datatype": "cf32_le"}))),
    "sigmf checksum": ("set datasets.d.sigmf.verify_checksum: false", lambda s: s["sigmf"].update(verify_checksum=False)),
    "sigmf snr not a number": (
        "store the SNR in dB as a number",
        lambda s: edit_meta(s, lambda b: b["annotations"][0].update({"rffm:snr_db": 0})),
    ),
    "sigmf window too long": ("lower datasets.d.sigmf.window", lambda s: s["sigmf"].update(window=64)),
    "sigmf unknown label": ("datasets.d.class_map: {'LoRa': <class name>}", lambda s: s.update(class_map={"LoRa": "lora"})),
    "hdf5 no classes": (
        "set attrs['classes'] to the ordered class names (a JSON list",
        lambda s: edit_hdf5(s["hdf5"]["path"], lambda h: h.attrs.__setitem__("classes", json.dumps(["BPSK", "QPSK"]))),
    ),
    "hdf5 label out of range": ("correct the labels", lambda s: edit_hdf5(s["hdf5"]["path"], poke("label", 31, 1))),
    "hdf5 iq wrong layout": ("iq.transpose(0, 2, 1)", lambda s: edit_hdf5(s["hdf5"]["path"], transposed_iq)),
    "unknown selected class": ("select classes the source has", lambda s: s["select"].update(classes=["BPSK", "QPSK"])),
    "empty class": ("leave them out with datasets.d.select.classes", lambda s: s.update(select={"classes": ["BPSK", "QPSK"]})),
    "empty after snr range": ("widen datasets.d.select.snr_db", lambda s: s["select"].pop("snr_db")),
    "split too small": ("change datasets.d.splits", lambda s: s.update(splits=SPLITS)),
    "duplicates across splits": ("set datasets.d.duplicates: drop", lambda s: s.update(duplicates="drop")),
}


@pytest.mark.parametrize("kind", FOLLOWED)
def test_the_printed_fix_followed_lets_staging_finish(tmp_path: Path, kind: str):
    """Issue 34: the Fix of each refusal whose advice is an edit (of the config entry or of the file it names), done as
    written, and staging finishes (or refuses what the edit uncovered, with a Fix followed in turn); the other kinds'
    advice is to fetch the real file again."""
    build, error, _ = CASES[kind]
    data = tmp_path / "data"
    data.mkdir()
    spec = {"name": "d", "seed": 0, "splits": SPLITS} | build(data)
    followed = []
    while True:
        try:
            stage(spec, tmp_path / f"try{len(followed)}")
            break
        except (ConfigError, DataError) as refusal:
            fix = str(refusal).split("Fix: ", 1)[1]
        words, follow = FOLLOWED[kind] if not followed else next((w, f) for w, f in FOLLOWED.values() if w in fix)
        assert words in fix and len(followed) < 3, (followed, fix)
        follow(spec)
        followed.append(words)
    assert followed[0] == FOLLOWED[kind][0] and (tmp_path / f"try{len(followed)}/sentinel.json").is_file()
