"""`rffm record`: a command's last JSON line, its other stdout lines and its stderr (a Snakemake run's log, the table of
a `--json` command) kept in the record (issues 48 and 50)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rffm.report.measurement import record

SCRIPT = "import sys; print('the table', file=sys.stderr, flush=True); print('a line'); print('{\"rows\": [1]}')"


def test_a_record_keeps_stdout_json_the_other_lines_and_stderr(tmp_path: Path, capsys):
    path = record("demo", [sys.executable, "-c", SCRIPT], tmp_path / "records", cwd=tmp_path, note="n")
    body = json.loads(path.read_text())
    assert (body["output"], body["printed"], body["log"]) == ({"rows": [1]}, ["a line"], ["the table"])
    echoed = capsys.readouterr()
    assert echoed.out.splitlines() == ["a line", '{"rows": [1]}'] and echoed.err.startswith("the table\n")
