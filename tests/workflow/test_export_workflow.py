"""The exported classifier (rules/export.smk) and `rffm predict` on the tiny run (issue 24)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import rfdata
from conftest import BIN, copy_workdir, planned_jobs, snakemake, tiny_config, write_config
from rffm.ops.predict import predict
from rffm.records.files import sha256_file

pytestmark = pytest.mark.workflow

EXPORT = Path("results/runs/base/export")
FILES = ("model.pt2", "model.onnx", "weights.safetensors", "model_card.json")


def card(workdir: Path) -> dict:
    return json.loads((workdir / EXPORT / "model_card.json").read_text())


def selected_val_accuracy(workdir: Path) -> float:
    """The validation accuracy train_epoch recorded for the epoch the selection chose."""
    selection = json.loads((workdir / "results/runs/base/selection/selection.json").read_text())
    metrics = json.loads((workdir / f"results/runs/base/epochs/{selection['epoch']}/metrics.json").read_text())
    return metrics["val_accuracy"]


def rffm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "RFFM_PLAIN_PROGRESS": "1"}
    return subprocess.run([str(BIN / "rffm"), *args], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.fixture
def workdir(exported_workdir: Path, tmp_path: Path) -> Path:
    """A private copy of the exported tiny workflow."""
    return copy_workdir(exported_workdir, tmp_path / "work")


def test_export_is_planned_after_qualification_in_the_default_target(fresh_workdir: Path):
    write_config(fresh_workdir, tiny_config(export=True))
    jobs = planned_jobs(fresh_workdir)
    assert "export[run=base]" in jobs
    assert "export[run=base]" not in planned_jobs(fresh_workdir, "validation_selection")  # never before the test result


def test_export_writes_checked_programs_and_a_model_card(exported_workdir: Path):
    body = card(exported_workdir)
    assert body["classes"] == ["BPSK", "QPSK", "16QAM", "GFSK"]
    assert body["input"]["length"] == 64 and body["input"]["name"] == "iq"
    manifest = json.loads((exported_workdir / "results/runs/base/qualification/run_manifest.json").read_text())
    assert body["backbone"]["fingerprint"] == manifest["backbone"]["fingerprint"]
    assert body["artifact"]["sha256"] == manifest["selection"]["artifact_sha256"]
    assert body["qualification"]["exposure_count"] == manifest["qualification"]["exposure_count"] == 1
    assert body["qualification"]["accuracy"] == manifest["qualification"]["accuracy"]
    check = body["validation_check"]
    assert check["split"] == "val" and check["examples"] == 32
    # the .pt2: identical labels and (same kernels, CPU) identical logits; ONNX Runtime: identical labels, logits within tolerance
    assert check["pt2"]["labels_identical"] == 32 and check["pt2"]["max_abs_logit_difference"] == 0.0
    assert check["onnx"]["labels_identical"] == 32
    head, backbone_half = check["onnx"]["head"], check["onnx"]["backbone"]
    assert head["logit_tolerance"]["factor"] == 10 and head["logit_tolerance"]["rtol"] < 1e-5 and head["tolerance_used"] <= 1.0
    assert backbone_half["state_tolerance"] == {"atol": 1e-5, "rtol": 1e-4} and backbone_half["tolerance_used"] <= 1.0
    assert check["rffm_accuracy"] == check["pt2"]["accuracy"] == check["onnx"]["accuracy"]
    assert check["selection_recorded_accuracy"] == selected_val_accuracy(exported_workdir) == check["rffm_accuracy"]
    assert check["rffm_matches_selection"] is True
    for name in FILES[:-1]:  # published create-only under their content address, read-only
        record = body["files"][name]
        stored = exported_workdir / "results" / record["key"]
        assert record["key"] == f"exports/sha256-{record['sha256']}{Path(name).suffix}"
        assert sha256_file(stored) == record["sha256"] == sha256_file(exported_workdir / EXPORT / name)
        assert not os.access(stored, os.W_OK) or os.geteuid() == 0
        assert stored.stat().st_mode & 0o777 == 0o444


def test_the_pt2_loads_in_a_fresh_interpreter_without_rffm(exported_workdir: Path, tmp_path: Path):
    """The program stands alone: torch only; importing rffm at all would fail in this interpreter."""
    val = exported_workdir / "results/datasets/tiny/val.h5"
    code = (
        "import sys; sys.modules['rffm'] = None\n"  # any `import rffm...` now raises ImportError
        "import json, h5py, torch\n"
        f"extra = {{'rffm_signature.json': ''}}\n"
        f"program = torch.export.load({str(exported_workdir / EXPORT / 'model.pt2')!r}, extra_files=extra).module()\n"
        f"iq = torch.from_numpy(h5py.File({str(val)!r}, 'r')['iq'][:5])\n"
        "print(json.dumps({'shape': list(program(iq).shape), 'batch1': list(program(iq[:1]).shape),\n"
        "  'classes': json.loads(extra['rffm_signature.json'])['classes'],\n"
        "  'rffm': sorted(m for m in sys.modules if m.startswith('rffm') and sys.modules[m] is not None)}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"shape": [5, 4], "batch1": [1, 4], "classes": ["BPSK", "QPSK", "16QAM", "GFSK"], "rffm": []}


def test_turning_the_export_off_plans_nothing_deletes_nothing_and_verifies_clean(workdir: Path):
    """runs.<run>.export is no rerun trigger: off, the plan is empty and the export folder stays (stale, listed by prune)."""
    before = {name: (workdir / EXPORT / name).read_bytes() for name in (*FILES, "sentinel.json")}
    write_config(workdir, tiny_config(export=False))
    assert planned_jobs(workdir) == []
    done = rffm("verify", "results", "--config", "config.yaml", cwd=workdir)
    assert done.returncode == 0, done.stdout
    listed = rffm("prune", "results", "--config", "config.yaml", "--by-config", cwd=workdir)  # the tree recorded it on
    assert listed.returncode == 0 and str(EXPORT) in listed.stdout, listed.stdout
    assert {name: (workdir / EXPORT / name).read_bytes() for name in before} == before
    write_config(workdir, tiny_config(export=True))
    assert planned_jobs(workdir) == []  # back on: the export on disk is the current one


def test_verify_covers_the_export_and_its_published_copies(workdir: Path):
    done = rffm("verify", "results", "--config", "config.yaml", cwd=workdir)
    assert done.returncode == 0, done.stdout
    stored = Path("results") / card(workdir)["files"]["model.onnx"]["key"]  # verify names files as it was given the tree
    (workdir / stored).chmod(0o644)
    (workdir / stored).write_bytes((workdir / stored).read_bytes() + b"\0")
    (workdir / EXPORT / "weights.safetensors").write_bytes(b"not weights")
    done = rffm("verify", "results", "--config", "config.yaml", cwd=workdir)
    assert done.returncode == 1
    assert f"BROKEN {stored}: its sha256 is not the one its name promises" in done.stdout
    assert f"BROKEN {workdir.resolve() / stored}: the published copy of the exported model.onnx differs" in done.stdout
    assert f"BROKEN {EXPORT / 'weights.safetensors'}: size 11 bytes, recorded" in done.stdout
    # every line names its fix; the published copy's, run as printed, publishes it again and rebuilds the export (issue 34)
    published = next(line for line in done.stdout.splitlines() if "the published copy of the exported model.onnx" in line)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    fixed = subprocess.run(["bash", "-c", published.split(" Fix: ", 1)[1]], cwd=workdir, env=env, capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    done = rffm("verify", "results", "--config", "config.yaml", cwd=workdir)
    assert done.returncode == 0 and "BROKEN" not in done.stdout, done.stdout


def test_touch_exports_nothing_and_a_forced_rerun_is_byte_identical(workdir: Path):
    # now, not a future time: the forced export writes after it, so its output is never older than its touched input
    now = time.time()
    for path in (workdir / "results").rglob("*"):
        if path.is_file():
            os.utime(path, (now, now))
    assert planned_jobs(workdir) == []
    before = {name: (workdir / EXPORT / name).read_bytes() for name in (*FILES, "sentinel.json")}
    exports = sorted(p.name for p in (workdir / "results/exports").iterdir())
    # another process, another absolute path (the copy): the same bytes, so the published copies are the same keys
    snakemake(workdir, "--forcerun", "export")
    assert {name: (workdir / EXPORT / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in (workdir / "results/exports").iterdir()) == exports


def test_two_clean_runs_export_the_same_bytes(exported_workdir: Path, tmp_path: Path):
    """A second run from nothing, in another directory, writes a byte-identical export (and published copies)."""
    other = tmp_path / "second"
    other.mkdir()
    (other / "config.yaml").write_text((exported_workdir / "config.yaml").read_text())
    snakemake(other)
    for name in (*FILES, "sentinel.json"):
        assert (other / EXPORT / name).read_bytes() == (exported_workdir / EXPORT / name).read_bytes(), name


def test_predict_on_the_val_split_reproduces_the_selected_val_accuracy(exported_workdir: Path, tmp_path: Path):
    out = tmp_path / "val.json"
    done = rffm("predict", str(EXPORT), "results/datasets/tiny/val.h5", "--out", str(out), "--top-k", "2", cwd=exported_workdir)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["windows"] == result["labelled"] == 32
    assert result["accuracy"] == selected_val_accuracy(exported_workdir)
    assert f"accuracy {result['accuracy']:.6f} on 32 labelled window(s)" in done.stdout
    first = result["rows"][0]
    assert first["where"] == "row 0" and first["label"] in result["classes"] and len(first["top"]) == 2
    assert first["top"][0][1] >= first["top"][1][1] and 0 < sum(p for _, p in first["top"]) <= 1 + 1e-6


def test_predict_refuses_the_test_split_unless_told(exported_workdir: Path):
    done = rffm("predict", str(EXPORT), "results/datasets/tiny/test.h5", cwd=exported_workdir)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "a staged test split; its reads belong to qualification" in done.stderr
    assert "Fix:" in done.stderr and "--i-know-this-is-test" in done.stderr
    done = rffm("predict", str(EXPORT / "model.pt2"), "results/datasets/tiny/test.h5", "--i-know-this-is-test", cwd=exported_workdir)
    assert done.returncode == 0, done.stderr
    assert len(list(csv.reader(done.stdout.splitlines()))) == 1 + 32


def test_predict_on_zero_windows_writes_only_the_header_without_calling_the_program(exported_workdir: Path, tmp_path: Path):
    """The .pt2 takes a batch of 1 or more (its card and the README say so); an input with no window never calls it."""
    empty = rfdata.write_canonical_hdf5(tmp_path / "empty.h5", np.zeros((0, 2, 64)), np.zeros(0), ["BPSK", "QPSK"])
    done = rffm("predict", str(EXPORT), str(empty), cwd=exported_workdir)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "index,where,label\n" and done.stderr == f"{empty}: 0 window(s) classified\n"
    program = torch.export.load(exported_workdir / EXPORT / "model.pt2").module()
    with pytest.raises(RuntimeError, match="0 elements"):  # what predict avoids: the tiny backbone cannot reshape no window
        program(torch.zeros(0, 2, 64))
    assert "batch >= 1" in card(exported_workdir)["input"]["layout"]


def test_predict_on_a_sigmf_recording(exported_workdir: Path, tmp_path: Path):
    """The project's SigMF fixture: windows of the model's length every stride samples; labelled windows get accuracy."""
    meta = rfdata.sigmf_recording(tmp_path / "capture", ["BPSK", "QPSK"], windows=4, window=64)
    total = (tmp_path / "capture.sigmf-data").stat().st_size // 8  # cf32_le: 8 bytes a sample
    result = predict(exported_workdir / EXPORT, meta, top_k=3, batch_size=5, stride=32)
    assert result["windows"] == (total - 64) // 32 + 1
    assert 0 < result["labelled"] < result["windows"]  # noise gaps between the bursts carry no label
    assert {row["label"] for row in result["rows"]} == {"BPSK", "QPSK", None}
    assert result["rows"][1]["where"] == "sample 32" and len(result["rows"][1]["top"]) == 3
    labelled = [row for row in result["rows"] if row["label"] is not None]
    assert result["accuracy"] == sum(row["top"][0][0] == row["label"] for row in labelled) / len(labelled)
    out = tmp_path / "capture.csv"
    done = rffm("predict", str(EXPORT), str(meta.with_suffix(".sigmf-data")), "--stride", "32", "--out", str(out), cwd=exported_workdir)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert len(rows) == result["windows"]
    assert [float(r["probability_1"]) for r in rows] == pytest.approx([r["top"][0][1] for r in result["rows"]], abs=1e-6)
    assert np.isclose(sum(r["label"] == r["class_1"] for r in rows if r["label"]) / result["labelled"], result["accuracy"])


def test_posttrain_hands_the_export_to_the_model_directory(exported_workdir: Path, tmp_path: Path):
    """Vertex AI: AIP_MODEL_DIR/export/ is the artifact URI a Model Registry upload names (profiles/README.md)."""
    from rffm.cloud.posttrain import copy_model_files

    run_dir = exported_workdir / "results/runs/base"
    written = copy_model_files(exported_workdir / "results", run_dir, tmp_path / "model", "final_qualification")
    assert sorted(p.name for p in (tmp_path / "model/export").iterdir()) == sorted(FILES)
    assert {p.relative_to(tmp_path / "model").as_posix() for p in written} >= {f"export/{name}" for name in FILES}
    for name in FILES:
        assert (tmp_path / "model/export" / name).read_bytes() == (run_dir / "export" / name).read_bytes()
    selection_only = copy_model_files(exported_workdir / "results", run_dir, tmp_path / "early", "validation_selection")
    assert not [p for p in selection_only if "export" in p.parts]
