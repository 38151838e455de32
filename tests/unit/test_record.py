"""`rffm record`: a command's last JSON line, its other stdout lines and its stderr (a Snakemake run's log, the table of
a `--json` command) kept in the record (issues 48 and 50)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rffm.records.files import sha256_file
from rffm.report.measurement import record

SCRIPT = "import sys; print('the table', file=sys.stderr, flush=True); print('a line'); print('{\"rows\": [1]}')"


def test_a_record_keeps_stdout_json_the_other_lines_and_stderr(tmp_path: Path, capsys):
    path = record("demo", [sys.executable, "-c", SCRIPT], tmp_path / "records", cwd=tmp_path, note="n")
    body = json.loads(path.read_text())
    assert (body["output"], body["printed"], body["log"]) == ({"rows": [1]}, ["a line"], ["the table"])
    echoed = capsys.readouterr()
    assert echoed.out.splitlines() == ["a line", '{"rows": [1]}'] and echoed.err.startswith("the table\n")


def test_a_record_names_what_its_command_read_by_digest(tmp_path: Path):
    """Issue 48: the files the command's arguments name, and a named results tree's run manifests and selection
    records, each with its sha256 (a --reads path likewise); options and absent paths are not in it."""
    config = tmp_path / "study.yaml"
    config.write_text("runs: {}\n")
    for run in ("a", "b"):
        for step in ("qualification/run_manifest.json", "selection/sentinel.json"):
            (tmp_path / "results/runs" / run / step).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "results/runs" / run / step).write_text(f"{run} {step}")
    (tmp_path / "results/runs/c/epochs").mkdir(parents=True)  # a run not yet selected: nothing of it read
    (tmp_path / "notes.txt").write_text("read too")
    command = [sys.executable, "-c", "print(1)", "results", f"--config={config.name}", "--json", "absent.yaml"]
    body = json.loads(record("demo", command, tmp_path / "records", cwd=tmp_path, reads=["notes.txt"]).read_text())
    expected = {
        "results/runs/a/qualification/run_manifest.json",
        "results/runs/b/qualification/run_manifest.json",
        "results/runs/a/selection/sentinel.json",
        "results/runs/b/selection/sentinel.json",
        "study.yaml",
        "notes.txt",
    }
    assert set(body["read"]) == expected
    assert body["read"]["notes.txt"] == sha256_file(tmp_path / "notes.txt")
    assert body["read"]["results/runs/a/selection/sentinel.json"] == sha256_file(tmp_path / "results/runs/a/selection/sentinel.json")
