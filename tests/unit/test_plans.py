"""records/plans.py: what planned each run, recorded create-only, and the judgment the everyday commands use."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import tiny_config
from rffm.config import load_schema
from rffm.records import plans
from rffm.records.rebuild import rebuild_command
from rffm.records.seal import seal
from rffm.records.store import PosixStore


def resolved() -> dict:
    from rffm.config import fill_defaults

    config = tiny_config()
    schema = load_schema()
    fill_defaults(config, schema, schema)
    return config


def test_a_record_is_written_once_per_change_and_never_replaced(tmp_path: Path):
    store, config = PosixStore(tmp_path), resolved()
    (tmp_path / "c.yaml").write_text("x: 1\n")
    assert plans.record_plans(config, [tmp_path / "c.yaml"], {}, store, cwd=str(tmp_path)) == ["runs/base/launch/plan-1.json"]
    assert plans.record_plans(config, [tmp_path / "c.yaml"], {}, store, cwd=str(tmp_path)) == []
    config["runs"]["base"]["train"]["epochs"] = 5
    assert plans.record_plans(config, [tmp_path / "c.yaml"], {}, store, cwd=str(tmp_path)) == ["runs/base/launch/plan-2.json"]
    first = json.loads((tmp_path / "runs/base/launch/plan-1.json").read_text())
    assert first["plan"]["runs"]["base"]["train"]["epochs"] == 3 and first["files"][0]["path"] == "c.yaml"
    assert plans.latest(store, "base")[0] == 2


def test_judged_by_records_without_a_config_and_by_the_record_where_a_config_contradicts_it(tmp_path: Path):
    store, config = PosixStore(tmp_path), resolved()
    plans.record_plans(config, [], {}, store)
    (tmp_path / "runs/copied").mkdir(parents=True)
    judgment = plans.judge(tmp_path)
    assert set(judgment.config["runs"]) == {"base"} and judgment.unknown == ["copied"] and not judgment.notes
    assert judgment.is_planned("runs/base/epochs/3") and not judgment.is_planned("runs/base/epochs/4")
    assert judgment.is_planned("runs/copied/epochs/9")  # no plan speaks for it: never stale
    other = resolved()
    other["runs"]["base"]["train"]["epochs"] = 5
    other["runs"]["new"] = other["runs"]["base"]
    judged = plans.judge(tmp_path, other)
    assert len(judged.notes) == 1 and "runs base " in judged.notes[0] and "plan-1.json" in judged.notes[0]
    assert judged.config["runs"]["base"]["train"]["epochs"] == 3 and "new" in judged.config["runs"]
    assert plans.judge(tmp_path, other, by_config=True).config is other


def test_a_run_that_the_config_files_which_planned_it_no_longer_have_is_judged_removed(tmp_path: Path):
    """Issue 34 item 10: deleted from its config, a run is stale for the bare commands (no --by-config needed)."""
    store, config = PosixStore(tmp_path / "results"), resolved()
    config["runs"]["extra"] = config["runs"]["base"]
    written = tmp_path / "c.yaml"
    written.write_text("runs: {base: {}, extra: {}}\n")
    plans.record_plans(config, [written], {}, store, cwd=str(tmp_path))
    assert plans.judge(tmp_path / "results").has_run("extra") and not plans.judge(tmp_path / "results").notes
    written.write_text("runs: {base: {}}\n")  # extra deleted from the file that planned it
    judged = plans.judge(tmp_path / "results")
    assert set(judged.config["runs"]) == {"base"} and not judged.has_run("extra") and judged.has_run("base")
    assert len(judged.notes) == 1 and judged.notes[0].startswith("plan: runs extra are no longer in the config files that planned")
    assert not judged.is_planned("runs/extra/epochs/1") and judged.is_planned("runs/base/epochs/1")
    given = plans.judge(tmp_path / "results", resolved())  # --config without extra: removed too, not "contradicted"
    assert not given.has_run("extra") and len(given.notes) == 1 and "no longer in the config files" in given.notes[0]
    written.write_text("runs: [\n")  # half-edited: nothing to judge by, so the record speaks
    assert plans.judge(tmp_path / "results").has_run("extra")
    written.unlink()
    assert plans.judge(tmp_path / "results").has_run("extra")


def test_the_rebuild_command_carries_the_recorded_options_and_starts_where_the_tree_is(tmp_path: Path):
    store, config = PosixStore(tmp_path / "results"), resolved()
    plans.record_plans(config, [tmp_path / "tiny.yaml"], {"device": "cpu"}, store, replaced=True, cwd=str(tmp_path))
    sentinel = tmp_path / "results/runs/base/epochs/2/sentinel.json"
    assert rebuild_command(sentinel, cwd=tmp_path) == (
        "snakemake results/runs/base/epochs/2/sentinel.json --cores all --configfile tiny.yaml --replace-workflow-config "
        "--config device=cpu"
    )
    assert rebuild_command(sentinel, cwd=tmp_path / "elsewhere").startswith(f"cd {tmp_path} && snakemake results/")
    assert rebuild_command(sentinel, cwd=tmp_path, remove=True).startswith("rm -f results/runs/base/epochs/2/sentinel.json && ")


@pytest.mark.parametrize("damage", ["flip", "truncate", "edit", "other run"])
def test_a_damaged_plan_record_is_named_by_verify_and_never_judged_by(tmp_path: Path, damage: str):
    store, config = PosixStore(tmp_path), resolved()
    plans.record_plans(config, [], {}, store)
    path = tmp_path / "runs/base/launch/plan-1.json"
    data = bytearray(path.read_bytes())
    path.chmod(0o644)
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "edit":
        body = json.loads(bytes(data))
        body["plan"]["runs"]["base"]["train"]["epochs"] = 4  # edited, not resealed
        data = bytearray(json.dumps(body).encode())
    else:  # a record sealed for another run, put in this run's folder
        body = json.loads(bytes(data))
        body.pop("self_sha256")
        data = bytearray(seal({**body, "run": "other"}))
    path.write_bytes(bytes(data))
    problems = plans.plan_problems(tmp_path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}: "), problems
    assert plans.latest(store, "base") is None  # the commands never judge by it
    assert plans.judge(tmp_path).config is None
    subprocess.run(["bash", "-c", problems[0].split(" Fix: ", 1)[1]], cwd=tmp_path, check=True)  # the fix, as printed
    assert plans.plan_problems(tmp_path) == [] and plans.record_plans(config, [], {}, store) == ["runs/base/launch/plan-1.json"]
