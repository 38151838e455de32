"""Every figure the docs mark comes from a committed record (rffm.report.figures, rffm.report.measurement).

README.md, workflow/docs/performance.md and config/README.md agree with workflow/docs/records/ (the passages still
copied by hand are counted and reported, not failed); a hand-edited figure and a marker naming a missing record are
refused, and following each printed Fix (`rffm figures`; `rffm record NAME -- COMMAND`) makes the check pass.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from fixes import fix_of, run_fix
from rffm.report.figures import Records, differences, figures, formatted, unrecorded, value_at
from rffm.report.measurement import last_json

ROOT = Path(__file__).parents[2]
RECORDS = ROOT / "workflow/docs/records"
DOCS = ["README.md", "workflow/docs/performance.md", "config/README.md"]


def test_marked_figures_in_the_docs_equal_their_records():
    problems, marked, remaining = [], 0, []
    for document in DOCS:
        text = (ROOT / document).read_text()
        problems += differences(text, document, Records(RECORDS))
        marked += len(figures(text, document))
        remaining += [f"{document}: {why}" for _, why, _ in unrecorded(text)]
    assert not problems, "\n".join(problems)
    assert marked > 0
    assert not remaining, "passages copied by hand, with no record:\n" + "\n".join(remaining)


def _copy_docs(tmp_path: Path) -> Path:
    """The marked documents and the records, in a checkout-shaped folder."""
    for document in DOCS:
        (tmp_path / document).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / document, tmp_path / document)
    shutil.copytree(RECORDS, tmp_path / "workflow/docs/records")
    return tmp_path


def test_a_hand_edited_figure_is_refused_is_fixed_by_rffm_figures(tmp_path: Path):
    work = _copy_docs(tmp_path)
    document = next(name for name in DOCS if figures((ROOT / name).read_text(), name))  # the first one with a marked figure
    original = (work / document).read_text()
    figure = next(f for f in figures(original, document) if not f.block and f.format != "min_s")  # a number: 9.999 fits
    (work / document).write_text(original[: figure.start] + "9.999" + original[figure.end :])
    problems = differences((work / document).read_text(), document, Records(work / "workflow/docs/records"))
    assert len(problems) == 1 and "'9.999'" in problems[0], problems
    run_fix(fix_of(problems[0]), work)
    assert (work / document).read_text() == original
    assert not differences(original, document, Records(work / "workflow/docs/records"))


def test_a_marker_without_its_record_is_refused_is_fixed_by_recording_it(tmp_path: Path):
    work = _copy_docs(tmp_path)
    readme = work / "README.md"
    readme.write_text(readme.read_text() + "\nA new figure: <!-- rec probe_trial output.ratio .2f -->0.50.\n")
    problems = differences(readme.read_text(), "README.md", Records(work / "workflow/docs/records"))
    assert len(problems) == 1 and "no record" in problems[0], problems
    fix = fix_of(problems[0])
    assert fix.startswith("rffm record probe_trial -- <the command that measures it>"), fix
    # what the Fix says, with a measuring command that prints its JSON last
    command = f'rffm record probe_trial -- {sys.executable} -c \'print("measured"); print("{{\\"ratio\\": 0.5}}")\''
    run_fix(command, work)
    record = json.loads((work / "workflow/docs/records/probe_trial.json").read_text())
    assert record["output"] == {"ratio": 0.5} and record["printed"] == ["measured"]
    assert {"commit", "date", "command", "wall_s"} <= set(record) and {"cpu_model", "cores_online", "ram_gb", "gpus"} <= set(
        record["machine"]
    )
    assert not differences(readme.read_text(), "README.md", Records(work / "workflow/docs/records"))


@pytest.mark.parametrize(
    ("value", "spec", "text"),
    [
        (0.9271, ".3f", "0.927"),
        (130.4, "min_s", "2 min 10 s"),
        (44.2, "min_s", "44 s"),
        (1441800000, "*1e-6:,.1f", "1,441.8"),
        (0.038, "+.3f", "+0.038"),
    ],
)
def test_figures_are_written_as_their_format_says(value: float, spec: str, text: str):
    assert formatted(value, spec) == text


def test_paths_name_keys_items_and_rows_by_a_field():
    record = {"output": {"rows": [{"run": "floor", "accuracy": 0.5}, {"run": "cnn", "accuracy": 0.6}]}, "printed": ["a", "b", "c"]}
    assert value_at(record, "output.rows[run=cnn].accuracy") == 0.6
    assert value_at(record, "output.rows[0].run") == "floor"
    assert value_at(record, "printed[1:3]") == ["b", "c"]
    assert last_json(["table", '{"P1": 3.1}', ""]) == ({"P1": 3.1}, ["table", ""])


def test_compare_json_is_the_rows_the_table_is_rendered_from(tmp_path):
    from rffm.ops.compare import render, seed_groups
    from rffm.report.measurement import rows_json

    row = {"run": "floor", "group": "floor", "seed": 0, "role": "floor", "dataset": "synth", "model": "random-init", "labels": None}
    row |= {"accuracy": 0.517, "val_accuracy": 0.52}
    row |= {"accuracy_high_snr": 0.802, "high_snr_db": 10, "macro_f1": 0.507, "wall_s": 16.0, "member": None, "exposure": (1, 1)}
    row |= {"split": None, "members": 1, "optimizer_steps": 520, "optimizer_steps_computed": False, "split_qualifications": []}
    row |= {"vs_floor": None, "vs_end_to_end": None}
    groups = seed_groups([row], tmp_path)
    printed = json.loads(rows_json([row], groups=groups))
    assert printed["rows"][0]["accuracy"] == 0.517 and printed["groups"][0]["accuracy"]["mean"] == 0.517
    assert render(printed["rows"], printed["groups"]) == render([row], groups)


@pytest.mark.parametrize(
    "text",
    [
        "<!-- unrecorded: why -->1.5 s",
        "<!-- rec name -->0.5",
        "<!-- rec-block r1 printed -->\nno fence\n",
        "<!-- rec r1 output.P1 .2f -->n/a",
    ],
    ids=["unclosed passage", "rec without a path", "block without its fence", "rec without a number"],
)
def test_a_marker_the_parser_cannot_read_is_refused(text: str, tmp_path: Path):
    (tmp_path / "r1.json").write_text(json.dumps({"output": {"P1": 0.5}, "printed": []}))
    assert differences(text, "doc.md", Records(tmp_path))
