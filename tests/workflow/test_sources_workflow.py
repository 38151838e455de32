"""The tiny workflow through qualification on tiny files in each real layout (RML2016 pickle, RML2018 HDF5,
SigMF cf32_le + ci16_le, canonical HDF5), in one Snakemake run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import rfdata
from conftest import BIN, accuracy_of_examples, planned_jobs, snakemake, write_config
from rffm.data import sources, synthetic

pytestmark = pytest.mark.workflow

SPLITS = {"train": 0.5, "val": 0.25, "test": 0.25}
ARCH = {"patch": 16, "dim": 16, "depth": 1, "heads": 2, "mlp_ratio": 2, "stem": "iq", "output_layers": 1}
TRAIN = {"epochs": 1, "lr": 0.01, "batch_size": 16, "seed": 0}


def write_sources(data: Path) -> None:
    data.mkdir()
    rfdata.write_rml2016_pickle(data / "RML2016.10a_dict.pkl", rfdata.rml2016_data())
    x, columns, snrs = rfdata.rml2018_data([*sources.PRESETS["rml2018-normal"], "256QAM"], per_key=4)
    rfdata.write_rml2018_hdf5(data / "GOLD_XYZ_OSC.0001_1024.hdf5", x, columns, snrs)
    (data / "captures").mkdir()
    rfdata.sigmf_recording(data / "captures" / "cf32", ["bpsk", "QAM16", "qpsk", "GFSK"], windows=4)
    rfdata.sigmf_recording(data / "captures" / "ci16", ["bpsk", "QAM16", "qpsk", "GFSK"], windows=4, datatype="ci16_le", seed=1)
    spec = synthetic.SyntheticSpec(classes=["BPSK", "QPSK", "16QAM", "GFSK"], snr_db=[0.0, 10.0], examples_per_class_snr=16, length=128)
    iq, labels, _ = synthetic.generate(spec, 5)
    rfdata.write_canonical_hdf5(data / "mine.h5", iq, labels, ["bpsk", "qpsk", "QAM16", "gfsk"])  # no snr_db: unknown


def config() -> dict:
    datasets = {
        "rml2016": {"source": "radioml2016", "radioml2016": {"path": "data/RML2016.10a_dict.pkl"}, "normalize": "rms"},
        "rml2018": {
            "source": "radioml2018",
            "radioml2018": {"path": "data/GOLD_XYZ_OSC.0001_1024.hdf5"},
            "select": {"classes": "rml2018-normal"},
        },
        "captures": {"source": "sigmf", "sigmf": {"recordings": ["data/captures"], "window": 128}},
        "mine": {"source": "hdf5", "hdf5": {"path": "data/mine.h5"}},
    }
    return {
        "results": "results",
        "scratch": "scratch",
        "threads": 1,
        "cache": {"batch_size": 64},
        "datasets": {name: {**spec, "seed": 3, "splits": SPLITS} for name, spec in datasets.items()},
        "backbones": {
            "b128": {
                "source": "pretrain",
                "dataset": "rml2016",
                "arch": ARCH,
                "pretrain": {"epochs": 1, "min_steps": 0, "batch_size": 32, "seed": 0},
            },
            "b1024": {"source": "random", "dataset": "rml2018", "arch": ARCH, "pretrain": {"seed": 0}},
        },
        "runs": {
            # exported: the 1024-sample classifier (the 128-sample export is the tiny run's, tests/workflow/test_export_workflow.py)
            name: {"dataset": name, "backbone": "b1024" if name == "rml2018" else "b128", "train": TRAIN, "export": name == "rml2018"}
            for name in ("rml2016", "rml2018", "captures", "mine")
        },
    }


EXPECTED = {
    "rml2016": (["BPSK", "GFSK", "16QAM", "QPSK"], {"train": 64, "val": 32, "test": 32}, ["0", "10"]),
    "rml2018": (sources.PRESETS["rml2018-normal"], {"train": 44, "val": 22, "test": 22}, ["0", "10"]),
    "captures": (["BPSK", "QPSK", "16QAM", "GFSK"], {"train": 32, "val": 16, "test": 16}, ["0", "10"]),
    "mine": (["BPSK", "QPSK", "16QAM", "GFSK"], {"train": 64, "val": 32, "test": 32}, ["unknown"]),
}


def test_every_real_layout_runs_through_qualification(tmp_path: Path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    write_sources(workdir / "data")
    write_config(workdir, config())
    snakemake(workdir)
    for run, (classes, counts, snr_keys) in EXPECTED.items():
        manifest = json.loads((workdir / f"results/runs/{run}/qualification/run_manifest.json").read_text())
        assert manifest["dataset"]["classes"] == classes, run
        assert manifest["dataset"]["counts"] == counts, run
        assert sorted(manifest["qualification"]["accuracy_by_snr"]) == snr_keys, run
        assert manifest["qualification"]["accuracy"] == accuracy_of_examples(workdir / f"results/runs/{run}/qualification"), run
    verify = subprocess.run([str(BIN / "rffm"), "verify", "results"], cwd=workdir, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout

    # the source files are inputs: new content in one restages that dataset and reruns its run only
    spec = synthetic.SyntheticSpec(classes=["BPSK", "QPSK", "16QAM", "GFSK"], snr_db=[0.0, 10.0], examples_per_class_snr=16, length=128)
    iq, labels, _ = synthetic.generate(spec, 6)
    rfdata.write_canonical_hdf5(workdir / "data/mine.h5", iq, labels, ["bpsk", "qpsk", "QAM16", "gfsk"])
    assert planned_jobs(workdir) == sorted(
        ["stage_dataset[dataset=mine]", "build_cache[dataset=mine, backbone=b128]", "train_epoch[run=mine, epoch=1]"]
        + ["select_checkpoint[run=mine]", "qualify[run=mine]"]
        + ["plot_training[run=mine]", "summarize_manifest[run=mine]"]  # report figures
    )
