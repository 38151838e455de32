"""Test-split discipline, integrity checks and config errors of the real workflow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO, WARM, snakemake, tiny_cnn, tiny_config, write_config
from inotify import FileWatch

pytestmark = pytest.mark.workflow
RUN = Path("results/runs/base")


def read_json(path: Path):
    return json.loads(path.read_text())


def test_no_rule_before_qualify_opens_the_test_split(fresh_workdir: Path):
    """validation_selection trains and chooses on val every run and every end-to-end reference (here `cnn`)."""
    config = tiny_config()
    config["references"] = {"cnn": tiny_cnn()}
    write_config(fresh_workdir, config)
    snakemake(fresh_workdir, "results/datasets/tiny/sentinel.json")
    watch = FileWatch(fresh_workdir / "results/datasets/tiny/test.h5")
    try:
        snakemake(fresh_workdir, "validation_selection")
        assert (fresh_workdir / RUN / "selection/selection.json").exists()
        assert (fresh_workdir / "results/runs/cnn/selection/selection.json").exists()
        assert watch.events() == 0, "a rule up to selection opened the test split"
        snakemake(fresh_workdir, "final_qualification")
        assert watch.events() > 0, "qualification must read the test split (the watch saw nothing)"
    finally:
        watch.close()


def test_qualifying_again_recalls_the_recorded_result_without_touching_test_data(workdir: Path):
    qualification = workdir / RUN / "qualification"
    first = {name: (qualification / name).read_bytes() for name in ("metrics.json", "accuracy_vs_snr.png", "run_manifest.json")}
    ledger = {p: p.read_bytes() for p in (workdir / "results/ledger").rglob("*.json")}
    assert len(ledger) == 1
    # Unreadable test data: qualify can only succeed if it never opens the split again.
    test_split = workdir / "results/datasets/tiny/test.h5"
    test_split.write_bytes(bytes(test_split.stat().st_size))
    snakemake(workdir, "--forcerun", "qualify")
    again = {name: (qualification / name).read_bytes() for name in first}
    assert again == first  # the recorded result writes the same files as the first evaluation
    assert read_json(qualification / "provenance.json")["recalled_from_ledger"].endswith(next(iter(ledger)).name)
    assert {p: p.read_bytes() for p in (workdir / "results/ledger").rglob("*.json")} == ledger


def test_an_infinite_lr_stops_before_any_job_and_never_spends_the_exposure(fresh_workdir: Path):
    """`lr: .inf` never trains (a run that diverges from a finite lr stops in train_epoch itself:
    tests/unit/test_train_epoch.py::test_a_diverged_epoch_stops_and_leaves_no_sentinel)."""
    config = tiny_config()
    config["runs"]["base"]["train"].update(lr=float("inf"), warmup_steps=0)
    write_config(fresh_workdir, config)
    result = snakemake(fresh_workdir, check=False)
    assert result.returncode != 0
    assert "runs.base.train.lr: .inf is not a finite number" in result.stdout + result.stderr
    assert not (fresh_workdir / "results").exists()


def test_manifest_reports_the_exposure_count_across_runs(workdir: Path):
    manifest = read_json(workdir / RUN / "qualification/run_manifest.json")
    assert manifest["qualification"]["exposure_count"] == 1
    config = tiny_config()
    config["runs"]["other"] = {**config["runs"]["base"], "train": {**config["runs"]["base"]["train"], "seed": 5}}
    write_config(workdir, config)
    snakemake(workdir)
    other = read_json(workdir / "results/runs/other/qualification/run_manifest.json")
    assert other["qualification"]["exposure_count"] == 2
    assert other["selection"]["artifact_sha256"] != manifest["selection"]["artifact_sha256"]


def test_manifest_carries_the_contract_keys(finished_workdir: Path):
    manifest = read_json(finished_workdir / RUN / "qualification/run_manifest.json")
    assert manifest["schema_version"] == 1 and manifest["run_id"] == "base"
    assert manifest["procedure"] == "final_qualification"
    assert set(manifest["dataset"]) >= {"source", "sentinel_sha256", "classes", "counts"}
    assert set(manifest["dataset"]["counts"]) == {"train", "val", "test"}
    assert set(manifest["backbone"]) >= {"source", "fingerprint"}
    assert [e["epoch"] for e in manifest["training"]["epochs"]] == [1, 2, 3]
    assert set(manifest["selection"]) >= {"epoch", "metric", "value", "artifact_sha256", "artifact_path"}
    assert (finished_workdir / "results" / manifest["selection"]["artifact_path"]).exists()  # in the results store
    assert set(manifest["qualification"]) >= {"accuracy", "macro_f1", "accuracy_by_snr", "accuracy_by_class", "exposure_count"}
    provenance = manifest["provenance"]
    assert set(provenance) >= {"source_revision", "dirty", "versions", "steps", "launch_profile"}
    assert set(provenance["steps"]) >= {"stage_dataset", "pretrain_backbone", "build_cache", "train_epoch", "select_checkpoint", "qualify"}
    assert all(step["executor"] == "local" for step in provenance["steps"].values())
    assert ".bf16" not in json.dumps(manifest) and "scratch" not in json.dumps(manifest)  # the cache is never listed


def flip_byte(path: Path) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def artifact_path(workdir: Path) -> str:
    return "results/" + read_json(workdir / RUN / "selection/selection.json")["artifact_path"]


CACHE = "results/caches/tiny__mini/sentinel.json"
CORRUPTIONS = {
    "staged split": (lambda w: "results/datasets/tiny/train.h5", CACHE, "build_cache/tiny__mini.log"),
    "backbone": (lambda w: "results/backbones/mini/backbone.pt", CACHE, "build_cache/tiny__mini.log"),
    "checkpoint": (lambda w: str(RUN / "epochs/2/checkpoint.pt"), str(RUN / "epochs/3/sentinel.json"), "train_epoch/base/3.log"),
    "artifact": (artifact_path, str(RUN / "qualification/run_manifest.json"), "qualify/base.log"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_flipped_byte_fails_verify_and_the_consuming_rule(workdir: Path, kind: str):
    relative, consumer_output, log = CORRUPTIONS[kind]
    target = relative(workdir)
    verify = subprocess.run([str(BIN / "rffm"), "verify", "results"], cwd=workdir, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout
    flip_byte(workdir / target)
    verify = subprocess.run([str(BIN / "rffm"), "verify", "results"], cwd=workdir, capture_output=True, text=True)
    assert verify.returncode == 1
    broken = [line for line in verify.stdout.splitlines() if line.startswith("BROKEN")]
    assert broken and all(Path(target).name in line for line in broken), verify.stdout
    result = snakemake(workdir, "--force", consumer_output, check=False)
    assert result.returncode != 0
    message = (workdir / "results/logs" / log).read_text()
    assert "refuses to start" in message and Path(target).name in message, message
    assert "Traceback" not in message


def test_a_flipped_byte_in_any_row_of_the_cache_is_caught_before_an_epoch_trains_on_it(workdir: Path):
    hidden = workdir / "scratch/tiny__mini/train.hidden.bf16"
    data = bytearray(hidden.read_bytes())
    data[len(data) // 3 + 7] ^= 0x01  # one bit in the middle of a row no sample would have picked
    hidden.write_bytes(bytes(data))
    verify = subprocess.run([str(BIN / "rffm"), "verify", "--config", "config.yaml"], cwd=workdir, capture_output=True, text=True)
    assert verify.returncode == 1 and "BROKEN scratch/tiny__mini/train.hidden.bf16" in verify.stdout, verify.stdout
    shutil.rmtree(workdir / "results/memo")  # nothing kept: the epoch has to train, so it reads the cache
    result = snakemake(workdir, "--forcerun", "train_epoch", "validation_selection", check=False)
    assert result.returncode != 0
    message = (workdir / "results/logs/train_epoch/base/1.log").read_text()
    assert "refuses to start" in message and "train.hidden.bf16" in message and "Traceback" not in message


BAD_CONFIGS = {
    "unknown key": (lambda c: c["runs"]["base"]["train"].update(colour="red"), "runs.base.train: unknown key(s) 'colour'"),
    "wrong type": (lambda c: c["runs"]["base"]["train"].update(lr="fast"), "runs.base.train.lr: 'fast' is not of type 'number'"),
    "negative epochs": (lambda c: c["runs"]["base"]["train"].update(epochs=-2), "runs.base.train.epochs: -2 is less than the minimum of 1"),
    "missing dataset": (lambda c: c["runs"]["base"].update(dataset="nope"), "runs.base.dataset: 'nope' is not defined under datasets"),
}


@pytest.mark.parametrize("kind", sorted(BAD_CONFIGS))
def test_a_malformed_config_fails_before_any_job_naming_the_key(fresh_workdir: Path, kind: str):
    change, expected = BAD_CONFIGS[kind]
    config = tiny_config()
    change(config)
    write_config(fresh_workdir, config)
    result = snakemake(fresh_workdir, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert expected in output, output
    assert "Traceback" not in output
    assert not (fresh_workdir / "results").exists()


# What a user exports before a containerized run (profiles/README.md): the worker image, pinned by digest.
EXAMPLE_WORKER_IMAGE = "us-central1-docker.pkg.dev/my-project/rffm/worker@sha256:" + "0" * 64


def test_workflow_is_lint_and_format_clean():
    environ = {**os.environ, "RFFM_WORKER_IMAGE": EXAMPLE_WORKER_IMAGE}
    lint = WARM.run_any([str(BIN / "snakemake"), "--lint"], REPO, environ)
    assert lint.returncode == 0 and "Lints for" not in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    fmt = subprocess.run([str(BIN / "snakefmt"), "--check", "workflow"], cwd=REPO, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
