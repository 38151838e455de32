"""The plan's cost on the real workflow (issue 47): a finished pilot is recorded (`rffm throughput`), the plan of more
work then predicts each stage's hours from it, `rffm status --cost` sets them against the measured seconds, and every
`Fix:` the cost notes print is followed here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import rfdata
from conftest import copy_workdir, snakemake
from rffm.cli import main

pytestmark = pytest.mark.workflow


def cost_notes(workdir: Path, *args: str) -> list[str]:
    """The `note: cost:` lines of a dry run."""
    return [line for line in snakemake(workdir, "-n", *args).stderr.splitlines() if line.startswith("note: cost: ")]


def test_a_recorded_pilot_predicts_the_plan_and_status_sets_it_against_the_measured(finished_workdir: Path, tmp_path: Path, capsys):
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    (line,) = cost_notes(workdir)
    assert re.fullmatch(r"note: cost: no throughput record, so the plan cannot predict its hours\. Fix: run a pilot .*", line)
    # the Fix: the finished tree is the pilot; record it, then name the record
    record = workdir / "throughput.json"
    assert main(["throughput", str(workdir / "results"), "--config", str(workdir / "config.yaml"), "--out", str(record)]) == 0
    assert re.fullmatch(r"\S+throughput\.json: \d+ job\(s\) of \S+ recorded \(\d+ in all\)\n", capsys.readouterr().out)
    config["throughput"] = str(record)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    assert cost_notes(workdir)[-1].startswith("note: cost: in all 0 job(s) to run (")

    capsys.readouterr()
    assert main(["status", str(workdir / "results"), "--config", str(workdir / "config.yaml"), "--cost", "--json"]) == 0
    stages = {row["stage"]: row for row in json.loads(capsys.readouterr().out)["stages"]}
    assert {"stage_dataset", "pretrain_backbone", "build_cache", "train_epoch", "select_checkpoint", "qualify"} <= set(stages)
    for row in stages.values():  # fitted on these very jobs, each stage of equal-sized jobs: predicted is measured
        assert row["measured_jobs"] == row["jobs"] and row["measured_over_predicted"] == pytest.approx(1.0, abs=0.002), row
        assert 0 < row["peak_rss_mb"] < 4000

    base = config["runs"]["base"]
    config["runs"]["seed1"] = {**base, "train": {**base["train"], "seed": 1}}  # another seed: the same jobs' work
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    notes = cost_notes(workdir)
    epochs = base["train"]["epochs"]
    (epoch_line,) = [note for note in notes if note.startswith("note: cost: train_epoch: ")]
    assert re.fullmatch(rf"note: cost: train_epoch: {epochs} job\(s\) to run, \d+ s predicted", epoch_line), epoch_line
    assert int(epoch_line.split(", ")[1].split()[0]) == round(stages["train_epoch"]["measured_s"])
    assert notes[-1].startswith(f"note: cost: in all {epochs + 2} job(s) to run (")  # its epochs, selection, qualification


def test_a_source_of_unknown_size_is_costed_once_staged_as_the_fix_says(finished_workdir: Path, tmp_path: Path, capsys):
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    record = workdir / "throughput.json"
    assert main(["throughput", str(workdir / "results"), "--config", str(workdir / "config.yaml"), "--out", str(record)]) == 0
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    rfdata.write_rml2016_pickle(workdir / "rml2016.pkl", rfdata.rml2016_data())
    config["datasets"]["pickled"] = {"source": "radioml2016", "seed": 0, "radioml2016": {"path": "rml2016.pkl"}}
    config["runs"]["pickled"] = {**config["runs"]["base"], "dataset": "pickled", "backbone": config["runs"]["base"]["backbone"]}
    config["throughput"] = str(record)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (unknown,) = [note for note in cost_notes(workdir) if "datasets.pickled" in note]
    said = r"note: cost: datasets\.pickled: its size is not known before it is staged, .* Fix: snakemake (\S+) \(stage it first\)"
    fix = re.fullmatch(said, unknown)
    assert fix, unknown
    snakemake(workdir, fix[1])
    assert not [note for note in cost_notes(workdir) if "datasets.pickled" in note]
    assert any(note.startswith("note: cost: train_epoch: ") and "predicted" in note for note in cost_notes(workdir))
