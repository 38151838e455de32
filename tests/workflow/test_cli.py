import json
import os
import subprocess
import sys
from pathlib import Path

import rffm
from conftest import BIN, REPO, WARM
from rffm.cli import main, parser
from rffm.config import entry_defaults


def test_status_lists_runs_and_manifest_paths(finished_workdir: Path, capsys):
    assert main(["status", str(finished_workdir / "results")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["run", "state", "epochs"]
    assert lines[1].split()[:3] == ["base", "qualified", "3/3"]  # the planned count from the run's plan record
    assert lines[-1] == f"run manifest: {finished_workdir}/results/runs/base/qualification/run_manifest.json"


def test_errors_are_one_clear_line_without_traceback(tmp_path: Path):
    result = subprocess.run(
        [
            str(BIN / "rffm"),
            "train_epoch",
            "--spec",
            json.dumps(entry_defaults("runs", {"run": "r", "train": {"lr": 1, "batch_size": 2, "seed": 0}})),  # as the rule passes it
            "--epoch",
            "1",
            "--cache-record-dir",
            str(tmp_path),
            "--scratch",
            str(tmp_path / "scratch"),
            "--batch-size",
            "8",
            "--disk-headroom",
            "1.1",
            "--out-dir",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("rffm train_epoch: error:") and "sentinel is missing" in result.stderr
    assert "Traceback" not in result.stderr


def test_module_entry_point_matches_the_console_script():
    result = subprocess.run([sys.executable, "-m", "rffm", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "verify" in result.stdout and "train_epoch" in result.stdout
    version = subprocess.run([str(BIN / "rffm"), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"rffm {rffm.__version__}"


def test_every_rule_runs_the_verb_and_step_module_of_its_name():
    """A newcomer finds a rule's code from its name: `rffm <rule>` runs scripts/rffm/steps/<rule>.py."""
    listed = WARM.run_any([str(BIN / "snakemake"), "--list-rules"], REPO, dict(os.environ))
    assert listed.returncode == 0, listed.stderr
    rules = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()} - {"final_qualification", "validation_selection"}
    verbs = set(parser()._subparsers._group_actions[0].choices)
    modules = {path.stem for path in (REPO / "scripts/rffm/steps").glob("*.py")} - {"__init__"}
    assert rules == modules and rules <= verbs, (rules ^ modules, rules - verbs)
    texts = "".join(path.read_text() for path in (REPO / "workflow/rules").glob("*.smk"))
    assert all(f'"rffm {rule} ' in texts for rule in rules)
