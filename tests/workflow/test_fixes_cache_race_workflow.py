"""Issue 34, acceptance 2: the refusals of an epoch that meets its node-local hidden-state cache changed under it.

In a co-located group job (cache.colocate: per-cache) the epochs of several runs share one node's
`<scratch>/<dataset>__<backbone>/`, so another job may remove or rebuild it between an epoch's `ensure()` and its
`open_cache()`, or rebuild the backbone the cache record names before the epoch builds the cache. Each race is
provoked in the real `rffm train_epoch` job of a Snakemake run (tests/cacherace/sitecustomize.py), on a copy of the
session's finished tree whose config holds one one-epoch run on its cache (the qualified run taken out: a rebuilt
backbone would leave its epochs stale); the printed Fixes are done as written and the rerun completes with
`rffm verify results` clean.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import BIN, REPO, SNAKEFILE, WARM, copy_workdir, snakemake, tiny_config, write_config
from fixes import fix_of
from rffm.cli import main
from rffm.config import entry_defaults

pytestmark = pytest.mark.workflow
HOOK = REPO / "tests" / "cacherace"
CACHE = Path("scratch/tiny__mini")  # the tiny config's scratch, dataset and backbone
EPOCH = "results/runs/raced/epochs/1/sentinel.json"  # the one epoch of the run every race hits


def raced(workdir: Path, race: str, backbone: dict) -> str:
    """Run the workflow to EPOCH with the race injected into its job; the job's refusal."""
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])),
        "RFFM_CACHE_RACE": json.dumps({"raced": race}),
        "RFFM_CACHE_RACE_BACKBONE": json.dumps(backbone),
    }
    command = [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(workdir), "--configfile", str(workdir / "config.yaml")]
    # forked warm although PYTHONPATH differs: Snakemake itself needs no hook, its jobs (started afresh) read it
    done = WARM.run([*command, "--cores", "1", EPOCH], workdir, env)
    assert done.returncode != 0, done.stderr[-3000:]
    log = (workdir / "results/logs/train_epoch/raced/1.log").read_text()
    return next(line for line in log.splitlines() if line.startswith("rffm train_epoch: error: "))


def test_an_epochs_cache_changed_by_another_job_is_fixed_by_the_printed_fix(finished_workdir: Path, tmp_path: Path, monkeypatch):
    """cache_reader.open_cache's three refusals (the cache's sentinel missing, a cache of another recipe, a file of it
    changed) and cache_local.ensure's (the backbone rebuilt since the cache record), met one after the other by the
    same epoch: delete the cache where the Fix says so, rerun snakemake, and the epoch completes with `rffm verify
    results` clean."""
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    shutil.rmtree(workdir / "results/runs")
    config = tiny_config()
    run = config["runs"].pop("base")
    run.pop("profiling")  # its traces take longer than the epoch
    config["runs"] = {"raced": {**run, "train": {**run["train"], "epochs": 1}}}
    write_config(workdir, config)
    rebuilt = entry_defaults("backbones", {"name": "mini", **config["backbones"]["mini"]})
    rebuilt["pretrain"]["seed"] += 1  # the same backbone trained by another invocation with another seed

    refusals = {race: raced(workdir, race, rebuilt) for race in ("missing", "recipe", "bytes")}
    said = {
        "missing": f"train_epoch refuses to start: {CACHE}/sentinel.json is missing: {CACHE} holds no cache.",
        "recipe": f"train_epoch refuses to start: {CACHE}/sentinel.json: a cache of another recipe",
        "bytes": f"train_epoch refuses to start: {CACHE}/val.hidden.bf16: missing (recorded",
    }
    assert [said[race] in refusals[race] for race in said] == [True] * 3, refusals
    assert {race: fix_of(line) for race, line in refusals.items()} == {
        "missing": "rerun snakemake.",
        "recipe": "rerun snakemake; the epoch that needs it builds it again.",
        "bytes": f"delete {CACHE}; the next run builds it again.",
    }
    shutil.rmtree(workdir / CACHE)  # the last one's Fix (the rerun of all: below)

    refusal = raced(workdir, "upstream", rebuilt)
    assert "results/backbones/mini/sentinel.json: not the backbone the cache record results/caches/tiny__mini names." in refusal
    assert fix_of(refusal) == "rerun snakemake."
    snakemake(workdir, EPOCH)  # the same command, without the races: the cache record is built again, then the epoch
    assert (workdir / EPOCH).is_file()
    monkeypatch.chdir(workdir)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["verify", "results"]) == 0, out.getvalue()
    assert "BROKEN" not in out.getvalue() and " 0 problem(s)" in out.getvalue(), out.getvalue()
