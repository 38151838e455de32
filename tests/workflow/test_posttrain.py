"""`rffm posttrain`: the whole workflow in one process, resumable after SIGKILL, exporting to the AIP_* directories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import BIN, TINY, sigkill_once_started, tiny_config
from rffm.cloud.posttrain import storage_path
from rffm.records.files import read_json, sha256_file

RUN = Path("results/runs/base")


def posttrain_command(workdir: Path) -> list[str]:
    """The job's command on the tiny config (its export off: the export's hand-over to AIP_MODEL_DIR is
    tests/workflow/test_export_workflow.py's test_posttrain_hands_the_export_to_the_model_directory)."""
    config = workdir.parent / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config(), sort_keys=False))
    cache = str(workdir / "cache")
    return [str(BIN / "rffm"), "posttrain", "--config", str(config), "--hidden-state-cache-directory", cache, "--cores", "2"]


def posttrain_env(**aip: Path | str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIP_", "RFFM_"))}
    return {**env, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RFFM_PLAIN_PROGRESS": "1", **{k: str(v) for k, v in aip.items()}}


def posttrain(workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(posttrain_command(workdir), cwd=workdir, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"rffm posttrain failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def memo_epochs(root: Path) -> dict[int, Path]:
    """The kept epochs under a memo store root (memo/train_epoch/<identity>/), by epoch number."""
    found = {}
    for sentinel in (root / "memo/train_epoch").glob("*/sentinel.json"):
        found[json.loads(sentinel.read_text())["key"]["epoch"]] = sentinel.parent
    return found


def selected_sha256(workdir: Path) -> str:
    return read_json(workdir / RUN / "selection/selection.json")["artifact_sha256"]


def test_storage_paths_map_gs_uris_to_the_fuse_mount():
    assert storage_path("gs://bucket/job/model/", "AIP_MODEL_DIR", {}) == Path("/gcs/bucket/job/model")
    assert storage_path("gs://b/x", "AIP_MODEL_DIR", {"RFFM_GCS_MOUNT": "/mnt/gcs"}) == Path("/mnt/gcs/b/x")
    assert storage_path("/local/dir", "AIP_MODEL_DIR", {}) == Path("/local/dir")
    assert storage_path(None, "AIP_MODEL_DIR", {}) is None
    with pytest.raises(Exception, match="AIP_CHECKPOINT_DIR=s3://b/x: only local paths and gs://"):
        storage_path("s3://b/x", "AIP_CHECKPOINT_DIR", {})


def test_a_bad_config_is_one_clear_error(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.read_text().replace("epochs: 3", "epochs: 0"))
    for config, expected in ((tmp_path / "missing.yaml", "no such file"), (bad, "runs.base.train.epochs: 0 is less than the minimum of 1")):
        result = subprocess.run(
            [str(BIN / "rffm"), "posttrain", "--config", str(config), "--hidden-state-cache-directory", str(tmp_path / "c")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.workflow
def test_killed_mid_epoch_and_relaunched_gives_the_uninterrupted_artifact(tmp_path: Path, finished_workdir: Path):
    workdir = tmp_path / "job"
    workdir.mkdir()
    env = posttrain_env(AIP_MODEL_DIR=tmp_path / "model", AIP_CHECKPOINT_DIR=tmp_path / "checkpoints")
    sigkill_once_started(posttrain_command(workdir), workdir, env, workdir / "results/logs/train_epoch/base/2.log")
    assert not (workdir / RUN / "epochs/2/sentinel.json").exists(), "epoch 2 finished before the kill; the test did not interrupt it"
    assert 1 in memo_epochs(tmp_path / "checkpoints") and not (tmp_path / "model").exists()
    epoch1 = (workdir / RUN / "epochs/1/provenance.json").read_bytes()

    result = posttrain(workdir, env)  # the same command line again
    assert "removed the lock of a killed run" in result.stdout
    assert (workdir / RUN / "epochs/1/provenance.json").read_bytes() == epoch1, "epoch 1 ran again instead of being resumed"
    sha = selected_sha256(workdir)
    assert sha == selected_sha256(finished_workdir)
    model = tmp_path / "model"
    assert sha256_file(model / f"sha256-{sha}.pt") == sha
    assert read_json(model / "model_card.json")["artifact_sha256"] == sha
    assert read_json(model / "run_manifest.json")["selection"]["artifact_sha256"] == sha
    kept = memo_epochs(tmp_path / "checkpoints")
    for epoch in (1, 2, 3):
        for name in ("checkpoint.pt", "sentinel.json"):
            assert (kept[epoch] / name).read_bytes() == (workdir / RUN / f"epochs/{epoch}" / name).read_bytes()


@pytest.mark.workflow
def test_a_relaunch_on_a_fresh_machine_restores_completed_epochs(tmp_path: Path, finished_workdir: Path):
    """Preemption on Vertex AI: results and scratch are gone, AIP_CHECKPOINT_DIR (a gs:// URI) keeps epochs 1-2."""
    bucket = tmp_path / "gcs"
    for epoch, entry in memo_epochs(finished_workdir / "results").items():
        if epoch <= 2:  # what a preempted job had kept
            shutil.copytree(entry, bucket / "b/job/checkpoints/memo/train_epoch" / entry.name)
    workdir = tmp_path / "job"
    workdir.mkdir()
    env = posttrain_env(AIP_MODEL_DIR="gs://b/job/model", AIP_CHECKPOINT_DIR="gs://b/job/checkpoints", RFFM_GCS_MOUNT=bucket)
    posttrain(workdir, env)
    logs = {e: (workdir / f"results/logs/train_epoch/base/{e}.log").read_text() for e in (1, 2, 3)}
    assert "restored from" in logs[1] and "restored from" in logs[2] and "restored from" not in logs[3]
    restored = read_json(workdir / RUN / "epochs/2/provenance.json")["restored_from"]
    assert restored == str(bucket / "b/job/checkpoints/memo/train_epoch" / memo_epochs(finished_workdir / "results")[2].name)
    sha = selected_sha256(workdir)
    assert sha == selected_sha256(finished_workdir)
    assert sha256_file(bucket / f"b/job/model/sha256-{sha}.pt") == sha
    assert 3 in memo_epochs(bucket / "b/job/checkpoints")
