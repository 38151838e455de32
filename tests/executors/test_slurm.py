"""The tiny workflow through a real single-node SLURM cluster with profiles/slurm (SPEC section 6)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO, artifact_digests, grid_config, snakemake, tiny_config, write_config
from rffm.records.files import read_json, sha256_file

PROFILE = REPO / "profiles" / "slurm"
# Test-only overrides, polled every second. No slurmdbd here: `sacct` exits 1 ("Slurm accounting storage is disabled"),
# and with the plugin's default sacct status command the run would hang, never learning that its jobs ended; squeue works.
# The test cluster's GPU is a fake gres (File=/dev/null) torch cannot see, so GPU rules compute on the CPU: the profile's
# config block with device: cpu (a command-line --config replaces the profile's whole block).
PROFILE_CONFIG = yaml.safe_load((PROFILE / "config.yaml").read_text())["config"]
FAST_POLLING = (
    "--config",
    *(f"{key}={value}" for key, value in {**PROFILE_CONFIG, "device": "cpu"}.items()),
    "--slurm-status-command",
    "squeue",
    "--slurm-init-seconds-before-status-checks",
    "1",
    "--seconds-between-status-checks",
    "1",
)
GPU_RULES = {"pretrain_backbone", "build_cache", "train_epoch", "qualify"}


def test_the_slurm_profile_combines_with_the_workflow_profile(monkeypatch):
    """What Snakemake makes of `--profile profiles/slurm` plus the automatic profiles/default in this checkout."""
    from snakemake.cli import parse_args

    monkeypatch.chdir(REPO)
    _, args = parse_args(["--profile", "profiles/slurm", "-n"])
    assert args.executor == "slurm" and args.jobs == 50 and args.cores is None  # nothing caps threads at this host's cores
    assert args.printshellcmds and args.rerun_incomplete  # from profiles/default
    assert args.default_resources["slurm_partition"].raw == "cpu" and args.default_resources["mem_mb"].value == 4000
    for rule in GPU_RULES:
        assert args.set_resources[rule]["gpu"].value == 1 and args.set_resources[rule]["slurm_partition"].raw == "gpu"
    assert not args.groups  # the workflow's rules name the groups (one job per cache or per run: cache.colocate)
    assert args.config == ["launch_profile=slurm", "device=cuda"]  # GPU rules compute on the GPU they book
    assert len(args.rerun_triggers) == 5


def test_a_gpu_job_whose_torch_sees_no_gpu_stops_instead_of_training_on_the_cpu(monkeypatch):
    """Issue 34: with the profile's device, a job SLURM gave a GPU (SLURM_GPUS_ON_NODE) that torch cannot see fails."""
    import torch

    from rffm.errors import ConfigError
    from rffm.runtime.device import resolve

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "1")
    with pytest.raises(ConfigError) as refused:
        resolve(PROFILE_CONFIG["device"])
    assert str(refused.value).startswith("device 'cuda': this job was given a GPU (SLURM_GPUS_ON_NODE=1) but torch sees none")


def slurm_jobs() -> dict[str, tuple[str, str]]:
    """Every job slurmctld still remembers (MinJobAge=300 s): id -> (state, comment = Snakemake rule)."""
    listing = subprocess.run(["squeue", "--states=all", "-h", "-o", "%i|%T|%k"], capture_output=True, text=True, check=True).stdout
    return {job: (state, comment) for job, state, comment in (line.split("|", 2) for line in listing.splitlines())}


SBATCH = re.compile(r"sbatch call: (.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def grid_through_slurm(cluster, tmp_path_factory) -> tuple[Path, str, dict[str, tuple[str, str]]]:
    """One launch of `snakemake --profile slurm` on a 5-run grid on one cache (conftest.grid_config: the tiny run `base`,
    exported, and `second` to `fifth` on its dataset and backbone; cache.colocate per-cache, the default, with
    cache.runs_per_group 2: three group jobs), run to the end: the work directory, Snakemake's output and the SLURM jobs
    it submitted. The test node has one GPU: --cores 1 lets the group run
    one member at a time, so it books one GPU (with more cores it books one per epoch that can run at once)."""
    workdir = tmp_path_factory.mktemp("slurm") / "grid"
    workdir.mkdir()
    config = grid_config(runs=5)
    config["cache"]["runs_per_group"] = 2
    config["runs"]["base"]["export"] = True  # every rule on this executor, the export too
    write_config(workdir, config)
    known = set(slurm_jobs())
    result = snakemake(workdir, "--profile", str(PROFILE), *FAST_POLLING, "--cores", "1", "--verbose", timeout=900)
    jobs = {job: value for job, value in slurm_jobs().items() if job not in known}
    return workdir, result.stdout + result.stderr, jobs


def test_a_single_run_cache_is_grouped_with_its_run(tmp_path: Path):
    """The plan of the tiny config alone (one run reads its cache): the cache build and the run's epochs are the run's
    group job, `train_base`, in either co-location mode (the grid below runs the per-cache group of a shared cache)."""
    write_config(tmp_path, tiny_config())
    plan = snakemake(tmp_path, "--profile", str(PROFILE), *FAST_POLLING, "-n").stdout
    assert re.findall(r"Group job (\S+) \(", plan) == ["train_base"], plan


@pytest.mark.workflow
def test_the_tiny_workflow_runs_through_slurm(grid_through_slurm, finished_workdir: Path):
    workdir, _, jobs = grid_through_slurm
    assert jobs and all(state == "COMPLETED" for state, _ in jobs.values()), jobs
    manifest = read_json(workdir / "results/runs/base/qualification/run_manifest.json")
    steps = manifest["provenance"]["steps"]
    for rule, step in steps.items():
        assert step["executor"] == "slurm" and step["job_id"] in jobs, (rule, step)
        partition = "gpu" if rule in GPU_RULES else "cpu"
        assert step["provider"]["SLURM_JOB_PARTITION"] == partition, (rule, step["provider"])
        assert step["provider"]["SLURM_JOB_NODELIST"] == "localhost" and step["provider"]["SLURM_CLUSTER_NAME"] == "rffmtest"
    epochs = steps["train_epoch"]["jobs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    # the cache build and the epochs ran as one group job on one node; every other step as its own job
    assert {e["job_id"] for e in epochs} == {steps["build_cache"]["job_id"]}
    assert jobs[steps["build_cache"]["job_id"]][1].startswith("rule_cache_tiny__mini")  # the group of the cache's epochs
    others = [steps[r]["job_id"] for r in ("stage_dataset", "pretrain_backbone", "select_checkpoint", "qualify")]
    assert len(set(others + [steps["build_cache"]["job_id"]])) == 5
    exported = read_json(workdir / "results/runs/base/export/provenance.json")
    assert exported["executor"] == "slurm" and exported["job_id"] in jobs, exported
    logs = {p.stem for p in (workdir / ".snakemake/slurm_logs").rglob("*.log")}
    assert logs == set(jobs)
    assert (workdir / "scratch/tiny__mini/sentinel.json").exists()  # the node's memo of the cache, never a workflow file

    launched = manifest["provenance"]["launch_profile"]
    assert launched["sha256"] == sha256_file(PROFILE / "config.yaml") and Path(launched["path"]) == PROFILE / "config.yaml"
    kept = workdir / "results/runs/base/launch/slurm/config.yaml"
    assert kept.read_bytes() == (PROFILE / "config.yaml").read_bytes()
    assert (
        manifest["selection"]["artifact_sha256"]
        == read_json(finished_workdir / "results/runs/base/selection/selection.json")["artifact_sha256"]
    )


@pytest.mark.workflow
def test_a_grid_of_five_runs_two_per_node_builds_the_cache_three_times(grid_through_slurm, grid_tree: Path):
    """Issue 47, acceptance 2 (issue 36 before it): five runs on one cache at cache.runs_per_group 2 are three sbatch
    group jobs: the first builds the cache and trains base's and second's epochs, the second third's and fourth's (one
    job, though their epochs share no job: planning.keep_parts_whole), the third fifth's. On a cluster of several nodes
    each later group job builds its own copy on its node (3 cache builds, as on Batch: test_colocation.py); this test
    cluster is one node, whose scratch every job shares, so they find the first job's copy there and build none. The
    artifacts are the local grid's, byte for byte."""
    workdir, output, jobs = grid_through_slurm
    assert jobs and all(state == "COMPLETED" for state, _ in jobs.values()), jobs
    rules = sorted(comment.split("_wildcards_")[0] for _, comment in jobs.values())
    grouped = "rule_cache_tiny__mini_build_cache_train_epoch"  # the group job's comment: its group and its rules
    parts = ["rule_cache_tiny__mini__part2_train_epoch", "rule_cache_tiny__mini__part3_train_epoch"]
    per_run = ["rule_qualify", "rule_select_checkpoint"]
    assert rules == sorted([grouped, *parts, "rule_export", "rule_pretrain_backbone", *per_run * 5, "rule_stage_dataset"]), rules
    [group] = [job for job, (_, comment) in jobs.items() if comment.split("_wildcards_")[0] == grouped]
    [call] = [line for line in SBATCH.findall(output) if "rule_cache_tiny__mini_build" in line]
    assert re.findall(r"--gpus=\d+", call) == ["--gpus=1"] and "--mem 32000" in call, call  # one member at a time
    assert re.search(r" -t '?160\b", call), call  # 60 min + 5 epochs x 20 min: the members' runtimes summed
    [log] = (workdir / ".snakemake/slurm_logs").glob(f"group_cache_tiny__mini_build*/{group}.log")
    [step] = [line for line in log.read_text().splitlines() if line.startswith("The call for this job is: srun")]
    assert "--gpus=1 " in step and all(f"'train_epoch:run={run},epoch=1'" in step for run in ("base", "second")), step

    results = workdir / "results"
    assert read_json(results / "caches/tiny__mini/provenance.json")["job_id"] == group
    epochs = {p.parts[-4] + "/" + p.parts[-2]: read_json(p) for p in sorted(results.glob("runs/*/epochs/*/provenance.json"))}
    assert len(epochs) == 9
    assert {e["job_id"] for key, e in epochs.items() if key.split("/")[0] in ("base", "second")} == {group}
    assert not [key for key, e in epochs.items() if "cache_build" in e], "the node's copy is found, never rebuilt"
    later = {key.split("/")[0]: e["job_id"] for key, e in epochs.items() if key.split("/")[0] in ("third", "fourth", "fifth")}
    assert later["third"] == later["fourth"] != later["fifth"] and group not in later.values()
    assert {later["third"], later["fifth"]} == {job for job, (_, comment) in jobs.items() if "__part" in comment}
    assert artifact_digests(results) == artifact_digests(grid_tree / "results")
