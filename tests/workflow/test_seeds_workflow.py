"""Seeds as an axis in a real run: a second seed trains beside the first, which no file of it changes; compare shows
the two as one group; removing the seeds plans nothing and leaves the second seed's run stale, never deleted."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, planned_jobs, snakemake, tiny_config, write_config

pytestmark = pytest.mark.workflow


def rffm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rffm"), *args], cwd=cwd, capture_output=True, text=True)


def digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_second_seed_is_a_run_of_its_own_beside_the_first(workdir: Path):
    first = {part: digests(workdir / "results" / part) for part in ("runs/base", "backbones", "caches", "datasets")}
    config = tiny_config()
    config["runs"]["base"]["seeds"] = 2
    write_config(workdir, config)
    snakemake(workdir)
    for part, before in first.items():  # the first seed's run, its backbone, cache and data: not one byte rewritten
        after = digests(workdir / "results" / part)
        assert {name: after.get(name) for name in before} == before, part
        assert all(name.startswith("launch/") for name in set(after) - set(before)), part  # this start's plan record only
    assert planned_jobs(workdir) == []

    verify = rffm("verify", "results", cwd=workdir)
    assert verify.returncode == 0 and " 0 problem(s)" in verify.stdout, verify.stdout + verify.stderr
    compared = rffm("compare", "results", "--config", "config.yaml", "--json", cwd=workdir)
    assert compared.returncode == 0, compared.stderr
    printed = json.loads(compared.stdout)
    rows = {r["run"]: r for r in printed["rows"]}
    assert (rows["base"]["seed"], rows["base-seed1"]["seed"]) == (0, 1) and {r["group"] for r in rows.values()} == {"base"}
    (group,) = printed["groups"]
    assert group["runs"] == ["base", "base-seed1"] and group["seeds"] == 2
    assert group["accuracy"]["mean"] == pytest.approx((rows["base"]["accuracy"] + rows["base-seed1"]["accuracy"]) / 2)
    assert group["accuracy"]["min"] == min(r["accuracy"] for r in rows.values())
    line = next(line for line in compared.stderr.splitlines() if line.split()[1:4] == ["frozen", "backbone", "base"])
    assert line.split()[4] == "2" and "±sd" in line  # the seeds column and the spread

    config["runs"]["base"].pop("seeds")
    write_config(workdir, config)
    assert planned_jobs(workdir) == []
    prune = rffm("prune", "results", "--config", "config.yaml", "--by-config", cwd=workdir)
    assert prune.returncode == 0 and "runs/base-seed1" in prune.stdout, prune.stdout + prune.stderr
    assert (workdir / "results/runs/base-seed1/qualification/run_manifest.json").is_file()  # listed, not deleted
