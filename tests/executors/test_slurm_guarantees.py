"""The workflow's guarantees on a real single-node slurmctld with profiles/slurm (issue 11, acceptance 3 and 5).

One chain of launches in one working directory, two runs (`base`, the tiny run, and `other`) sharing
the tiny dataset, backbone and hidden-state cache; the cache is node-local, under `scratch`:
1. `validation_selection`; `base`'s epochs job is cancelled (scancel) once epoch 2 is complete in the
   results store: that launch fails;
2. the node's scratch is wiped (the rerun lands on another node), `validation_selection` again: epochs
   1 and 2 come back from the memo, epoch 3 alone is trained, the artifact is the uninterrupted one;
3. `base`'s epochs raised 3 -> 5: exactly epochs 4, 5 and the selection run;
4. `snakemake --profile slurm` (qualification): both runs qualify.
Every sbatch line of the chain asks for at most one GPU (the profile's `gpu: 1`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_slurm import FAST_POLLING, PROFILE, slurm_jobs

from conftest import BIN, SNAKEFILE, WARM, plan_of, tiny_config, write_config
from rffm.records.files import read_json, sha256_file

pytestmark = pytest.mark.workflow
SBATCH = re.compile(r"sbatch call: (.*)$", re.MULTILINE)


def two_runs(epochs: int = 3) -> dict:
    """The tiny config plus run `other` on the same dataset and backbone."""
    config = tiny_config()
    config["runs"]["base"]["train"]["epochs"] = epochs
    other = {"dataset": "tiny", "backbone": "mini", "train": {"epochs": 3, "lr": 0.01, "batch_size": 16, "seed": 1}, "export": False}
    config["runs"]["other"] = other  # neither run exported: the export on this executor is its end-to-end test's
    config["cache"]["colocate"] = "per-run"  # a group job per run (tests/executors/test_colocation.py: per-cache)
    return config


def command(workdir: Path, *args: str) -> list[str]:
    # --verbose: the SLURM plugin logs each `sbatch call:` at debug level
    return [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(workdir), "--configfile", str(workdir / "config.yaml")] + [
        "--profile",
        str(PROFILE),
        *FAST_POLLING,
        "--verbose",
        *args,
    ]


def environment() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RFFM_PLAIN_PROGRESS": "1"}


def launch(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    result = WARM.run_any(command(workdir, *args), workdir, environment(), timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def memo_holds(results: Path, key: dict) -> bool:
    """Whether the memo of completed epochs in the results store holds this step key (its sentinel is written last)."""
    for sentinel in (results / "memo" / "train_epoch").glob("*/sentinel.json"):
        try:
            if json.loads(sentinel.read_text()).get("key") == key:
                return True
        except ValueError:
            continue
    return False


def epoch_files(workdir: Path, run: str) -> dict[str, tuple[str, int]]:
    """relative name -> (sha256, mtime_ns) of every file of a run's epochs."""
    root = workdir / "results" / "runs" / run / "epochs"
    return {p.relative_to(root).as_posix(): (sha256_file(p), p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def chain(cluster, tmp_path_factory) -> dict:
    """Steps 1 and 2: a cancelled epochs job, then the rerun on a wiped node."""
    workdir = tmp_path_factory.mktemp("slurm-chain")
    write_config(workdir, two_runs())
    known = set(slurm_jobs())
    # its output goes to a file: a pipe nobody reads while the loop below polls fills up and stops Snakemake mid-log
    log = tmp_path_factory.mktemp("slurm-chain-log") / "snakemake.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            command(workdir, "validation_selection"), cwd=workdir, env=environment(), stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 1800  # stage, pretrain, cache, two epochs: each a SLURM job on a loaded 2-core machine
        while not memo_holds(workdir / "results", {"run": "base", "epoch": 2}):
            if process.poll() is not None or time.monotonic() > deadline:
                if process.poll() is None:
                    process.kill()
                process.wait(timeout=60)
                pytest.fail(f"epoch 2 never reached the store; jobs {slurm_jobs()}\n{log.read_text()[-6000:]}")
            time.sleep(0.1)
        groups = [job for job, (state, comment) in slurm_jobs().items() if comment.startswith("rule_train_base") and state == "RUNNING"]
        assert len(groups) == 1, slurm_jobs()
        subprocess.run(["scancel", groups[0]], check=True)
        process.wait(timeout=900)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    killed_output = log.read_text()
    assert process.returncode != 0, killed_output[-4000:]
    cancelled = slurm_jobs()[groups[0]][0]
    third = workdir / "results/runs/base/epochs/3/sentinel.json"
    assert not third.exists(), "epoch 3 finished before the cancel: nothing was interrupted"

    shutil.rmtree(workdir / "scratch")  # the rerun's node has an empty scratch disk
    resumed = launch(workdir, "validation_selection")
    first = set(slurm_jobs()) - known
    outputs = [killed_output, resumed.stdout + resumed.stderr]
    return {"workdir": workdir, "cancelled": (groups[0], cancelled), "outputs": outputs, "jobs": first}


@pytest.fixture(scope="module")
def raised(chain) -> dict:
    """Step 3: `base` trained to 5 epochs instead of 3."""
    workdir = chain["workdir"]
    before = epoch_files(workdir, "base")
    known = set(slurm_jobs())
    write_config(workdir, two_runs(epochs=5))
    dry = WARM.run_any(command(workdir, "-n", "validation_selection"), workdir, environment())
    assert dry.returncode == 0, dry.stderr[-4000:]
    result = launch(workdir, "validation_selection")
    return {"before": before, "plan": plan_of(dry.stdout), "jobs": set(slurm_jobs()) - known, "output": result.stdout + result.stderr}


@pytest.fixture(scope="module")
def qualified(chain, raised) -> dict:
    """Step 4: the default target, both runs' qualification."""
    result = launch(chain["workdir"])
    return {"output": result.stdout + result.stderr}


def test_a_cancelled_epochs_job_resumes_from_the_last_epoch_in_the_store(chain, finished_workdir: Path):
    workdir = chain["workdir"]
    job, state = chain["cancelled"]
    assert state == "CANCELLED", (job, state)
    for epoch in (1, 2):
        record = read_json(workdir / f"results/runs/base/epochs/{epoch}/provenance.json")
        assert "memo/train_epoch/" in record.get("restored_from", ""), (epoch, record)
        assert record["computed_by"]["job_id"] == job, "computed by the cancelled job"
    third = read_json(workdir / "results/runs/base/epochs/3/provenance.json")
    assert "restored_from" not in third and third["job_id"] != job
    assert third["cache_build"], "the new node built the cache (its scratch was empty)"
    selection = read_json(workdir / "results/runs/base/selection/selection.json")
    reference = read_json(finished_workdir / "results/runs/base/selection/selection.json")
    assert selection["artifact_sha256"] == reference["artifact_sha256"]
    artifact = workdir / "results" / selection["artifact_path"]
    assert artifact.read_bytes() == (finished_workdir / "results" / reference["artifact_path"]).read_bytes()
    for name in ("checkpoint.pt", "metrics.json"):
        resumed, uninterrupted = (w / "results/runs/base/epochs/3" / name for w in (workdir, finished_workdir))
        assert resumed.read_bytes() == uninterrupted.read_bytes(), name


def test_raising_epochs_runs_exactly_the_new_epochs_and_the_selection(raised, chain):
    # plot_training is a local rule of the submitting host (the training curves), never an sbatch job
    new_epochs = ["train_epoch[run=base, epoch=4]", "train_epoch[run=base, epoch=5]"]
    assert raised["plan"] == ["plot_training[run=base]", "select_checkpoint[run=base]", *new_epochs]
    workdir = chain["workdir"]
    after = epoch_files(workdir, "base")
    assert {name: kept for name, kept in after.items() if name in raised["before"]} == raised["before"], "an earlier epoch was rewritten"
    for epoch in (4, 5):
        record = read_json(workdir / f"results/runs/base/epochs/{epoch}/provenance.json")
        assert "restored_from" not in record and record["job_id"] in raised["jobs"], record
    assert len(raised["jobs"]) == 2, raised["jobs"]  # the epochs group and the selection
    selection = read_json(workdir / "results/runs/base/selection/selection.json")
    assert [c["epoch"] for c in selection["candidates"]] == [1, 2, 3, 4, 5]


def test_two_runs_sharing_a_cache_both_qualify_one_gpu_per_job(chain, raised, qualified):
    workdir = chain["workdir"]
    manifests = {run: read_json(workdir / f"results/runs/{run}/qualification/run_manifest.json") for run in ("base", "other")}
    counts = sorted(m["qualification"]["exposure_count"] for m in manifests.values())
    assert counts == [1, 2], counts  # two artifacts on the one test split, counted as each run qualified
    assert manifests["base"]["selection"]["artifact_sha256"] != manifests["other"]["selection"]["artifact_sha256"]
    for manifest in manifests.values():
        assert manifest["provenance"]["launch_profile"]["sha256"] == sha256_file(PROFILE / "config.yaml")
    calls = [call for output in [*chain["outputs"], raised["output"], qualified["output"]] for call in SBATCH.findall(output)]
    gpu_calls = [call for call in calls if "--gpus" in call or "--gres" in call]
    assert len(calls) >= 12 and gpu_calls, calls
    for call in gpu_calls:
        assert re.findall(r"--gpus[= ](\S+)", call) == ["1"] and "--gres" not in call, call
        assert "-p gpu" in call and re.search(r"--mem (\d+)", call).group(1) == "32000", call
    for call in calls:
        assert "-p gpu" in call or "--gpus" not in call, call
    # what slurmctld granted: never more than the node's one GPU per job
    for job in slurm_jobs():
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
        assert "gres/gpu=2" not in shown and "gres/gpu:2" not in shown, shown


def test_an_sbatch_rejection_is_shown_in_sbatchs_own_words(cluster, tmp_path):
    """A request the site cannot grant (two GPUs on a one-GPU node) fails with sbatch's message, not `message: None`."""
    write_config(tmp_path, tiny_config())
    # --slurm-status-command etc. as everywhere here; only the resources of one rule are made impossible
    impossible = ("--set-resources", "stage_dataset:gpu=2", "stage_dataset:slurm_partition=gpu")
    result = WARM.run_any(command(tmp_path, "results/datasets/tiny/sentinel.json", *impossible), tmp_path, environment(), timeout=300)
    text = result.stdout + result.stderr
    assert result.returncode != 0, text[-3000:]
    assert "Requested node configuration is not available" in text, text[-4000:]
    assert "SLURM sbatch failed" in text
