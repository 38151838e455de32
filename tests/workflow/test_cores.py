"""Results do not depend on --cores (issue 25): the torch thread count a step computes with comes from the
config alone (Snakemake's --cores caps only the scheduling) and the sentinels of the threaded steps record it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import snakemake, tiny_config, write_config

pytestmark = pytest.mark.workflow
THREADED = ("backbones/mini", "caches/tiny__mini", "runs/base/epochs/1", "runs/base/epochs/2", "runs/base/epochs/3")


def test_one_core_and_two_cores_give_the_same_bytes(tmp_path: Path):
    trees = {}
    for cores in ("1", "2"):
        workdir = tmp_path / f"cores-{cores}"
        workdir.mkdir()
        config = tiny_config()
        config.update(threads=2, epoch_threads=2)  # more threads than one core: --cores 1 used to cap them at 1
        config["runs"]["base"].pop("profiling")
        write_config(workdir, config)
        snakemake(workdir, "--cores", cores, "validation_selection")  # the last --cores wins
        results = workdir / "results"
        selection = json.loads((results / "runs/base/selection/selection.json").read_text())
        trees[cores] = {
            "backbone.pt": (results / "backbones/mini/backbone.pt").read_bytes(),
            "artifact": selection["artifact_sha256"],
            **{folder: (results / folder / "sentinel.json").read_bytes() for folder in (*THREADED, "runs/base/selection")},
        }
        for folder in THREADED:  # each threaded step says how many threads it computed with
            assert json.loads(trees[cores][folder])["torch_threads"] == 2, (cores, folder)
    assert trees["1"] == trees["2"]
