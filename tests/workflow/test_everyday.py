"""Everyday use on a finished run: experimenting destroys nothing; stale is not broken (issue 15)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import BIN, planned_jobs, snakemake, tiny_config, write_config
from rffm.records.files import read_json, sha256_file

pytestmark = pytest.mark.workflow
RUN = Path("results/runs/base")


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def rffm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rffm"), *args], cwd=cwd, capture_output=True, text=True)


def test_changing_a_qualified_run_is_refused_before_anything_runs_or_is_deleted(workdir: Path):
    before = tree_bytes(workdir / "results")
    config = tiny_config()
    config["runs"]["base"]["train"]["lr"] = 0.02
    write_config(workdir, config)
    for args in ([], ["validation_selection"], ["-n"], ["-n", "validation_selection"]):  # whatever the target (issue 34)
        result = snakemake(workdir, *args, check=False)
        assert result.returncode != 0, args
        output = result.stdout + result.stderr
        refusal = [line for line in output.splitlines() if line.startswith("rffm: runs.base was qualified")]
        assert len(refusal) == 1 and "runs.base.train.lr" in refusal[0], (args, output[-2000:])
        assert "Fix: restore runs.base and put the changed settings under a new id (copy runs.base to runs.base_2" in refusal[0]
        assert "Traceback" not in output
        assert tree_bytes(workdir / "results") == before  # nothing ran, nothing was deleted

    # the fix, literally: runs.base restored, the changed settings under runs.base_2, `snakemake validation_selection`
    fixed = tiny_config()
    fixed["runs"]["base_2"] = config["runs"]["base"]
    write_config(workdir, fixed)
    epochs = [f"train_epoch[run=base_2, epoch={e}]" for e in (1, 2, 3)]
    new_jobs = [*epochs, "select_checkpoint[run=base_2]", "plot_training[run=base_2]"]
    assert planned_jobs(workdir, "validation_selection") == sorted(new_jobs)
    snakemake(workdir, "validation_selection")
    after = tree_bytes(workdir / "results")
    assert {name: after[name] for name in before} == before  # the qualified run and everything else, byte for byte
    first = read_json(workdir / RUN / "selection/selection.json")["artifact_path"]
    second = read_json(workdir / "results/runs/base_2/selection/selection.json")["artifact_path"]
    assert second != first and (workdir / "results" / first).exists() and (workdir / "results" / second).exists()
    for artifact in (first, second):
        assert sha256_file(workdir / "results" / artifact) == Path(artifact).name.removeprefix("sha256-").removesuffix(".pt")
    assert rffm("verify", "results", "--config", "config.yaml", cwd=workdir).returncode == 0


def test_stale_is_not_broken_and_prune_removes_exactly_it(selected_workdir: Path):
    workdir = selected_workdir  # base not qualified yet: its epochs may change (a qualified run's are frozen)
    config = tiny_config()
    config["runs"]["base"]["train"]["epochs"] = 5  # more epochs, as an experiment, then put back
    write_config(workdir, config)
    snakemake(workdir, "validation_selection")
    config = tiny_config()
    config["runs"]["extra"] = {**config["runs"]["base"], "train": {**config["runs"]["base"]["train"], "seed": 1}}
    config["runs"]["extra"].pop("profiling")
    write_config(workdir, config)  # epochs back to 3, and another run, qualified
    snakemake(workdir)
    write_config(workdir, tiny_config())  # the other run removed again
    assert planned_jobs(workdir) == []

    # the tree's records still say a config planned `extra` (removed since without running the workflow):
    # judged by config.yaml only when told so
    JUDGED = ("results", "--config", "config.yaml", "--by-config")
    verify = rffm("verify", *JUDGED, cwd=workdir)
    assert verify.returncode == 0, verify.stdout
    stale = sorted(line.split()[1] for line in verify.stdout.splitlines() if line.startswith("STALE"))
    expected = ["results/runs/base/epochs/4", "results/runs/base/epochs/5"]
    expected += [f"results/runs/extra/{folder}" for folder in ("epochs/1", "epochs/2", "epochs/3", "qualification")]
    expected += [f"results/runs/extra/{folder}" for folder in ("report/qualification", "report/validation", "selection")]
    assert stale == sorted(expected)
    status = rffm("status", *JUDGED, cwd=workdir)
    assert status.returncode == 0 and "base  qualified  3/3" in status.stdout and "stale: runs/extra" in status.stdout

    listed = rffm("prune", *JUDGED, cwd=workdir)
    assert sorted(line.split()[1] for line in listed.stdout.splitlines() if line.startswith("stale ")) == sorted(expected)
    assert all((workdir / folder).exists() for folder in expected)  # a dry run first
    kept = {p for p in (workdir / "results").rglob("*") if p.is_file() and p.parts[-1] != "sentinel.json"}
    rffm("prune", *JUDGED, "--delete", "--delete-qualified", "extra", cwd=workdir)  # extra is qualified: named
    assert not any((workdir / folder).exists() for folder in expected)
    assert len(list((workdir / "results/ledger").rglob("*.json"))) == 2  # the ledger keeps both qualifications
    assert (workdir / "results/runs/extra/launch").exists() or not (workdir / "results/runs/extra").exists()
    remaining = {p for p in kept if p.exists()}
    assert all(not any(str(p).startswith(str(workdir / f)) for f in expected) for p in remaining)
    assert rffm("verify", *JUDGED, cwd=workdir).returncode == 0
    assert planned_jobs(workdir) == []
