"""Provider identity in each step's provenance: executor, job id, host, device, GPUs, container image; sealed and linked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rffm.errors import IntegrityError
from rffm.records import provenance

CLEAR = ("RFFM_EXECUTOR", "SLURM_JOB_ID", "BATCH_JOB_ID", "CLOUD_ML_JOB_ID", *provenance.CONTAINER_VARS)


def clean(monkeypatch) -> None:
    for name in CLEAR:
        monkeypatch.delenv(name, raising=False)


def test_a_slurm_step_records_its_job_and_partition(monkeypatch):
    clean(monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "gpu")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node17")
    monkeypatch.setenv("APPTAINER_CONTAINER", "/images/rffm.sif")
    record = provenance.describe("train_epoch", provenance.start())
    assert record["executor"] == "slurm" and record["job_id"] == "4242"
    assert record["provider"] == {"SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_NODELIST": "node17"}
    assert record["image"] == "/images/rffm.sif"


def test_a_local_step_without_container(monkeypatch):
    clean(monkeypatch)
    record = provenance.describe("stage_dataset", provenance.start())
    assert (record["executor"], record["job_id"], record["image"], record["provider"]) == ("local", None, None, {})
    assert record["device"].startswith("cpu")


def test_provenance_is_sealed_and_belongs_to_its_sentinel(tmp_path: Path):
    sentinel = tmp_path / "sentinel.json"
    sentinel.write_bytes(b'{"the": "sentinel"}')
    record = provenance.describe("stage_dataset", provenance.start())
    provenance.write(tmp_path / "provenance.json", record, sentinel.read_bytes())
    assert provenance.read(tmp_path / "provenance.json", sentinel)["host"] == record["host"]
    body = json.loads((tmp_path / "provenance.json").read_text())
    (tmp_path / "edited.json").write_text(json.dumps({**body, "host": "elsewhere"}))
    with pytest.raises(IntegrityError, match="does not match its own sha256"):
        provenance.read(tmp_path / "edited.json")
    sentinel.write_bytes(b'{"another": "run"}')
    with pytest.raises(IntegrityError, match="another run of the step"):
        provenance.read(tmp_path / "provenance.json", sentinel)


def test_gpu_models_come_from_nvidia_smi(tmp_path: Path, monkeypatch):
    """nvidia-smi is the boundary: a stand-in prints what `--query-gpu=name --format=csv,noheader` prints on a 2-GPU node."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\n[ "$1 $2" = "--query-gpu=name --format=csv,noheader" ] || exit 9\n'
        'printf "NVIDIA H100 80GB HBM3\\nNVIDIA H100 80GB HBM3\\n"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert provenance.visible_gpus() == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert provenance.visible_gpus() == []
