"""Issue 34: staging refusals whose printed Fix no other test follows; each is provoked, its Fix is done as written
(an edit of the dataset entry or of the file it names, or the shell command it prints), and staging then finishes."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest

import rfdata
from conftest import stage
from rffm.errors import DataError

SPLITS = {"train": 0.5, "val": 0.25, "test": 0.25}
RML2016_FIX = "the file must be the RML2016 dict {(modulation: str, snr_db: int): float32 [n, 2, L]}"


def refused(spec: dict, out: Path) -> str:
    """The Fix staging prints for `spec` (it must refuse, leaving no sentinel)."""
    try:  # not pytest.raises: its ExceptionInfo would keep the refused source's open HDF5 handle alive past the edit
        stage(spec, out)
    except DataError as refusal:
        message = str(refusal)
    else:
        raise AssertionError(f"staging accepted {spec}")
    assert "\n" not in message and not (out / "sentinel.json").exists(), message
    return message.split(" Fix: ", 1)[1]


def staged(spec: dict, out: Path) -> bool:
    stage(spec, out)
    return (out / "sentinel.json").is_file()


def dataset(**source) -> dict:
    return {"name": "d", "seed": 0, "splits": SPLITS} | source


def canonical(path: Path, **datasets) -> dict:
    """A canonical HDF5 source of 32 examples of 16 samples; `datasets` replace or (None) drop its datasets."""
    rng = np.random.default_rng(0)
    written = {"iq": rng.standard_normal((32, 2, 16)).astype(np.float32), "label": np.arange(32) % 2} | datasets
    with h5py.File(path, "w") as handle:
        for name, value in written.items():
            if value is not None:
                handle[name] = value
        handle.attrs["classes"] = json.dumps(["BPSK", "QPSK"])
    return dataset(source="hdf5", hdf5={"path": str(path)})


def rewrite(path: Path, name: str, value) -> None:
    with h5py.File(path, "a") as handle:
        if name in handle:
            del handle[name]
        if value is not None:
            handle[name] = value


def test_a_missing_canonical_dataset_is_fixed_by_writing_the_canonical_layout(tmp_path: Path):
    spec = canonical(tmp_path / "mine.h5", label=None)
    fix = refused(spec, tmp_path / "out")
    assert fix.startswith("write the canonical layout: datasets iq (float32 [N, 2, L]), label (integer [N])"), fix
    rewrite(tmp_path / "mine.h5", "label", np.arange(32) % 2)  # the Fix: label, integer [N]
    assert staged(spec, tmp_path / "out")


def test_float_labels_are_fixed_by_storing_integer_class_indices(tmp_path: Path):
    spec = canonical(tmp_path / "mine.h5", label=(np.arange(32) % 2).astype(np.float32))
    assert refused(spec, tmp_path / "out") == "store one integer class index per example."
    rewrite(tmp_path / "mine.h5", "label", (np.arange(32) % 2).astype(np.int64))
    assert staged(spec, tmp_path / "out")


def test_a_misshapen_snr_column_is_fixed_by_leaving_it_out(tmp_path: Path):
    spec = canonical(tmp_path / "mine.h5", snr_db=np.zeros((32, 1), np.float32))
    assert refused(spec, tmp_path / "out") == "store one SNR in dB per example (NaN when unknown) or leave snr_db out."
    rewrite(tmp_path / "mine.h5", "snr_db", None)
    assert staged(spec, tmp_path / "out")


def rml2016(tmp: Path, raw: bytes) -> dict:
    path = tmp / "RML2016.10a_dict.pkl"
    path.write_bytes(raw)
    return dataset(source="radioml2016", radioml2016={"path": str(path)})


@pytest.mark.parametrize(
    "kind, data",
    [
        ("not a dict", [1, 2]),
        ("bad key", {"QPSK": np.zeros((4, 2, 128), np.float32)}),
        ("not an array", {("QPSK", 0): [0.0, 1.0]}),
        ("float64", {("QPSK", 0): np.zeros((4, 2, 128), np.float64)}),
        ("lengths differ", {("QPSK", 0): np.zeros((4, 2, 128), np.float32), ("BPSK", 0): np.zeros((4, 2, 64), np.float32)}),
    ],
)
def test_a_pickle_that_is_not_the_rml2016_dict_is_fixed_by_writing_that_dict(tmp_path: Path, kind: str, data):
    spec = rml2016(tmp_path, pickle.dumps(data, protocol=2))
    assert refused(spec, tmp_path / "out").startswith(RML2016_FIX), kind
    rfdata.write_rml2016_pickle(Path(spec["radioml2016"]["path"]), rfdata.rml2016_data(per_key=4))  # the dict the Fix describes
    assert staged(spec, tmp_path / "out")


def recording(tmp: Path, name: str = "rec", **options) -> dict:
    meta = rfdata.sigmf_recording(tmp / name, ["BPSK", "QPSK"], windows=4, window=64)
    return dataset(source="sigmf", sigmf={"recordings": [str(meta)], "window": 64, **options})


def test_a_sigmf_archive_is_fixed_by_the_printed_tar_command(tmp_path: Path):
    (tmp_path / "made").mkdir()
    pair = recording(tmp_path / "made")
    meta = Path(pair["sigmf"]["recordings"][0])
    archive = tmp_path / "rec.sigmf"
    with tarfile.open(archive, "w") as tar:  # the SigMF archive layout: one folder named after the recording
        for file in (meta, meta.with_suffix(".sigmf-data")):
            tar.add(file, arcname=f"rec/{file.name}")
    spec = pair | {"sigmf": {**pair["sigmf"], "recordings": [str(archive)]}}
    fix = refused(spec, tmp_path / "out")
    assert fix == "extract it (tar -xf rec.sigmf) and list the .sigmf-meta file.", fix
    command = fix.split("(", 1)[1].split(")", 1)[0]
    subprocess.run(["bash", "-c", command], cwd=archive.parent, check=True)
    spec["sigmf"]["recordings"] = [str(tmp_path / "rec/rec.sigmf-meta")]  # the .sigmf-meta file it extracted
    assert staged(spec, tmp_path / "out")


def test_an_empty_recordings_directory_is_fixed_by_listing_the_recording(tmp_path: Path):
    spec = recording(tmp_path)
    meta = spec["sigmf"]["recordings"][0]
    (tmp_path / "empty").mkdir()
    spec["sigmf"]["recordings"] = [str(tmp_path / "empty")]
    assert refused(spec, tmp_path / "out") == "list recordings or their directory."
    spec["sigmf"]["recordings"] = [meta]
    assert staged(spec, tmp_path / "out")


def test_a_mistyped_recording_path_is_fixed_by_correcting_it(tmp_path: Path):
    spec = recording(tmp_path)
    meta = spec["sigmf"]["recordings"][0]
    spec["sigmf"]["recordings"] = [meta.replace("rec.sigmf-meta", "recc.sigmf-meta")]
    assert refused(spec, tmp_path / "out") == "correct the path."
    spec["sigmf"]["recordings"] = [meta]
    assert staged(spec, tmp_path / "out")


def test_metadata_that_is_not_json_is_fixed_by_writing_it_with_the_sigmf_package(tmp_path: Path):
    spec = recording(tmp_path)
    meta = Path(spec["sigmf"]["recordings"][0])
    meta.write_text('{"global": ')
    assert refused(spec, tmp_path / "out").startswith("write the recording with the sigmf package (SigMFFile.tofile)")
    meta.unlink()  # SigMFFile.tofile writes a new file only
    rfdata.sigmf_recording(tmp_path / "rec", ["BPSK", "QPSK"], windows=4, window=64)  # SigMFFile.tofile, as the Fix says
    assert staged(spec, tmp_path / "out")


def test_recordings_of_two_sample_rates_are_fixed_by_staging_one_rate(tmp_path: Path):
    spec = recording(tmp_path)
    other = Path(recording(tmp_path, "other")["sigmf"]["recordings"][0])
    rfdata.edit_json(other, lambda body: body["global"].update({"core:sample_rate": 2e6}))
    spec["sigmf"]["recordings"].append(str(other))
    assert refused(spec, tmp_path / "out") == "stage recordings of one sample rate per dataset (or resample them)."
    spec["sigmf"]["recordings"].remove(str(other))
    assert staged(spec, tmp_path / "out")


def test_a_two_channel_recording_is_fixed_by_splitting_its_channels(tmp_path: Path):
    spec = recording(tmp_path)
    meta = Path(spec["sigmf"]["recordings"][0])
    data = meta.with_suffix(".sigmf-data")
    samples = np.fromfile(data, np.complex64)
    np.stack([samples, samples * 0.5], 1).tofile(data)  # channels interleaved, as SigMF stores them
    rfdata.edit_json(meta, lambda body: body["global"].update({"core:num_channels": 2}) or body["global"].pop("core:sha512", None))
    assert refused(spec, tmp_path / "out") == "split the channels into one recording each."
    channels = np.fromfile(data, np.complex64).reshape(-1, 2)
    spec["sigmf"]["recordings"] = []
    for channel in range(2):  # the Fix: each channel its own recording (data file and metadata)
        base = tmp_path / f"rec-ch{channel}"
        channels[:, channel].tofile(base.with_suffix(".sigmf-data"))
        shutil.copy(meta, base.with_suffix(".sigmf-meta"))
        rfdata.edit_json(base.with_suffix(".sigmf-meta"), lambda body: body["global"].pop("core:num_channels"))
        spec["sigmf"]["recordings"].append(str(base.with_suffix(".sigmf-meta")))
    assert staged(spec, tmp_path / "out")


def test_a_data_file_moved_away_is_fixed_by_putting_it_beside_its_metadata(tmp_path: Path):
    spec = recording(tmp_path)
    data = Path(spec["sigmf"]["recordings"][0]).with_suffix(".sigmf-data")
    (tmp_path / "elsewhere").mkdir()
    os.rename(data, tmp_path / "elsewhere" / data.name)
    assert refused(spec, tmp_path / "out") == "put the .sigmf-data file beside its .sigmf-meta."
    os.rename(tmp_path / "elsewhere" / data.name, data)
    assert staged(spec, tmp_path / "out")


def test_a_data_file_with_extra_bytes_is_fixed_by_correcting_the_truncated_file(tmp_path: Path):
    spec = recording(tmp_path)
    data = Path(spec["sigmf"]["recordings"][0]).with_suffix(".sigmf-data")
    whole = data.read_bytes()
    data.write_bytes(whole[:-3])  # a copy cut short
    fix = refused(spec, tmp_path / "out")
    assert fix == "the file is truncated or core:datatype in rec.sigmf-meta is wrong; correct one of them.", fix
    data.write_bytes(whole)  # the file, complete again
    assert staged(spec, tmp_path / "out")


@pytest.mark.parametrize(
    "damage, fix",
    [
        (lambda annotation: annotation.pop("core:sample_count"), "give every labelled annotation its length."),
        (lambda annotation: annotation.update({"core:sample_count": 10**6}), "correct the annotation or restore the full data file."),
    ],
    ids=["without its length", "past the end"],
)
def test_an_annotation_without_its_right_length_is_fixed_by_giving_it(tmp_path: Path, damage, fix: str):
    spec = recording(tmp_path)
    meta = Path(spec["sigmf"]["recordings"][0])
    count = json.loads(meta.read_text())["annotations"][0]["core:sample_count"]
    rfdata.edit_json(meta, lambda body: damage(body["annotations"][0]))
    assert refused(spec, tmp_path / "out") == fix
    rfdata.edit_json(meta, lambda body: body["annotations"][0].update({"core:sample_count": count}))
    assert staged(spec, tmp_path / "out")


def test_metadata_with_an_invalid_field_is_fixed_by_fixing_the_field(tmp_path: Path):
    spec = recording(tmp_path)
    meta = Path(spec["sigmf"]["recordings"][0])
    rate = json.loads(meta.read_text())["global"]["core:sample_rate"]
    rfdata.edit_json(meta, lambda body: body["global"].update({"core:sample_rate": "1 MHz"}))  # the schema wants a number
    with pytest.raises(DataError, match=re.escape("(ValidationError: $.global['core:sample_rate']: '1 MHz' is not of type 'number')")):
        stage(spec, tmp_path / "out")  # one line naming the field, not sigmf's traceback
    fix = refused(spec, tmp_path / "out")
    assert fix == "write the recording with the sigmf package (SigMFFile.tofile) or fix the field.", fix
    rfdata.edit_json(meta, lambda body: body["global"].update({"core:sample_rate": rate}))
    assert staged(spec, tmp_path / "out")
