"""scripts/gpu_check.sh, the one command that measures the CUDA cache path (P1, P3) on a GPU machine, run in its CPU
mode at tiny size (RFFM_GPU_CHECK_DEVICE=cpu): the bench, the tiny workflow from config/examples/tiny.yaml, its verify
and the device its cache and qualification recorded (issue 37)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.workflow


def test_the_gpu_check_runs_on_the_current_tree_in_its_cpu_mode(tmp_path: Path):
    """Also the test of `rffm bench cache`, which the script runs first: its figures as a JSON last line, its data
    cleaned up (the script's and the bench's temporary folders are under TMPDIR)."""
    env = {**os.environ, "RFFM_GPU_CHECK_DEVICE": "cpu", "PYTHON": sys.executable, "RFFM_PLAIN_PROGRESS": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run(["bash", str(REPO / "scripts/gpu_check.sh")], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    figures = json.loads(lines[-1])  # the bench's JSON, last
    assert figures["detail"]["device"] == "cpu"
    assert {"P1", "P2", "P3", "P5", "P6", "P7", "rss_1x_mb", "rss_4x_mb"} <= set(figures)
    assert all(figures[key] > 0 for key in ("P1", "P2", "P3", "P6", "P7", "rss_1x_mb", "rss_4x_mb"))  # P6, P7: tail adaptation
    assert figures["detail"]["oom_probes_unseeded"] > 0
    # what torch (its compile cache) and ONNX Runtime (its session id and debug log, libonnxruntime's) keep in TMPDIR
    theirs = ("torchinductor_", "mat-debug-", ".ses")
    left = [path.name for path in tmp_path.iterdir() if not path.name.startswith(theirs)]
    assert left == []  # the bench's data and the script's tiny run are cleaned up
    assert "0 problem(s)" in done.stdout  # rffm verify on the tiny run it made
    assert "results/runs/base/qualification/provenance.json: device cpu" in done.stdout
    assert "results/caches/tiny__mini/provenance.json: device cpu" in done.stdout
    assert "pt2 max |logit difference| 0.0" in done.stdout  # issue 48: the CPU mode runs the export and its check too


def test_the_gpu_check_refuses_an_unknown_device_in_one_line():
    env = {**os.environ, "RFFM_GPU_CHECK_DEVICE": "tpu", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(REPO / "scripts/gpu_check.sh")], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().endswith("Fix: set RFFM_GPU_CHECK_DEVICE=cuda (the default) or cpu."), done.stderr
