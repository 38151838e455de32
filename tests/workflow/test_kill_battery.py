"""The kill battery (issue 14, acceptance 2): SIGKILL of the whole workflow right before or right after each
file select_checkpoint and qualify write, then `snakemake --rerun-incomplete`.

Each point starts from a copy of the finished tiny run with the step's folder (and what it creates in
the results store) removed, so the step runs as the first time; tests/killpoint/sitecustomize.py kills
the Snakemake run's process group at the point. Every resume must give the uninterrupted run's bytes
for every deterministic file and leave no temporary file. (A kill in the middle of an epoch:
tests/workflow/test_workflow.py.)
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO, SNAKEFILE, WARM, copy_workdir, plan_of, snakemake
from rffm.ops.unlock import clear_stale_lock
from rffm.records import ledger
from rffm.records.store import PosixStore

pytestmark = pytest.mark.workflow
RUN = "results/runs/base"
HOOK = REPO / "tests" / "killpoint"


def first_qualification(workdir: Path) -> None:
    for folder in ("results/ledger", f"{RUN}/qualification", f"{RUN}/report/qualification"):
        shutil.rmtree(workdir / folder)


def first_selection(workdir: Path) -> None:  # a qualified run is frozen at planning: it was never qualified either
    first_qualification(workdir)
    shutil.rmtree(workdir / f"{RUN}/selection")
    shutil.rmtree(workdir / "results/artifacts")


def forced_qualification(workdir: Path) -> None:  # the recorded-result path: the ledger entry exists
    (workdir / f"{RUN}/qualification/sentinel.json").unlink()


ARTIFACT = "artifact"  # the selected artifact's name (sha256-<digest>.pt) is read from the finished run
QUALIFY_FILES = ["base.json", "metrics.json", "accuracy_vs_snr.png", "confusion_matrix.png", "run_manifest.json", "provenance.json"]
POINTS = [(first_qualification, f"{name}:{when}") for name in [*QUALIFY_FILES, "sentinel.json"] for when in ("before", "after")]
POINTS += [
    (first_selection, f"{name}:after") for name in (ARTIFACT, "selection.json", "model_card.json", "provenance.json", "sentinel.json")
]
POINTS += [(first_selection, "selection.json:before"), (first_selection, "sentinel.json:before")]
POINTS += [(forced_qualification, "run_manifest.json:after"), (forced_qualification, "metrics.json:before")]


def deterministic_files(workdir: Path) -> dict[str, bytes]:
    """Every results file but logs and provenance records (times, hosts, pids)."""
    files = {}
    for path in sorted((workdir / "results").rglob("*")):
        relative = path.relative_to(workdir).as_posix()
        if path.is_file() and not relative.startswith("results/logs/") and path.name != "provenance.json":
            files[relative] = path.read_bytes()
    return files


# Every point runs in `make test` (the tiny run unexported: a resume is its selection and qualification steps alone);
# each point is a work unit of its own for pytest-xdist (conftest.SPLIT), so both workers share the battery.
@pytest.mark.parametrize("setup, point", [pytest.param(setup, point, id=f"{setup.__name__}-{point}") for setup, point in POINTS])
def test_a_kill_at_any_point_resumes_to_the_same_bytes(finished_workdir: Path, tmp_path: Path, setup, point: str):
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    if point.startswith(ARTIFACT):
        point = point.replace(ARTIFACT, next((finished_workdir / "results/artifacts").iterdir()).name)
    setup(workdir)
    mark = tmp_path / "killed"
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])),
        "RFFM_KILL_AT": point,
        "RFFM_KILL_MARK": str(mark),
    }
    command = [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(workdir), "--configfile", str(workdir / "config.yaml")]
    if setup is forced_qualification:
        command += ["--forcerun", "qualify"]
    # forked warm (tests/warm_snakemake.py): a session of its own, whose jobs, fresh interpreters, read the hook
    killed = WARM.run([*command, "--cores", "2"], workdir, env)
    assert mark.exists(), f"the kill point {point} was never reached ({killed.returncode}):\n{killed.stderr[-3000:]}"

    clear_stale_lock(workdir)
    snakemake(workdir, "--rerun-incomplete")

    resumed, uninterrupted = deterministic_files(workdir), deterministic_files(finished_workdir)
    assert sorted(resumed) == sorted(uninterrupted)
    assert [name for name in resumed if resumed[name] != uninterrupted[name]] == []
    left = [p for root in ("results", "scratch") for p in (workdir / root).rglob("*.tmp")]
    assert left == [], left
    # the ledger entry is as write-once as the uninterrupted run's (a kill between its link and its lock: locked on resume)
    protections = [[what for _, what in ledger.protections(PosixStore(w / "results"))] for w in (workdir, finished_workdir)]
    assert protections[0] == protections[1], protections


def test_after_a_kill_the_plan_names_rffm_unlock_and_plain_snakemake_resumes(fresh_workdir: Path, finished_workdir: Path):
    """Issue 23: the next `snakemake` prints the `rffm unlock` line before Snakemake's own lock paragraph; after
    `rffm unlock` (exit 0: it removed a lock) plain `snakemake` in the checkout resumes without --rerun-incomplete
    (profiles/default says rerun-incomplete: true)."""
    from conftest import sigkill_once_started

    # plain `snakemake` in the checkout (cwd: so profiles/default applies), on the work directory
    command = [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(fresh_workdir), "--configfile", str(fresh_workdir / "config.yaml")]
    command += ["--cores", "2"]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RFFM_PLAIN_PROGRESS": "1"}
    sigkill_once_started(command, REPO, env, fresh_workdir / "results/logs/train_epoch/base/2.log")
    assert not (fresh_workdir / f"{RUN}/epochs/2/sentinel.json").exists(), "epoch 2 finished before the kill"

    locked = WARM.run_any(command, REPO, env)
    assert locked.returncode != 0
    line = f"rffm: {fresh_workdir} is locked by a run that was killed"
    ours, theirs = locked.stderr.find(line), locked.stderr.find("Directory cannot be locked")
    assert ours != -1 and ours < theirs, locked.stderr[-3000:]
    assert f"Fix: `rffm unlock {fresh_workdir}`, then run snakemake again\n" in locked.stderr

    unlocked = subprocess.run([str(BIN / "rffm"), "unlock", str(fresh_workdir)], capture_output=True, text=True)
    assert unlocked.returncode == 0 and "removed the lock of a killed run" in unlocked.stdout
    again = subprocess.run([str(BIN / "rffm"), "unlock", str(fresh_workdir)], capture_output=True, text=True)
    assert again.returncode == 1 and again.stdout.strip().endswith("not locked")

    resumed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rffm unlock" not in resumed.stderr
    for name in ("epochs/3/checkpoint.pt", "selection/selection.json", "qualification/metrics.json"):
        assert (fresh_workdir / RUN / name).read_bytes() == (finished_workdir / RUN / name).read_bytes(), name


def test_a_run_started_outside_the_checkout_resumes_after_a_kill(selected_workdir: Path):
    """Issue 34: plain `snakemake -s <checkout>/workflow/Snakefile -d <dir>` started outside the checkout (the conftest
    helper's way) reruns what a kill interrupted instead of stopping at IncompleteFilesException: Snakemake finds the
    workflow profile beside the Snakefile (workflow/profiles/default, a link to profiles/default) from anywhere. The
    kill is Snakemake's own record of it: the epoch's output marked incomplete, as Snakemake marks a job's outputs
    when it starts it (.snakemake/incomplete/<urlsafe base64 of the path>)."""
    output = f"{RUN}/epochs/3/checkpoint.pt"
    marker = selected_workdir / ".snakemake/incomplete" / base64.urlsafe_b64encode(output.encode()).decode()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"external_jobid": None}))
    resumed = snakemake(selected_workdir, "-n", "validation_selection")
    assert plan_of(resumed.stdout) == ["plot_training[run=base]", "select_checkpoint[run=base]", "train_epoch[run=base, epoch=3]"]
