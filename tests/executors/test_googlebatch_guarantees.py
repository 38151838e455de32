"""The workflow's guarantees on Google Batch (fake Batch API + GCS emulator): a spot preemption resumes
exactly, raising `epochs` runs only the new epochs, and two runs sharing a cache ask for one GPU and
one local SSD per VM.

One chain of runs in one bucket, on the real profile with two runs (`base`, the tiny run, and `other`)
that share the tiny dataset, backbone and cache:
1. `validation_selection` with Batch retries on; the fake preempts the `base` epochs job once epoch 2's
   sentinel is in the bucket, and Batch (the fake) retries the task on a new VM;
2. `base`'s epochs raised 3 -> 5, `validation_selection` again.
The uninterrupted reference is the local tiny run (conftest's finished_workdir): on the CPU every
result is bit-identical wherever it ran.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from batch_support import (
    FAST,
    bucket_objects,
    create_bucket,
    gcs_emulator,
    instance,
    make_checkout,
    output,
    profile_env,
    run_fake_batch,
    task_spec,
    write_checkout_config,
)

from conftest import tiny_config
from rffm.records.files import read_json

BUCKET = "rffm-guarantees"
RESULTS = "rffm/results"
PREEMPTION_EXIT_CODE = 50001
GPU_RULES = ("pretrain_backbone", "build_cache", "train_epoch", "qualify")


def two_runs(epochs: int = 3) -> dict:
    """The tiny config plus run `other` on the same dataset and backbone (so the cache build is its own job)."""
    config = tiny_config()
    config["runs"]["base"]["train"]["epochs"] = epochs
    other = {"dataset": "tiny", "backbone": "mini", "train": {"epochs": 3, "lr": 0.01, "batch_size": 16, "seed": 1}, "export": False}
    config["runs"]["other"] = other  # neither run exported: the export on this executor is its end-to-end test's
    config["cache"]["colocate"] = "per-run"  # a group job per run (tests/executors/test_colocation.py: per-cache)
    return config


def targets(job: dict) -> list[str]:
    """The Snakemake jobs a Batch job runs (its worker's --target-jobs), sorted."""
    script = task_spec(job)["runnables"][0]["script"]["text"]
    [listed] = re.findall(r"--target-jobs ((?:'[^']*' ?)+)", script)
    return sorted(re.findall(r"'([^']*)'", listed))


def jobs_by_group(report: dict) -> dict[str, dict]:
    """Batch jobs by their job id without the random suffix (a group job: train-<run>-...)."""
    return {job["job_id"].rsplit("-", 1)[0]: job for job in report["jobs"]}


def read_object(emulator: str, name: str) -> dict:
    return json.loads(bucket_objects(emulator, BUCKET)[f"{RESULTS}/{name}"].download_as_text())


def snapshot(emulator: str, prefix: str) -> dict[str, tuple[str, int]]:
    """name -> (md5 of the bytes, object generation) of every object under a prefix."""
    return {name: (blob.md5_hash, blob.generation) for name, blob in bucket_objects(emulator, BUCKET).items() if name.startswith(prefix)}


@pytest.fixture(scope="module")
def emulator():
    with gcs_emulator() as url:
        yield url


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return make_checkout(tmp_path_factory.mktemp("checkout"), two_runs())


@pytest.fixture(scope="module")
def preempted(checkout, emulator, tmp_path_factory) -> dict:
    """Step 1: both runs to selection; the `base` epochs job is preempted once epoch 2 is in the bucket."""
    create_bucket(emulator, BUCKET)
    # a group job's outputs reach the bucket when the whole group is done; what an epoch writes to the bucket
    # at once is its memo entry (files first, the sentinel last)
    epoch2 = {"stage": "train_epoch", "key": {"run": "base", "epoch": 2}}
    memo = rf"{RESULTS}/memo/train_epoch/[0-9a-f]{{64}}/sentinel\.json"
    preempt = [{"job": "^train-base-", "bucket": BUCKET, "object": memo, "json": epoch2}]
    result, report = run_fake_batch(
        checkout, tmp_path_factory.mktemp("preempted"), emulator, "--profile", "profiles/gcp-batch", *FAST,
        "--rffm-googlebatch-retry-count", "1", "validation_selection",
        env={**profile_env(BUCKET), "FAKE_BATCH_PREEMPT": json.dumps(preempt)},
    )  # fmt: skip
    assert result.returncode == 0, output(result)
    return {"report": report, "jobs": jobs_by_group(report), "epochs": snapshot(emulator, f"{RESULTS}/runs/base/epochs/")}


@pytest.fixture(scope="module")
def raised(preempted, checkout, emulator, tmp_path_factory) -> dict:
    """Step 2: `base` trained to 5 epochs instead of 3 (its first three epochs are in the bucket)."""
    write_checkout_config(checkout, two_runs(epochs=5))
    result, report = run_fake_batch(
        checkout,
        tmp_path_factory.mktemp("raised"),
        emulator,
        "--profile",
        "profiles/gcp-batch",
        *FAST,
        "validation_selection",
        env=profile_env(BUCKET),
    )
    assert result.returncode == 0, output(result)
    return {"report": report, "jobs": jobs_by_group(report), "epochs": snapshot(emulator, f"{RESULTS}/runs/base/epochs/")}


@pytest.fixture(scope="module")
def qualified(raised, checkout, emulator, tmp_path_factory) -> dict:
    """Step 3: both runs qualified; `tree` is a copy of the bucket's results (what `gcloud storage rsync` gives)."""
    state = tmp_path_factory.mktemp("qualified")
    result, report = run_fake_batch(checkout, state, emulator, "--profile", "profiles/gcp-batch", *FAST, env=profile_env(BUCKET))
    assert result.returncode == 0, output(result)
    tree = tmp_path_factory.mktemp("bucket-copy")
    for name, blob in bucket_objects(emulator, BUCKET).items():
        if name.startswith(f"{RESULTS}/"):
            path = tree / "results" / name.removeprefix(f"{RESULTS}/")
            path.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(path)
    return {"report": report, "tree": tree}


# ---- a preempted epochs job: Batch retries it, completed epochs are restored, the artifact is the same ----


def test_a_preempted_epochs_job_is_retried_by_batch_not_resubmitted(preempted):
    jobs = preempted["jobs"]
    names = sorted(job["job_id"].rsplit("-", 1)[0] for job in preempted["report"]["jobs"])
    assert names == sorted(["stage-dataset", "pretrain-backbone", "cache-tiny-mini-build-cache", "train-base-train-epoch",
                            "train-other-train-epoch", "select-checkpoint", "select-checkpoint"])  # fmt: skip
    base = jobs["train-base-train-epoch"]
    assert task_spec(base)["max_retry_count"] == 1
    first, retry = base["attempts"]
    assert (first["preempted"], first["exit_code"]) == (True, PREEMPTION_EXIT_CODE)
    assert (retry["preempted"], retry["exit_code"]) == (False, 0) and base["state"] == "SUCCEEDED"
    assert retry["sandbox"] != first["sandbox"], "a retried task runs on a new VM"
    assert all(len(job["attempts"]) == 1 for name, job in preempted["jobs"].items() if name != "train-base-train-epoch")


def test_the_retry_restores_epochs_1_and_2_and_trains_epoch_3_only(preempted, emulator):
    memo = f"gs://{BUCKET}/{RESULTS}/memo/train_epoch/"
    for epoch in (1, 2):
        record = read_object(emulator, f"runs/base/epochs/{epoch}/provenance.json")
        assert record["restored_from"].startswith(memo), record
        assert record["provider"]["BATCH_TASK_RETRY_ATTEMPT"] == "1"
        assert record["computed_by"]["provider"]["BATCH_TASK_RETRY_ATTEMPT"] == "0", "computed by the preempted attempt"
    third = read_object(emulator, "runs/base/epochs/3/provenance.json")
    assert "restored_from" not in third and third["provider"]["BATCH_TASK_RETRY_ATTEMPT"] == "1"
    assert third["cache_build"], "the new VM built the cache (its local SSD was empty)"
    logs = {e: bucket_objects(emulator, BUCKET)[f"{RESULTS}/logs/train_epoch/base/{e}.log"].download_as_text() for e in (1, 2, 3)}
    assert ["restored from" in logs[e] for e in (1, 2, 3)] == [True, True, False], logs


def test_the_restored_epochs_are_listed_by_the_manifest_and_rffm_status(preempted, qualified, emulator):
    """Issue 23: epochs 1-2 of the preempted run were restored on the retry's VM, not trained there: the manifest
    names each one's memo entry and the job that trained it; `rffm status` shows them in its `restored` column."""
    from rffm.ops import status

    base = preempted["jobs"]["train-base-train-epoch"]
    restored = read_object(emulator, "runs/base/qualification/run_manifest.json")["provenance"]["restored_epochs"]
    assert [item["epoch"] for item in restored] == [1, 2], restored
    for item in restored:
        assert item["memo_entry"].startswith(f"gs://{BUCKET}/{RESULTS}/memo/train_epoch/")
        assert item["trained_by"]["executor"] == "googlebatch" and item["trained_by"]["host"], item
    computed = [read_object(emulator, f"runs/base/epochs/{e}/provenance.json")["computed_by"] for e in (1, 2)]
    assert [item["trained_by"]["job_id"] for item in restored] == [c["job_id"] for c in computed], "the preempted attempt's job"
    assert base["attempts"][0]["preempted"]
    assert read_object(emulator, "runs/other/qualification/run_manifest.json")["provenance"]["restored_epochs"] == []
    rows = {row["run"]: row for row in status.collect(qualified["tree"] / "results")}
    assert (rows["base"]["restored_epochs"], rows["other"]["restored_epochs"]) == ([1, 2], [])
    assert "restored" in status.render(list(rows.values())).splitlines()[0]


def test_the_preempted_run_selects_the_uninterrupted_artifact(preempted, emulator, finished_workdir: Path):
    selection = read_object(emulator, "runs/base/selection/selection.json")
    reference = read_json(finished_workdir / "results/runs/base/selection/selection.json")
    assert selection["artifact_sha256"] == reference["artifact_sha256"]
    objects = bucket_objects(emulator, BUCKET)
    artifact = objects[f"{RESULTS}/{selection['artifact_path']}"].download_as_bytes()
    assert artifact == (finished_workdir / "results" / reference["artifact_path"]).read_bytes()
    checkpoint = objects[f"{RESULTS}/runs/base/epochs/3/checkpoint.pt"].download_as_bytes()
    assert checkpoint == (finished_workdir / "results/runs/base/epochs/3/checkpoint.pt").read_bytes()


# ---- two runs sharing a cache: one GPU and one local SSD per VM, never summed over a group ----


def test_every_gpu_vm_asks_for_one_l4_and_one_local_ssd(preempted, raised):
    jobs = preempted["report"]["jobs"] + raised["report"]["jobs"]
    groups = {job["job_id"].rsplit("-", 1)[0]: targets(job) for job in jobs}
    assert groups["cache-tiny-mini-build-cache"] == ["build_cache:dataset=tiny,backbone=mini"]  # read by two runs: its own job
    assert groups["train-other-train-epoch"] == [f"train_epoch:run=other,epoch={e}" for e in (1, 2, 3)]
    for job in jobs:
        policy, rules = instance(job)["policy"], {target.split(":")[0] for target in targets(job)}
        env = task_spec(job)["runnables"][-1].get("environment", {}).get("variables", {})  # the container's
        if rules & set(GPU_RULES):
            assert [(a["type_"], a["count"]) for a in policy["accelerators"]] == [("nvidia-l4", "1")], job["job_id"]
            assert env["RFFM_GPUS_REQUESTED"] == "1"
        else:
            assert policy["accelerators"] == [] and "RFFM_GPUS_REQUESTED" not in env
        ssd = [d["new_disk"]["size_gb"] for d in policy["disks"]]
        assert ssd == (["375"] if rules & {"build_cache", "train_epoch"} else []), (job["job_id"], ssd)


# ---- raising epochs: exactly the new epochs and the selection run; earlier epochs stay untouched ----


def test_raising_epochs_submits_exactly_the_new_epochs_and_the_selection(raised):
    assert {name: targets(job) for name, job in raised["jobs"].items()} == {
        "train-base-train-epoch": ["train_epoch:run=base,epoch=4", "train_epoch:run=base,epoch=5"],
        "select-checkpoint": ["select_checkpoint:run=base"],
    }
    assert all(job["state"] == "SUCCEEDED" for job in raised["report"]["jobs"])


def test_raising_epochs_trains_the_new_ones_and_leaves_earlier_checkpoints_alone(preempted, raised, emulator):
    for epoch in (4, 5):
        assert "restored_from" not in read_object(emulator, f"runs/base/epochs/{epoch}/provenance.json")
    assert read_object(emulator, "runs/base/epochs/4/provenance.json")["cache_build"], "a new VM: the cache was rebuilt"
    before = preempted["epochs"]  # epochs 1-3: (md5, generation) of every object before the raise
    assert len(before) == 12, sorted(before)
    assert {name: kept for name, kept in raised["epochs"].items() if name in before} == before, "an earlier epoch's object was rewritten"
    selection = read_object(emulator, "runs/base/selection/selection.json")
    assert [c["epoch"] for c in selection["candidates"]] == [1, 2, 3, 4, 5]


# ---- a GPU VM whose container cannot see the GPU: the GPU step refuses instead of training on the CPU ----


def test_a_gpu_step_refuses_when_the_vm_gave_a_gpu_the_container_cannot_see(emulator, tmp_path_factory):
    """FAKE_BATCH_GPUS=invisible: the container is told it has an L4 (RFFM_GPUS_REQUESTED) but torch sees none."""
    checkout = make_checkout(tmp_path_factory.mktemp("invisible-checkout"))
    create_bucket(emulator, "rffm-invisible")
    state = tmp_path_factory.mktemp("invisible")
    result, report = run_fake_batch(
        checkout, state, emulator, "--profile", "profiles/gcp-batch", *FAST, "validation_selection",
        env={**profile_env("rffm-invisible"), "FAKE_BATCH_GPUS": "invisible"},
    )  # fmt: skip
    assert result.returncode != 0, output(result)
    states = {job["job_id"].rsplit("-", 1)[0]: job["state"] for job in report["jobs"]}
    assert states == {"stage-dataset": "SUCCEEDED", "pretrain-backbone": "FAILED"}, states
    objects = bucket_objects(emulator, "rffm-invisible")
    log = objects["rffm/results/logs/pretrain_backbone/mini.log"].download_as_text()  # the step's log, in the bucket
    assert "this job was given a GPU (RFFM_GPUS_REQUESTED=1) but torch sees none" in log, log[-3000:]
    assert not [name for name in objects if "/backbones/" in name], "a CPU-trained backbone was kept"
