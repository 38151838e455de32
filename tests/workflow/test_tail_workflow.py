"""Tail adaptation through the real workflow (issue 49): the tiny run with its backbone's block trained beside the head
reads the same one cache, qualifies, and exports a classifier holding the adapted tail whose val accuracy is the
selection's (the export's own check, bit for bit for the .pt2); `rffm predict` reproduces it; verify is clean."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, plan_of, snakemake, tiny_config, write_config
from rffm.cli import main

pytestmark = pytest.mark.workflow


def tail_config() -> dict:
    config = tiny_config(export=True)
    config["backbones"]["mini"]["arch"]["output_layers"] = 2  # the embedding and the block: the block's input is cached
    config["runs"]["base"]["train"]["tail"] = {"blocks": 1, "lr": 0.003}
    config["runs"]["base"].pop("profiling")
    return config


def test_a_tail_run_qualifies_and_exports_the_adapted_tail(fresh_workdir: Path, capsys):
    write_config(fresh_workdir, tail_config())
    snakemake(fresh_workdir)
    run = fresh_workdir / "results/runs/base"
    selection = json.loads((run / "selection/selection.json").read_text())
    metrics = json.loads((run / f"epochs/{selection['epoch']}/metrics.json").read_text())
    card = json.loads((run / "export/model_card.json").read_text())
    check = card["validation_check"]
    assert check["rffm_matches_selection"] is True and check["pt2"]["max_abs_logit_difference"] == 0.0
    assert check["rffm_accuracy"] == check["pt2"]["accuracy"] == metrics["val_accuracy"]
    env = {**os.environ, "RFFM_PLAIN_PROGRESS": "1"}
    done = subprocess.run(
        [str(BIN / "rffm"), "predict", "results/runs/base/export", "results/datasets/tiny/val.h5", "--out", "val.json"],
        cwd=fresh_workdir,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((fresh_workdir / "val.json").read_text())["accuracy"] == metrics["val_accuracy"]
    assert plan_of(snakemake(fresh_workdir, "-n").stdout) == []
    assert main(["verify", str(fresh_workdir / "results")]) == 0, capsys.readouterr().out
