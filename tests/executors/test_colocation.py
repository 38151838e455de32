"""Co-location by cache on Google Batch (issues 36, 47; fake Batch API + GCS emulator, the real profile).

A grid of five runs on one (dataset, backbone) cache (conftest.grid_config). With `cache.colocate: per-cache`
(the default) the plan is one group job — one VM — that builds the cache once and trains every epoch of the five
runs; with cache.runs_per_group 2, three group jobs (the build with two runs, then two runs, then one, each of the
later two building its own copy); `per-run` plans a group job per run and the cache's own job. The real run
(runs_per_group 2, its first VM preempted) has artifacts byte-identical to the local run of the grid
(conftest.grid_tree: locally there are no groups, so it stands for every mode); the per-run groups run for real in
test_googlebatch_guarantees.py.
"""

from __future__ import annotations

import hashlib
import json
import os
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
from test_googlebatch_guarantees import PREEMPTION_EXIT_CODE, targets

from conftest import BIN, JOB_HEADER, WARM, WILDCARDS, artifact_digests, grid_config

BUCKET = "rffm-colocation"
RESULTS = "rffm/results"
EPOCHS = {"base": 3, "second": 2, "third": 2, "fourth": 1, "fifth": 1}
GROUP_HEADER = re.compile(r"Group job (\S+) \(")


def epochs_of(run: str) -> list[str]:
    return [f"train_epoch[run={run}, epoch={e}]" for e in range(1, EPOCHS[run] + 1)]


def group_jobs(dry_run: str) -> dict[str, list[str]]:
    """group -> its member jobs (sorted 'rule[wildcards]'), from a dry run's output."""
    groups: dict[str, list[str]] = {}
    group = None
    for line in dry_run.splitlines():
        if match := GROUP_HEADER.search(line):
            group = groups.setdefault(match.group(1), [])
        elif (match := JOB_HEADER.match(line)) and group is not None:
            if not line.startswith((" ", "\t")):  # a job outside the group ends it
                group = None
            else:
                group.append(match.group(1))
        elif group and (match := WILDCARDS.match(line)) and "[" not in group[-1]:
            group[-1] += f"[{match.group(1)}]"
    return {name: sorted(members) for name, members in groups.items()}


@pytest.fixture(scope="module")
def emulator():
    with gcs_emulator() as url:
        yield url


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return make_checkout(tmp_path_factory.mktemp("checkout"), grid_config(runs=5))


def dry_run(checkout: Path, emulator: str, colocate: str, runs_per_group: int | None = None) -> str:
    """`snakemake --profile profiles/gcp-batch -n validation_selection` as a user types it (the plan's notes need the
    command line), with cache.colocate (and cache.runs_per_group) set."""
    config = grid_config(colocate, runs=5)
    if runs_per_group:
        config["cache"]["runs_per_group"] = runs_per_group
    write_checkout_config(checkout, config)
    environ = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "STORAGE_EMULATOR_HOST": emulator, **profile_env(BUCKET)}
    command = [str(BIN / "snakemake"), "--profile", "profiles/gcp-batch", "-n", "validation_selection"]
    result = WARM.run_any(command, checkout, environ)
    assert result.returncode == 0, output(result)
    return result.stdout + result.stderr


def test_per_cache_plans_one_group_job_and_per_run_todays_groups(checkout, emulator):
    create_bucket(emulator, BUCKET)
    per_cache = dry_run(checkout, emulator, "per-cache")
    every_epoch = [job for run in EPOCHS for job in epochs_of(run)]
    assert group_jobs(per_cache) == {"cache_tiny__mini": sorted(["build_cache[dataset=tiny, backbone=mini]", *every_epoch])}
    assert "note: plan: cache tiny__mini: 1 cache build, 5 runs, 9 epochs in one group job holding 1 GPU (nvidia_gpu: one " \
        "nvidia-l4 per VM) (cache_tiny__mini: one VM or node; cache.colocate: per-cache)" in per_cache  # fmt: skip
    per_run = dry_run(checkout, emulator, "per-run")
    assert group_jobs(per_run) == {
        "cache_tiny__mini": ["build_cache[dataset=tiny, backbone=mini]"],
        **{f"train_{run}": epochs_of(run) for run in EPOCHS},
    }
    assert "note: plan: cache tiny__mini: 6 cache builds (its own job and one on each run's node), 5 runs, 9 epochs in 5 group " \
        "jobs, each holding 1 GPU (nvidia_gpu: one nvidia-l4 per VM) (cache.colocate: per-run)" in per_run  # fmt: skip


def test_a_group_holds_at_most_runs_per_group_runs(checkout, emulator):
    """Issue 47: per-cache with cache.runs_per_group 2, the five runs are three group jobs: the cache's build with the
    first two runs' epochs, the next two runs' epochs (one job, though they share no job: planning.keep_parts_whole)
    and the fifth's (each of the later two building its own copy on its VM)."""
    create_bucket(emulator, BUCKET)
    plan = dry_run(checkout, emulator, "per-cache", runs_per_group=2)
    assert sorted(GROUP_HEADER.findall(plan)) == ["cache_tiny__mini", "cache_tiny__mini__part2", "cache_tiny__mini__part3"]
    assert group_jobs(plan) == {
        "cache_tiny__mini": sorted(["build_cache[dataset=tiny, backbone=mini]", *epochs_of("base"), *epochs_of("second")]),
        "cache_tiny__mini__part2": sorted([*epochs_of("third"), *epochs_of("fourth")]),
        "cache_tiny__mini__part3": epochs_of("fifth"),
    }
    assert "note: plan: cache tiny__mini: 3 cache builds, 5 runs, 9 epochs in 3 group jobs of at most 2 runs, each holding " \
        "at most 1 GPU (nvidia_gpu: one nvidia-l4 per VM) (cache.runs_per_group: 2; " in plan  # fmt: skip


FIRST, PARTS = ("base", "second"), (("third", "fourth"), ("fifth",))  # the runs of the 3 group jobs at runs_per_group 2


@pytest.fixture(scope="module")
def preempted_grid(checkout, emulator, tmp_path_factory) -> dict:
    """The real run (per-cache, cache.runs_per_group 2) of the 5-run grid to its selections, with Batch retries on: three
    group jobs, the cache's build with base's and second's epochs, third's and fourth's, then fifth's; the fake preempts
    the first group's VM once `base`'s epoch 2 is in the bucket's memo, and Batch (the fake) retries the task on a new VM."""
    create_bucket(emulator, BUCKET)
    config = grid_config(runs=5)
    config["cache"]["runs_per_group"] = 2
    write_checkout_config(checkout, config)
    epoch2 = {"stage": "train_epoch", "key": {"run": "base", "epoch": 2}}
    memo = rf"{RESULTS}/memo/train_epoch/[0-9a-f]{{64}}/sentinel\.json"
    preempt = [{"job": "^cache-tiny-mini-build-", "bucket": BUCKET, "object": memo, "json": epoch2}]
    result, report = run_fake_batch(
        checkout, tmp_path_factory.mktemp("state"), emulator, "--profile", "profiles/gcp-batch", *FAST,
        "--rffm-googlebatch-retry-count", "1", "validation_selection",
        env={**profile_env(BUCKET), "FAKE_BATCH_PREEMPT": json.dumps(preempt)},
    )  # fmt: skip
    assert result.returncode == 0, output(result)
    [group] = [job for job in report["jobs"] if job["job_id"].startswith("cache-tiny-mini-build-")]
    parts = [[job for job in report["jobs"] if job["job_id"].startswith(f"cache-tiny-mini-part{n}-")] for n in (2, 3)]
    assert [len(found) for found in parts] == [1, 1], [job["job_id"] for job in report["jobs"]]
    return {"report": report, "group": group, "parts": [found[0] for found in parts], "objects": bucket_objects(emulator, BUCKET)}


def epoch_targets(runs: tuple[str, ...]) -> list[str]:
    return [f"train_epoch:run={run},epoch={e}" for run in runs for e in range(1, EPOCHS[run] + 1)]


def test_per_cache_groups_build_the_cache_once_per_group_job(preempted_grid, grid_tree):
    """Issue 47, acceptance 2 (issue 36 before it): at cache.runs_per_group 2 the five runs are three Batch jobs: the
    first builds the cache and trains base's and second's epochs, none of which builds a cache; the second (third's and
    fourth's epochs) and the third (fifth's) each build their own copy on their own VM in their first epoch: 3 cache
    builds for 5 runs. One L4 and one local SSD on each VM; every artifact byte-identical to the local grid's (the first
    VM preempted once on the way: below)."""
    report, group, parts, objects = (preempted_grid[k] for k in ("report", "group", "parts", "objects"))
    names = sorted(job["job_id"].rsplit("-", 1)[0] for job in report["jobs"])
    grouped = [job["job_id"].rsplit("-", 1)[0] for job in (group, *parts)]
    assert names == sorted([*grouped, "pretrain-backbone", *["select-checkpoint"] * 5, "stage-dataset"])
    assert targets(group) == sorted(["build_cache:dataset=tiny,backbone=mini", *epoch_targets(FIRST)])
    assert [targets(part) for part in parts] == [sorted(epoch_targets(runs)) for runs in PARTS]
    assert [job for job in report["jobs"] if any(t.startswith("build_cache") for t in targets(job))] == [group]
    for job in (group, *parts):
        policy = instance(job)["policy"]
        assert [(a["type_"], a["count"]) for a in policy["accelerators"]] == [("nvidia-l4", "1")]
        assert [d["new_disk"]["size_gb"] for d in policy["disks"]] == ["375"], "one local SSD, never the members' sum"

    provenance = {run: [json.loads(objects[f"{RESULTS}/runs/{run}/epochs/{e}/provenance.json"].download_as_text())
                        for e in range(1, EPOCHS[run] + 1)] for run in EPOCHS}  # fmt: skip
    built = sorted((run, p["epoch"]) for run, ps in provenance.items() for p in ps if "cache_build" in p)
    # one copy in each later group job, by whichever of its runs' first epochs comes first (under the cache's lock)
    assert len(built) == 2 and ("fifth", 1) in built and len({("third", 1), ("fourth", 1)} & set(built)) == 1, built
    assert 1 + len(built) == 3  # cache builds: the build in the first group job, one copy in each other
    assert {p["job_id"] for run in FIRST for p in provenance[run]} == {group["name"]}
    for part, runs in zip(parts, PARTS, strict=True):
        assert {p["job_id"] for run in runs for p in provenance[run]} == {part["name"]}
    artifacts = {
        name.removeprefix(f"{RESULTS}/artifacts/"): hashlib.sha256(blob.download_as_bytes()).hexdigest()
        for name, blob in objects.items()
        if name.startswith(f"{RESULTS}/artifacts/")
    }
    reference = artifact_digests(grid_tree / "results")
    assert len(reference) >= 5 and artifacts == reference


def test_a_preempted_group_resumes_every_run_from_the_memo_and_builds_the_cache_once_more(preempted_grid):
    """Issue 36, acceptance 1 (issue 47, acceptance 2, with bounded groups): the co-located group's VM is preempted once
    base's epoch 2 is in the memo; Batch retries the task on a new VM, where the group builds the cache once (the new
    local SSD is empty) and every epoch an attempt completed comes back from the memo: none is trained twice, whichever
    run it belongs to. The other group job is never preempted and runs once."""
    group, objects = preempted_grid["group"], preempted_grid["objects"]
    assert task_spec(group)["max_retry_count"] == 1
    first, retry = group["attempts"]
    assert (first["preempted"], first["exit_code"]) == (True, PREEMPTION_EXIT_CODE)
    assert (retry["preempted"], retry["exit_code"]) == (False, 0) and group["state"] == "SUCCEEDED"
    assert retry["sandbox"] != first["sandbox"], "a retried task runs on a new VM"
    assert all(len(job["attempts"]) == 1 for job in preempted_grid["report"]["jobs"] if job is not group)

    def attempt(record: dict) -> str:
        return record["provider"]["BATCH_TASK_RETRY_ATTEMPT"]

    memo = {}  # (run, epoch) -> the attempt whose job trained it, from the memo entries in the bucket
    for name, blob in objects.items():
        if re.fullmatch(rf"{RESULTS}/memo/train_epoch/[0-9a-f]{{64}}/sentinel\.json", name):
            key = json.loads(blob.download_as_text())["key"]
            record = json.loads(objects[name.replace("sentinel.json", "provenance.json")].download_as_text())
            memo[(key["run"], key["epoch"])] = attempt(record)
    assert sorted(memo) == sorted((run, e) for run in EPOCHS for e in range(1, EPOCHS[run] + 1))
    assert memo[("base", 1)] == memo[("base", 2)] == "0", memo
    for (run, epoch), trained_in in memo.items():
        record = json.loads(objects[f"{RESULTS}/runs/{run}/epochs/{epoch}/provenance.json"].download_as_text())
        if run not in FIRST:  # the later group jobs: one attempt, nothing restored
            assert (attempt(record), trained_in) == ("0", "0") and "restored_from" not in record, (run, epoch)
            continue
        assert attempt(record) == "1", (run, epoch)  # every epoch's record of the first group job is the retry's
        if trained_in == "0":  # completed before the preemption: restored on the new VM, never trained again
            assert record["restored_from"].startswith(f"gs://{BUCKET}/{RESULTS}/memo/train_epoch/"), (run, epoch, record)
            assert attempt(record["computed_by"]) == "0", (run, epoch)
        else:
            assert "restored_from" not in record, (run, epoch)
    cache = json.loads(objects[f"{RESULTS}/caches/tiny__mini/provenance.json"].download_as_text())
    assert cache["job_id"] == group["name"] and attempt(cache) == "1", "the retry's VM built the cache once, in its build job"
