"""Invalidation guarantees of the real workflow on the tiny configuration (SPEC section 4)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, PROFILED_TRACES, SNAKEFILE, plan_of, planned_jobs, sigkill_once_started, snakemake, tiny_config, write_config

pytestmark = pytest.mark.workflow

EPOCHS = [f"train_epoch[run=base, epoch={e}]" for e in (1, 2, 3)]
EVERY_JOB = sorted(
    ["stage_dataset[dataset=tiny]", "pretrain_backbone[backbone=mini]", "build_cache[dataset=tiny, backbone=mini]"]
    + EPOCHS
    + ["select_checkpoint[run=base]", "qualify[run=base]"]
    + ["plot_training[run=base]", "summarize_manifest[run=base]"]  # report figures (rules/report.smk)
    + ["summarize_profiling[run=base]", "plot_cache_lifecycle[run=base]"]  # the tiny run is profiled
)


def test_fresh_dry_run_lists_the_whole_plan(fresh_workdir: Path):
    assert planned_jobs(fresh_workdir) == EVERY_JOB
    assert not (fresh_workdir / "results").exists()


def test_complete_run_has_nothing_to_do(workdir: Path):
    assert planned_jobs(workdir) == []
    assert "Nothing to be done" in snakemake(workdir, "-n").stdout


def test_touching_every_file_reruns_nothing(workdir: Path):
    files = [p for root in ("results", "scratch") for p in (workdir / root).rglob("*") if p.is_file()]
    assert len(files) > 30
    later = time.time() + 5
    for path in files:
        os.utime(path, (later, later))
    assert planned_jobs(workdir) == []


def test_head_lr_change_reruns_only_epochs_and_selection(selected_workdir: Path):
    config = tiny_config()
    config["runs"]["base"]["train"]["lr"] = 0.02
    write_config(selected_workdir, config)
    assert planned_jobs(selected_workdir, "validation_selection") == sorted(
        EPOCHS + ["select_checkpoint[run=base]", "plot_training[run=base]"]
    )


def test_more_epochs_run_only_the_new_ones(selected_workdir: Path):
    config = tiny_config()
    config["runs"]["base"]["train"]["epochs"] = 6
    write_config(selected_workdir, config)
    new = [f"train_epoch[run=base, epoch={e}]" for e in (4, 5, 6)]
    assert planned_jobs(selected_workdir, "validation_selection") == sorted(
        new + ["select_checkpoint[run=base]", "plot_training[run=base]"]
    )


UP_TO_SELECTION = sorted(job for job in EVERY_JOB if not job.startswith(("qualify", "summarize_manifest", "plot_cache", "export")))


def test_staging_seed_change_reruns_everything(selected_workdir: Path):
    config = tiny_config()
    config["datasets"]["tiny"]["seed"] = 12
    write_config(selected_workdir, config)
    assert planned_jobs(selected_workdir, "validation_selection") == sorted(set(UP_TO_SELECTION) - {"summarize_profiling[run=base]"})


def test_a_scratch_without_the_cache_reruns_nothing(workdir: Path):
    """The hidden-state cache is node-local, not a workflow file: losing it (a new node) plans no job."""
    shutil.rmtree(workdir / "scratch")
    assert planned_jobs(workdir) == []


def test_code_change_reruns_that_step_and_downstream(selected_workdir: Path, monkeypatch):
    """A different code digest for the selection step reruns selection (and qualification)."""
    from rffm.records import code

    assert code.code_digest("steps.select_checkpoint") != code.code_digest("steps.train_epoch")
    # simulate an edit of rffm/steps/select_checkpoint.py by changing the digest the workflow computes
    sitecustomize = selected_workdir / "sitecustomize.py"
    sitecustomize.write_text(
        "import rffm.records.code as c\n_real = c.code_digest\n"
        "c.code_digest = lambda m: ('edited' + _real(m)) if m == 'steps.select_checkpoint' else _real(m)\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{selected_workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    assert planned_jobs(selected_workdir, "validation_selection") == sorted(["select_checkpoint[run=base]", "plot_training[run=base]"])


def test_sigkill_during_an_epoch_then_rerun_incomplete_is_byte_identical(fresh_workdir: Path, finished_workdir: Path):
    command = [
        str(BIN / "snakemake"),
        "-s",
        str(SNAKEFILE),
        "-d",
        str(fresh_workdir),
        "--configfile",
        str(fresh_workdir / "config.yaml"),
        "--cores",
        "2",
    ]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    sigkill_once_started(command, fresh_workdir, env, fresh_workdir / "results/logs/train_epoch/base/2.log")
    epoch2 = fresh_workdir / "results/runs/base/epochs/2"
    assert not (epoch2 / "sentinel.json").exists(), "epoch 2 finished before the kill; the test did not interrupt it"

    unlocked = subprocess.run([str(BIN / "rffm"), "unlock", str(fresh_workdir)], capture_output=True, text=True, check=True)
    assert "removed the lock of a killed run" in unlocked.stdout
    snakemake(fresh_workdir, "--rerun-incomplete")

    for name in ("epochs/3/checkpoint.pt", "epochs/3/sentinel.json", "selection/selection.json", "selection/sentinel.json"):
        resumed = (fresh_workdir / "results/runs/base" / name).read_bytes()
        uninterrupted = (finished_workdir / "results/runs/base" / name).read_bytes()
        assert resumed == uninterrupted, name
    artifacts = sorted(p.name for p in (fresh_workdir / "results/artifacts").iterdir())
    assert artifacts == sorted(p.name for p in (finished_workdir / "results/artifacts").iterdir())


def test_profiling_run_writes_traces_and_the_lifecycle_summary(finished_workdir: Path):
    import json

    profiling = finished_workdir / "results/runs/base/profiling"
    traces = sorted(p.name for p in profiling.glob("*.trace.json"))
    assert traces == PROFILED_TRACES
    summary = json.loads((profiling / "cache_lifecycle_summary.json").read_text())
    assert summary["run"] == "base" and summary["traces"] == traces
    assert {"cache_build.backbone", "cache_build.memmap_assign", "epoch1.prefetch_wait", "epoch2.memmap_read"} <= set(summary["phases"])
    assert not (finished_workdir / "results/runs/base/epochs/3/profiling").exists()


def test_an_end_to_end_reference_plans_only_its_own_jobs_and_the_comparison(workdir: Path):
    """A reference with a sweep (references.<id>.sweep): one train_reference job trains both members, one exposure, the
    chosen member named by `rffm compare`, and its grid frozen once qualified, as a run's."""
    import json

    config = tiny_config()
    train = {"epochs": 2, "lr": 0.01, "batch_size": 16, "seed": 0}
    grid = {"train.lr": [0.01, 0.03]}
    config["references"] = {"cnn": {"dataset": "tiny", "model": {"width": 8, "blocks": 2}, "train": train, "sweep": grid}}
    write_config(workdir, config)
    plan = snakemake(workdir, "-n", "-p").stdout
    assert plan_of(plan) == ["plot_comparison", "qualify_reference[reference=cnn]", "train_reference[reference=cnn]"]
    assert "--members '[lr=0.01] [lr=0.03]'" in plan  # the dry run names the members, as an epoch job's
    snakemake(workdir)
    assert planned_jobs(workdir) == []
    shown = subprocess.run(
        [str(BIN / "rffm"), "compare", "results", "--config", "config.yaml"], cwd=workdir, capture_output=True, text=True, check=True
    ).stdout
    roles = [line.split()[:4] for line in shown.splitlines()[1:3]]
    member = json.loads((workdir / "results/runs/cnn/qualification/run_manifest.json").read_text())["selection"]["member"]
    assert member in ("lr=0.01", "lr=0.03")
    assert roles == [["all", "frozen", "backbone", "base"], ["all", "end-to-end", "cnn", f"[{member}]*"]]  # `name [member]`, *: strongest
    assert (workdir / "results/report/comparison/comparison.png").stat().st_size > 0
    command = [str(BIN / "rffm"), "status", "results", "--config", "config.yaml"]
    status = subprocess.run(command, cwd=workdir, capture_output=True, text=True).stdout
    assert ["cnn", "qualified", "2/2"] in [line.split()[:3] for line in status.splitlines()]
    # the qualified reference's grid is frozen: refused while planning, dry or real, nothing run or deleted
    before = {p: p.read_bytes() for p in sorted((workdir / "results").rglob("*")) if p.is_file()}
    config["references"]["cnn"]["sweep"]["train.lr"].append(0.1)
    write_config(workdir, config)
    for dry in (["-n"], []):
        refused = snakemake(workdir, *dry, check=False)
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0 and "references.cnn was qualified" in said and "references.cnn.sweep.train.lr" in said, dry
    assert {p: p.read_bytes() for p in sorted((workdir / "results").rglob("*")) if p.is_file()} == before
    verify = subprocess.run([str(BIN / "rffm"), "verify", str(workdir / "results")], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_label_scarce_run_qualifies_on_k_labels_and_changing_k_never_touches_the_cache(workdir: Path):
    """train.labels_per_class_snr: the head reads k labels per (class, SNR) of the cached train split; k is an epoch param."""
    import json

    config = tiny_config()
    config["runs"]["scarce"] = {**config["runs"]["base"], "train": {**config["runs"]["base"]["train"], "labels_per_class_snr": 2}}
    config["runs"]["scarce"].pop("profiling")
    write_config(workdir, config)
    after_cache = [f"train_epoch[run=scarce, epoch={e}]" for e in (1, 2, 3)] + ["select_checkpoint[run=scarce]"]
    reports = ["plot_training[run=scarce]", "qualify[run=scarce]", "summarize_manifest[run=scarce]"]
    assert planned_jobs(workdir) == sorted(after_cache + reports)
    snakemake(workdir)
    run = workdir / "results/runs/scarce"
    labels = json.loads((run / "epochs/1/sentinel.json").read_text())["labels"]
    assert labels == {"labels_per_class_snr": 2, "labels_seed": 0, "labelled_rows": 16, "train_rows": 64}  # 4 classes x 2 SNRs x 2
    assert json.loads((run / "selection/model_card.json").read_text())["labelled_rows"] == 16
    assert json.loads((run / "qualification/run_manifest.json").read_text())["training"]["params"]["labels_per_class_snr"] == 2
    # another k never under the id whose test exposure is spent, whatever the target: the freeze names the setting ...
    config["runs"]["scarce"]["train"]["labels_per_class_snr"] = 3
    write_config(workdir, config)
    for target in ("final_qualification", "validation_selection"):
        refused = snakemake(workdir, "-n", target, check=False)
        assert refused.returncode != 0 and "runs.scarce.train.labels_per_class_snr" in refused.stdout + refused.stderr
    # ... and under a new id (the refusal's fix), the epochs and selection again, never the cache or the backbone
    config["runs"]["scarce_2"] = config["runs"]["scarce"]
    config["runs"]["scarce"] = {**config["runs"]["scarce"], "train": {**config["runs"]["scarce"]["train"], "labels_per_class_snr": 2}}
    write_config(workdir, config)
    renamed = [job.replace("run=scarce]", "run=scarce_2]").replace("run=scarce,", "run=scarce_2,") for job in after_cache]
    assert planned_jobs(workdir, "validation_selection") == sorted(renamed + ["plot_training[run=scarce_2]"])
