"""`rffm status` on a results tree with runs in different states."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from conftest import tiny_config
from rffm.cli import main
from rffm.ops.status import state_of

pytestmark = pytest.mark.workflow


def table(capsys) -> tuple[dict[str, list[str]], list[str]]:
    """Rows of the printed table by run name (cells split on runs of 2+ spaces), and the other lines."""
    import re

    lines = capsys.readouterr().out.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    rows, rest = {}, []
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line)
        if len(cells) == len(header):
            rows[cells[0]] = dict(zip(header, cells, strict=True))
        else:
            rest.append(line)
    return rows, rest


@pytest.fixture
def three_runs(workdir: Path) -> Path:
    """The finished tiny tree plus copies of its run cut back to 'selected' and to 'mid-training'."""
    runs = workdir / "results/runs"
    shutil.copytree(runs / "base", runs / "picked", symlinks=True)
    shutil.rmtree(runs / "picked/qualification")
    shutil.rmtree(runs / "picked/report/qualification")
    shutil.copytree(runs / "base", runs / "midway", symlinks=True)
    for done in ("epochs/2", "epochs/3", "selection", "qualification", "report", "profiling"):
        shutil.rmtree(runs / "midway" / done)
    config = tiny_config()
    for name in ("picked", "midway", "queued"):
        config["runs"][name] = config["runs"]["base"]
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    return workdir


def test_status_shows_each_run_state_from_its_sentinels(three_runs: Path, capsys):
    assert main(["status", str(three_runs / "results"), "--config", str(three_runs / "config.yaml")]) == 0
    rows, rest = table(capsys)
    state = {run: (row["state"], row["epochs"], row["selected"], row["test acc"] != "-", row["verify (fast)"]) for run, row in rows.items()}
    assert state == {
        "base": ("qualified", "3/3", "1", True, "ok"),
        "picked": ("selected", "3/3", "1", False, "ok"),
        "midway": ("training", "1/3", "-", False, "ok"),
        "queued": ("pending", "0/3", "-", False, "ok"),
    }
    # one distinct artifact has been evaluated on the tiny test split; every run of that split sees it
    assert rows["base"]["test exposure: run (split)"] == "once (split: 1 artifact)"
    assert rows["picked"]["test exposure: run (split)"] == "never (split: 1 artifact)"
    assert rows["base"]["artifact"] == rows["picked"]["artifact"] != "-"
    assert rows["midway"]["best val_accuracy @epoch"].endswith("@1")
    assert rest == [f"run manifest: {three_runs}/results/runs/base/qualification/run_manifest.json"]


def test_status_json_is_the_rows_the_table_shows(three_runs: Path, capsys):
    import json

    args = ["status", str(three_runs / "results"), "--config", str(three_runs / "config.yaml")]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    out, err = capsys.readouterr()
    [last] = out.splitlines()  # issue 50: stdout holds the JSON only (`rffm status --json | jq` reads it); the table on stderr
    assert err == printed
    rows = {row["run"]: row for row in json.loads(last)["rows"]}
    states = {run: row["state"] for run, row in rows.items()}
    assert states == {"base": "qualified", "picked": "selected", "midway": "training", "queued": "pending"}
    assert rows["picked"]["test_accuracy"] is None and rows["picked"]["exposure"] == [0, 1]
    assert f"{rows['midway']['best_value']:.3f} @1" in printed


def test_status_flags_a_damaged_run_and_names_the_file(three_runs: Path, capsys):
    selection = three_runs / "results/runs/picked/selection/selection.json"
    selection.write_text(selection.read_text().replace('"mode": "max"', '"mode": "min"'))
    main(["status", str(three_runs / "results"), "--config", str(three_runs / "config.yaml")])
    rows, rest = table(capsys)
    assert rows["picked"]["verify (fast)"] == "BROKEN (1)" and rows["base"]["verify (fast)"] == "ok"
    assert len([line for line in rest if line.startswith("BROKEN")]) == 1 and str(selection) in rest[0]
    main(["status", str(three_runs / "results"), "--full"])
    rows, _ = table(capsys)
    assert rows["picked"]["verify (full)"] == "BROKEN (1)"


def test_without_a_config_the_plan_comes_from_the_tree(three_runs: Path, capsys, monkeypatch):
    """base: its plan record; picked (copied, so no record of its own): the epochs its selection consumed;
    midway: nothing says its count. A tree without records falls back to config/config.yaml."""
    monkeypatch.chdir(three_runs)  # no config/config.yaml here
    main(["status", "results"])
    rows, _ = table(capsys)
    assert {run: (row["state"], row["epochs"]) for run, row in rows.items()} == {
        "base": ("qualified", "3/3"),
        "picked": ("selected", "3/3"),
        "midway": ("training", "1/?"),
    }
    for plan in (three_runs / "results/runs").glob("*/launch/plan-*.json"):
        plan.unlink()  # a tree from before plan records
    (three_runs / "config").mkdir()
    shutil.copy(three_runs / "config.yaml", three_runs / "config/config.yaml")  # its `results` is this tree
    main(["status", "results"])
    rows, _ = table(capsys)
    assert rows["midway"]["epochs"] == "1/3" and rows["queued"]["state"] == "pending"


def test_more_planned_epochs_turn_a_finished_run_back_to_training():
    assert state_of(3, 6, selected=True, qualified=True) == "training"
    assert state_of(3, 3, selected=False, qualified=False) == "trained"
    assert state_of(0, None, selected=False, qualified=False) == "pending"


def write_beat(results: Path, folder: str, updated_unix: float, **fields) -> Path:
    """A heartbeat as rffm.runtime.progress writes it (results/running/<folder, '/' as '+'>.json), its fields given."""
    import json

    beat = {"folder": folder, "unit": "batch", "updated_unix": updated_unix, "host": "another-host", "pid": 1, **fields}
    path = results / "running" / f"{folder.replace('/', '+')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(beat))
    return path


def test_status_names_each_running_step_with_its_rate_and_time_left(three_runs: Path, capsys):
    """Issue 50: under Snakemake a step's progress goes to its log; `rffm status` shows it from the step's heartbeat."""
    import re
    import time

    from rffm.ops import status

    results, now = three_runs / "results", time.time()
    write_beat(results, "backbones/mini", now - 12, name="pretrain_backbone", done=1020, total=2000, rate=0.9, eta_s=1088.9)
    write_beat(results, "runs/midway/epochs/2", now - 5, name="train_epoch midway/2", done=3, total=40, rate=1.5, eta_s=24.7)
    assert main(["status", str(results), "--config", str(three_runs / "config.yaml")]) == 0
    rows, rest = table(capsys)
    assert rows["midway"]["state"] == "training"
    assert re.fullmatch(
        r"running: pretrain_backbone \(backbones/mini\) 1,020/2,000 batch \(51%\), 0\.9 batch/s, about 18 min left \(updated \d+ s ago\)",
        rest[0],
    ), rest
    epoch = r"running: train_epoch midway/2 \(runs/midway/epochs/2\) 3/40 batch \(8%\), 1\.5 batch/s, about 25 s left"
    assert re.fullmatch(epoch + r" \(updated \d+ s ago\)", rest[1]), rest
    assert rest[2:] == [f"run manifest: {three_runs}/results/runs/base/qualification/run_manifest.json"]
    # each run's row (--json) holds the heartbeats of the steps it waits on: its own, and the backbone every run reads
    rows = {row["run"]: row for row in status.collect(results, yaml.safe_load((three_runs / "config.yaml").read_text()), now=now)}
    assert [beat["folder"] for beat in rows["midway"]["running"]] == ["backbones/mini", "runs/midway/epochs/2"]
    assert [beat["folder"] for beat in rows["queued"]["running"]] == ["backbones/mini"]
    assert [(beat["age_s"], beat["state"]) for beat in rows["midway"]["running"]] == [(12.0, "running"), (5.0, "running")]


def test_a_stale_or_dead_heartbeat_is_not_shown_as_running(tmp_path: Path):
    import socket
    import subprocess
    import sys

    from rffm.ops import status

    results, now = tmp_path / "results", 1_700_000_000.0
    write_beat(results, "backbones/mini", now - 25 * 60, name="pretrain_backbone", done=1020, total=2000, rate=0.9, eta_s=1088.9)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    pid = int(ended.stdout)  # a process of this host that has ended: its step was killed before it removed its heartbeat
    left = write_beat(results, "datasets/tiny", now - 30, name="stage_dataset tiny", done=5, total=10, host=socket.gethostname(), pid=pid)
    (results / "running/half.json").write_text('{"done": 3')  # not a heartbeat: left out, never an error
    (results / "running/runs+base+epochs+1.json.partial").write_text("{}")  # a write in progress: not read
    beats = {beat["folder"]: beat for beat in status.running_steps(results, now=now)}
    assert {folder: beat["state"] for folder, beat in beats.items()} == {"backbones/mini": "stalled", "datasets/tiny": "gone"}
    assert status.running_line(beats["backbones/mini"]) == (
        "stalled?: pretrain_backbone (backbones/mini) at 1,020/2,000 batch (51%), no progress reported for 25 min"
        " (hung, or its job was killed: see its log)"
    )
    assert status.running_line(beats["datasets/tiny"]) == (
        f"not running: stage_dataset tiny (datasets/tiny) stopped at 5/10 batch (50%) 30 s ago: its process {pid} on this host"
        f" is gone (killed?); its heartbeat {left} is left over (remove it)"
    )
    fresh = {**beats["backbones/mini"], "age_s": 12.0, "state": "running"}
    assert status.running_line(fresh) == (
        "running: pretrain_backbone (backbones/mini) 1,020/2,000 batch (51%), 0.9 batch/s, about 18 min left (updated 12 s ago)"
    )
