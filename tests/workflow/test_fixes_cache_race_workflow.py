"""Issue 34, acceptance 2: the refusals of an epoch that meets its node-local hidden-state cache changed under it.

In a co-located group job (cache.colocate: per-cache) the epochs of several runs share one node's
`<scratch>/<dataset>__<backbone>/`, so another job may remove or rebuild it between an epoch's `ensure()` and its
`open_cache()`, or rebuild the backbone the cache record names before the epoch builds the cache. Each race is
provoked in the real `rffm train_epoch` job of a Snakemake run (tests/cacherace/sitecustomize.py), on a copy of the
session's finished tree whose config holds three one-epoch runs on its cache (the qualified run taken out: a rebuilt
backbone would leave its epochs stale); the printed Fixes are done as written and the rerun completes with
`rffm verify results` clean.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO, SNAKEFILE, copy_workdir, snakemake, tiny_config, write_config
from fixes import fix_of
from rffm.cli import main
from rffm.config import entry_defaults

pytestmark = pytest.mark.workflow
HOOK = REPO / "tests" / "cacherace"
CACHE = Path("scratch/tiny__mini")  # the tiny config's scratch, dataset and backbone
RUNS = ("r1", "r2", "r3")


def target(run: str) -> str:
    return f"results/runs/{run}/epochs/1/sentinel.json"


def raced(workdir: Path, races: dict[str, str], backbone: dict) -> dict[str, str]:
    """Run the workflow to the named runs' first epochs with the races injected, one job at a time; each run's refusal."""
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])),
        "RFFM_CACHE_RACE": json.dumps(races),
        "RFFM_CACHE_RACE_BACKBONE": json.dumps(backbone),
    }
    command = [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(workdir), "--configfile", str(workdir / "config.yaml")]
    command += ["--cores", "1", "--keep-going", *map(target, races)]
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
    assert done.returncode != 0, done.stderr[-3000:]
    logs = {run: (workdir / f"results/logs/train_epoch/{run}/1.log").read_text() for run in races}
    return {run: next(line for line in log.splitlines() if line.startswith("rffm train_epoch: error: ")) for run, log in logs.items()}


def test_an_epochs_cache_changed_by_another_job_is_fixed_by_the_printed_fix(finished_workdir: Path, tmp_path: Path, monkeypatch):
    """cache_reader.open_cache's three refusals (the cache's sentinel missing, a cache of another recipe, a file of it
    changed) and cache_local.ensure's (the backbone rebuilt since the cache record): delete the cache where the Fix
    says so, rerun snakemake, and the three epochs complete with `rffm verify results` clean."""
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    shutil.rmtree(workdir / "results/runs")
    config = tiny_config()
    base = config["runs"].pop("base")
    config["runs"] = {run: {**base, "train": {**base["train"], "epochs": 1}} for run in RUNS}
    write_config(workdir, config)
    rebuilt = entry_defaults("backbones", {"name": "mini", **config["backbones"]["mini"]})
    rebuilt["pretrain"]["seed"] += 1  # the same backbone trained by another invocation with another seed

    refusals = raced(workdir, {"r1": "missing", "r2": "recipe", "r3": "bytes"}, rebuilt)
    said = {
        "r1": f"train_epoch refuses to start: {CACHE}/sentinel.json is missing: {CACHE} holds no cache.",
        "r2": f"train_epoch refuses to start: {CACHE}/sentinel.json: a cache of another recipe",
        "r3": f"train_epoch refuses to start: {CACHE}/val.hidden.bf16: missing (recorded",
    }
    assert [said[run] in refusals[run] for run in said] == [True] * 3, refusals
    fixes = {run: fix_of(line) for run, line in refusals.items()}
    assert fixes == {
        "r1": "rerun snakemake.",
        "r2": "rerun snakemake; the epoch that needs it builds it again.",
        "r3": f"delete {CACHE}; the next run builds it again.",
    }
    shutil.rmtree(workdir / CACHE)  # r3's Fix; the others' and its "next run": below

    (refusal,) = raced(workdir, {"r1": "upstream"}, rebuilt).values()  # r1 again: its epoch has not run yet
    assert "results/backbones/mini/sentinel.json: not the backbone the cache record results/caches/tiny__mini names." in refusal
    assert fix_of(refusal) == "rerun snakemake."
    snakemake(workdir, *map(target, RUNS))  # the same command, without the races
    assert all((workdir / target(run)).is_file() for run in RUNS)
    monkeypatch.chdir(workdir)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["verify", "results"]) == 0, out.getvalue()
    assert "BROKEN" not in out.getvalue() and " 0 problem(s)" in out.getvalue(), out.getvalue()
