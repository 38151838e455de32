"""Issue 34: `rffm predict` refusals; each is provoked through the command line, its Fix is done as written (the
model or input it says to pass, the flag it names, data staged or a model exported at the length it names), and
the same command then classifies."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import rfdata
from conftest import stage
from rffm.cli import main
from rffm.model import programs
from rffm.records.layout import EXPORT_PROGRAM

CLASSES = ["BPSK", "QPSK"]
LENGTH = 16


def dataset(length: int) -> dict:
    return {
        "name": "d",
        "source": "synthetic",
        "seed": 0,
        "synthetic": {"classes": CLASSES, "snr_db": {"min": 10, "max": 10, "step": 1}, "examples_per_class_snr": 8, "length": length},
    }


class Flat(torch.nn.Module):
    """A stand-in classifier: IQ [B, 2, L] -> logits [B, 2] (predict runs any program carrying rffm's signature)."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2 * length, len(CLASSES))

    def forward(self, iq: torch.Tensor) -> torch.Tensor:
        return self.linear(iq.flatten(1))


def exported(folder: Path, length: int) -> Path:
    """An export folder as the export step lays it out: model.pt2 with the signature inside."""
    folder.mkdir(parents=True, exist_ok=True)
    program = programs.torch_program(Flat(length).eval(), length)
    programs.save_program(program, folder / EXPORT_PROGRAM, {"classes": CLASSES, "input": {"length": length}})
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A results tree (its folder named results, as `make run` leaves it): runs/base/export, a model of LENGTH, and
    datasets/d, staged at LENGTH."""
    root = tmp_path_factory.mktemp("predict") / "results"
    exported(root / "runs/base/export", LENGTH)
    stage(dataset(LENGTH), root / "datasets/d")
    return root


def refused(capsys, *argv: str) -> str:
    """The Fix `rffm predict` prints for argv (it must exit 2 with one line)."""
    capsys.readouterr()
    assert main(["predict", *map(str, argv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and " Fix: " in err, err
    return err.strip().split(" Fix: ", 1)[1]


def classified(capsys, out: Path, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["predict", *map(str, argv), "--out", str(out)]) == 0, capsys.readouterr().err
    return json.loads(out.read_text())


def test_a_run_folder_without_export_is_fixed_by_pointing_at_its_export(root: Path, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(root.parent)  # where `make run` ran: its results/ (the config's default root) is here
    fix = refused(capsys, "results/runs/base", "results/datasets/d/val.h5")
    assert fix == "point at results/runs/<run>/export (or its model.pt2) after `make run`."
    model = fix.split()[2].replace("<run>", "base")
    assert classified(capsys, tmp_path / "p.json", model, "results/datasets/d/val.h5")["windows"] == 4


def test_a_program_without_rffms_signature_is_fixed_by_pointing_at_the_model_export_writes(root: Path, tmp_path: Path, capsys):
    plain = tmp_path / "backbone.pt2"  # a torch.export program, not the classifier export writes
    torch.export.save(torch.export.export(Flat(LENGTH).eval(), (torch.zeros(2, 2, LENGTH),)), plain)
    assert refused(capsys, plain, root / "datasets/d/val.h5") == "point at the model.pt2 that export writes."
    model = root / "runs/base/export" / EXPORT_PROGRAM
    assert classified(capsys, tmp_path / "p.json", model, root / "datasets/d/val.h5")["windows"] == 4


def test_an_hdf5_file_of_another_layout_is_fixed_by_passing_a_staged_split(root: Path, tmp_path: Path, capsys):
    with h5py.File(tmp_path / "other.h5", "w") as handle:
        handle["samples"] = np.zeros((4, LENGTH, 2), np.float32)
    fix = refused(capsys, root / "runs/base/export", tmp_path / "other.h5")
    assert fix == "pass a staged split, an RML2018 file or a SigMF recording."
    assert classified(capsys, tmp_path / "p.json", root / "runs/base/export", root / "datasets/d/val.h5")["labelled"] == 4


def test_the_test_split_is_fixed_by_passing_the_flag_the_line_names(root: Path, tmp_path: Path, capsys):
    fix = refused(capsys, root / "runs/base/export", root / "datasets/d/test.h5")
    assert fix == "predict on the val split or other data, or pass --i-know-this-is-test to read it anyway."
    flag = re.search(r"pass (--[\w-]+)", fix).group(1)
    assert classified(capsys, tmp_path / "p.json", root / "runs/base/export", root / "datasets/d/test.h5", flag)["windows"] == 4


def test_a_split_of_another_length_is_fixed_by_staging_at_the_models_length(root: Path, tmp_path: Path, capsys):
    stage(dataset(2 * LENGTH), tmp_path / "long")
    fix = refused(capsys, root / "runs/base/export", tmp_path / "long/val.h5")
    assert fix == f"stage the data with length {LENGTH}."
    stage(dataset(int(fix.split()[-1].rstrip("."))), tmp_path / "restaged")  # datasets.d.synthetic.length as the line says
    assert classified(capsys, tmp_path / "p.json", root / "runs/base/export", tmp_path / "restaged/val.h5")["windows"] == 4


def test_a_radioml_file_of_another_length_is_fixed_by_a_model_exported_for_its_length(root: Path, tmp_path: Path, capsys):
    pickle = rfdata.write_rml2016_pickle(tmp_path / "RML2016.10a_dict.pkl", rfdata.rml2016_data(per_key=2, length=128))
    fix = refused(capsys, root / "runs/base/export", pickle)
    assert fix == "use a model exported for length 128."
    model = exported(tmp_path / "export128", int(fix.split()[-1].rstrip(".")))
    result = classified(capsys, tmp_path / "p.json", model, pickle)
    assert result["windows"] == 16 and result["labelled"] == 8  # its BPSK and QPSK rows; the model has no QAM16 or GFSK


def test_a_data_file_without_its_metadata_is_fixed_by_passing_the_meta_of_a_pair(root: Path, tmp_path: Path, capsys):
    (tmp_path / "pair").mkdir()
    meta = rfdata.sigmf_recording(tmp_path / "pair/capture", CLASSES, snrs=(10,), windows=2, window=LENGTH)
    (tmp_path / "lone").mkdir()
    lone = shutil.copy(meta.with_suffix(".sigmf-data"), tmp_path / "lone")  # the data file copied without its metadata
    assert refused(capsys, root / "runs/base/export", lone) == "pass the .sigmf-meta of a pair."
    assert classified(capsys, tmp_path / "p.json", root / "runs/base/export", meta)["windows"] == 5


def test_a_mistyped_meta_path_is_named_as_missing_and_fixed_by_passing_the_recording(root: Path, tmp_path: Path, capsys):
    """Issue 50: a .sigmf-meta that does not exist was called "not a readable SigMF recording"."""
    meta = rfdata.sigmf_recording(tmp_path / "capture", CLASSES, snrs=(10,), windows=2, window=LENGTH)
    typo = tmp_path / "captrue.sigmf-meta"
    assert refused(capsys, root / "runs/base/export", typo) == "pass a SigMF recording, an HDF5 split or a RadioML file."
    assert main(["predict", str(root / "runs/base/export"), str(typo)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"rffm predict: error: {typo}: no such input file. Fix: pass a SigMF recording, an HDF5 split or a RadioML file."
    )
    assert classified(capsys, tmp_path / "p.json", root / "runs/base/export", meta)["windows"] == 5


def test_a_meta_without_its_data_file_is_fixed_by_putting_the_data_beside_it(root: Path, tmp_path: Path, capsys):
    meta = rfdata.sigmf_recording(tmp_path / "capture", CLASSES, snrs=(10,), windows=2, window=LENGTH)
    data = meta.with_suffix(".sigmf-data")
    kept = data.rename(tmp_path / "elsewhere.sigmf-data")
    assert refused(capsys, root / "runs/base/export", meta) == "put the .sigmf-data file beside its .sigmf-meta."
    kept.rename(data)
    assert classified(capsys, tmp_path / "p.json", root / "runs/base/export", meta)["windows"] == 5


def test_a_recording_shorter_than_a_window_is_fixed_by_a_longer_recording(root: Path, tmp_path: Path, capsys):
    short = rfdata.write_sigmf(tmp_path / "short", np.ones(LENGTH - 1, np.complex64), [])
    assert refused(capsys, root / "runs/base/export", short) == "pass a longer recording."
    longer = rfdata.write_sigmf(tmp_path / "longer", np.ones(3 * LENGTH, np.complex64), [])
    assert classified(capsys, tmp_path / "p.json", root / "runs/base/export", longer)["windows"] == 3


def test_a_missing_input_is_fixed_by_passing_a_split(root: Path, tmp_path: Path, capsys):
    fix = refused(capsys, root / "runs/base/export", root / "datasets/d/val.hdf5")
    assert fix == "pass a SigMF recording, an HDF5 split or a RadioML file."
    assert classified(capsys, tmp_path / "p.json", root / "runs/base/export", root / "datasets/d/val.h5")["windows"] == 4
