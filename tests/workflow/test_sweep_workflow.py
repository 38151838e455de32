"""A sweep on the tiny configuration, through the real workflow (issue 21's acceptance 1-3)."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path

import pytest

from conftest import BIN, copy_workdir, plan_of, planned_jobs, snakemake, tiny_config, write_config
from fixes import fix_of
from rffm.config import entry_defaults
from rffm.errors import ConfigError, IntegrityError
from rffm.steps import select_checkpoint, train_epoch
from rffm.training import sweep

pytestmark = pytest.mark.workflow

EPOCHS = [f"train_epoch[run=base, epoch={e}]" for e in (1, 2, 3)]
GRID = {"train.lr": [0.003, 0.01, 0.03], "train.weight_decay": [0.0, 0.01]}
NAMES = [m["name"] for m in sweep.members({"run": "base", "sweep": GRID})]


def sweep_config(grid: dict = GRID) -> dict:
    config = tiny_config()
    config["runs"]["base"]["sweep"] = grid
    return config


def bundle_files(workdir: Path, epoch: int) -> Path:
    return workdir / f"results/runs/base/epochs/{epoch}/checkpoint.pt"


@pytest.fixture(scope="module")
def selected(tmp_path_factory) -> Path:
    """The tiny workflow with a 3 x 2 sweep, run up to selection once per module (copy it before changing anything)."""
    workdir = tmp_path_factory.mktemp("sweep")
    write_config(workdir, sweep_config())
    plan = snakemake(workdir, "-n", "-p", "validation_selection").stdout
    for name in NAMES:  # the dry run names the members (in the epoch jobs' commands)
        assert f"[{name}]" in plan
    jobs = plan_of(plan)  # one epoch job per epoch for all six members, one selection
    assert [j for j in jobs if j.startswith(("train_epoch", "select_checkpoint"))] == sorted(EPOCHS + ["select_checkpoint[run=base]"])
    snakemake(workdir, "validation_selection")
    return workdir


def test_a_sweep_is_one_job_per_epoch_one_selection_and_one_exposure(selected: Path, tmp_path: Path):
    """Acceptance 1: 3 x 2 grid (lr x weight decay); the model card names the chosen member and lists all six."""
    workdir = copy_workdir(selected, tmp_path / "w")
    assert [j for j in planned_jobs(workdir) if not j.startswith(("summarize", "plot"))] == ["qualify[run=base]"]
    for epoch in (1, 2, 3):
        assert sweep.bundle_members(bundle_files(workdir, epoch)) == NAMES
    snakemake(workdir)
    selection = json.loads((workdir / "results/runs/base/selection/selection.json").read_text())
    card = json.loads((workdir / "results/runs/base/selection/model_card.json").read_text())
    assert card["sweep"]["member"] == selection["member"] in NAMES
    assert [m["name"] for m in card["sweep"]["members"]] == NAMES and len(card["sweep"]["validation"]) == 6 * 3
    manifest = json.loads((workdir / "results/runs/base/qualification/run_manifest.json").read_text())
    assert manifest["qualification"]["exposure_count"] == 1
    assert manifest["selection"]["member"] == selection["member"]
    assert len(list((workdir / "results/ledger").rglob("*.json"))) >= 1
    status = subprocess.run([str(BIN / "rffm"), "status", str(workdir / "results")], capture_output=True, text=True, check=True).stdout
    assert f"[{selection['member']}]" in status
    compare = subprocess.run([str(BIN / "rffm"), "compare", str(workdir / "results")], capture_output=True, text=True, check=True).stdout
    assert f"base [{selection['member']}]" in compare
    # the qualified-run freeze covers the grid: changing it is refused before any job, whatever the target (issue 34:
    # validation_selection used to reselect the qualified sweep in place, leaving its qualification BROKEN)
    before = {p: p.read_bytes() for p in sorted((workdir / "results").rglob("*")) if p.is_file()}
    write_config(workdir, sweep_config({**GRID, "train.lr": [0.003, 0.01]}))
    for target in ("final_qualification", "validation_selection"):
        for dry in (["-n"], []):
            refused = snakemake(workdir, *dry, target, check=False)
            assert refused.returncode != 0 and "runs.base.sweep.train.lr" in refused.stdout + refused.stderr, (target, dry)
    assert {p: p.read_bytes() for p in sorted((workdir / "results").rglob("*")) if p.is_file()} == before
    verify = subprocess.run([str(BIN / "rffm"), "verify", str(workdir / "results")], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_adding_an_lr_value_trains_only_the_new_members(selected: Path, tmp_path: Path):
    """Acceptance 3: the epoch jobs are planned again, then selection; old members restored, their files unchanged."""
    workdir = copy_workdir(selected, tmp_path / "w")
    before = {e: bundle_files(workdir, e).read_bytes() for e in (1, 2, 3)}
    grown = {**GRID, "train.lr": [*GRID["train.lr"], 0.1]}
    write_config(workdir, sweep_config(grown))
    assert planned_jobs(workdir, "validation_selection") == sorted(EPOCHS + ["select_checkpoint[run=base]", "plot_training[run=base]"])
    # issue 34: a selection or an epoch run by hand against the grown grid refuses; its Fix, rerunning snakemake, works
    spec = entry_defaults("runs", {"run": "base", **sweep_config(grown)["runs"]["base"]})
    run_dir = workdir / "results/runs/base"
    select = partial(select_checkpoint.run, spec, [run_dir / f"epochs/{e}" for e in (1, 2, 3)], run_dir / "selection")
    with pytest.raises(IntegrityError, match="its metrics hold no member") as refused:
        select(store=str(workdir / "results"))
    with pytest.raises(ConfigError, match="planned members") as planned:
        train_epoch.check_planned_members(spec, sweep.plan_label({"run": "base", "sweep": GRID}))
    assert fix_of(refused) == fix_of(planned) == "rerun snakemake."
    snakemake(workdir, "validation_selection")
    sentinel = (run_dir / "selection/sentinel.json").read_bytes()
    assert select(store=str(workdir / "results")).read_bytes() == sentinel  # the same call now selects, the same bytes
    train_epoch.check_planned_members(spec, sweep.plan_label(spec))
    new = [m["name"] for m in sweep.members({"run": "base", "sweep": grown}) if m["name"] not in NAMES]
    assert new == ["lr=0.1,weight_decay=0.0", "lr=0.1,weight_decay=0.01"]
    for epoch in (1, 2, 3):
        log = (workdir / f"results/logs/train_epoch/base/{epoch}.log").read_text()
        for name in NAMES:
            assert f"member {name} restored from the memo" in log
            assert sweep.read_member(bundle_files(workdir, epoch), name, "checkpoint.pt") == sweep.read_member(
                _bytes_file(tmp_path, before[epoch]), name, "checkpoint.pt"
            )
        for name in new:
            assert f"member {name} trained" in log
        record = json.loads((workdir / f"results/runs/base/epochs/{epoch}/provenance.json").read_text())
        assert record["members_trained"] == new
    # removing a value retrains nothing (every member restored), then selection again
    write_config(workdir, sweep_config({**GRID, "train.lr": [0.003, 0.01]}))
    snakemake(workdir, "validation_selection")
    for epoch in (1, 2, 3):
        assert "members_trained" not in json.loads((workdir / f"results/runs/base/epochs/{epoch}/provenance.json").read_text())


def test_a_member_equals_the_one_member_run_of_its_settings(selected: Path, tmp_path: Path):
    """Acceptance 2: cmp of each member's last checkpoint against the same settings run alone (no sweep)."""
    for member in sweep.members({"run": "base", "sweep": GRID})[::5]:  # first and last: the others are the unit test's
        alone = tmp_path / member["name"]
        alone.mkdir()
        config = tiny_config()
        config["runs"]["base"]["train"] = sweep.member_train(config["runs"]["base"]["train"], member["settings"])
        write_config(alone, config)
        snakemake(alone, "validation_selection")
        plain = (alone / "results/runs/base/epochs/3/checkpoint.pt").read_bytes()
        assert sweep.read_member(bundle_files(selected, 3), member["name"], "checkpoint.pt") == plain


def _bytes_file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "before.zip"
    path.write_bytes(data)
    return path


TAPS = [["output 0"], ["output 1"], ["output 0", "output 1"]]


def test_a_sweep_over_taps_reads_one_cache_and_qualifies_the_chosen_heads_taps(tmp_path: Path):
    """Which cached taps the head reads, as a sweep key: unknown names refused at plan time, then one cache, one exposure."""
    config = tiny_config()
    config["backbones"]["mini"]["arch"]["output_layers"] = 2
    config["runs"]["base"]["train"]["epochs"] = 2
    config["runs"]["base"]["sweep"] = {"train.head.taps": [*TAPS, ["output 2"]]}
    write_config(tmp_path, config)
    refused = snakemake(tmp_path, "-n", check=False)
    assert refused.returncode != 0
    said = "runs.base.sweep.train.head.taps: 'output 2' is not a tap of backbone mini (its cache holds output 0, output 1)"
    assert said in refused.stderr
    config["runs"]["base"]["sweep"] = {"train.head.taps": TAPS}
    write_config(tmp_path, config)
    snakemake(tmp_path, "validation_selection")
    alone = copy_workdir(tmp_path, tmp_path.parent / f"{tmp_path.name}-alone")  # before the qualification freezes base
    snakemake(tmp_path)
    names = ["head.taps=output 0", "head.taps=output 1", "head.taps=output 0+output 1"]
    assert sweep.bundle_members(bundle_files(tmp_path, 2)) == names
    card = json.loads((tmp_path / "results/runs/base/selection/model_card.json").read_text())
    chosen = TAPS[names.index(card["sweep"]["member"])]
    assert card["head_config"].get("read") == (None if len(chosen) == 2 else [int(chosen[0][-1])])
    assert card["head_config"]["layers"] == len(chosen)
    manifest = json.loads((tmp_path / "results/runs/base/qualification/run_manifest.json").read_text())
    assert manifest["qualification"]["exposure_count"] == 1
    # a member equals the plain run of its taps: the same cache, only the epochs planned again
    config["runs"]["base"].pop("sweep")
    config["runs"]["base"]["train"]["head"] = {"taps": ["output 1"]}
    write_config(alone, config)
    planned = planned_jobs(alone, "validation_selection")
    assert not [job for job in planned if job.startswith(("build_cache", "pretrain", "stage"))], planned
    snakemake(alone, "validation_selection")
    plain = (alone / "results/runs/base/epochs/2/checkpoint.pt").read_bytes()
    assert sweep.read_member(bundle_files(tmp_path, 2), "head.taps=output 1", "checkpoint.pt") == plain
