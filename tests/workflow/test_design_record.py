"""The design behind a recipe (issue 48): config `design` names the committed records of the variants compared on val
before a run's settings were fixed; `rffm compare` lists them under the table and counts them with the selection's
members. Adding it plans nothing."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from conftest import copy_workdir, planned_jobs
from rffm.cli import main
from rffm.config.validate import problems

pytestmark = pytest.mark.workflow


def test_a_design_is_listed_and_counted_by_compare_and_plans_nothing(finished_workdir: Path, tmp_path: Path, capsys):
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    results, records = workdir / "results", tmp_path / "records"
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["design"] = {"base": ["pilot"]}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    assert planned_jobs(workdir) == []  # read by rffm compare only

    compare = ["compare", str(results), "--config", str(workdir / "config.yaml"), "--records", str(records)]
    capsys.readouterr()
    assert main(compare) != 0
    error = capsys.readouterr().err.strip()
    assert re.fullmatch(r"rffm compare: error: design\.base: \S+/pilot\.json: no record with rows\. Fix: .*rffm record pilot -- .*", error)
    # the Fix: record the variants compared on val (here the finished tree's own status) under that name
    assert main(["record", "--out-dir", str(records), "pilot", "--", sys.executable, "-m", "rffm", "status", str(results), "--json"]) == 0
    capsys.readouterr()
    assert main([*compare, "--json"]) == 0
    groups = {g["group"]: g for g in json.loads(capsys.readouterr().out.splitlines()[-1])["groups"]}
    design = groups["base"]["design"]
    assert [e["record"] for e in design] == ["pilot"] and [v["run"] for v in design[0]["variants"]] == ["base"]
    assert groups["base"]["val_variants"] == 1 + groups["base"]["members"]
    assert main(compare) == 0
    assert (
        "design of base: 2 settings compared on val in all - pilot (1 variants), then 1 member(s) by its selection"
        in capsys.readouterr().out
    )


def test_a_design_of_no_run_is_refused_and_its_fix_holds(finished_workdir: Path):
    config = yaml.safe_load((finished_workdir / "config.yaml").read_text())
    found = problems({**config, "design": {"nope": ["pilot"]}})
    assert found == ["design.nope: names no run or reference. Fix: key it by the id of the run or reference the design is behind"]
    assert problems({**config, "design": {"base": ["pilot"]}}) == []  # the Fix: keyed by the run's id
