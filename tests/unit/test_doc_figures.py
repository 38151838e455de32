"""Every figure the docs state comes from a committed record or is declared a constant (rffm.report.figures,
rffm.report.measurement).

Every Markdown document of the checkout agrees with workflow/docs/records/ and states no figure that is neither marked
from a record nor declared a constant; a hand-edited figure, a marker naming a missing record and an invented figure
(in README.md or concepts.md) are refused, and following each printed Fix (`rffm figures`; `rffm record NAME --
COMMAND`; a rec or const marker before the figure) makes the check pass.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixes import fix_of, run_fix
from rffm.report.figures import Records, differences, documents, figures, formatted, unmarked, unrecorded, value_at
from rffm.report.measurement import last_json

ROOT = Path(__file__).parents[2]
RECORDS = ROOT / "workflow/docs/records"
DOCS = documents(ROOT)


def test_every_figure_in_the_docs_is_from_its_record_or_a_constant():
    problems, marked, remaining = [], 0, []
    for document in DOCS:
        text = (ROOT / document).read_text()
        problems += differences(text, document, Records(RECORDS)) + unmarked(text, document)
        marked += len(figures(text, document))
        remaining += [f"{document}: {why}" for _, why, _ in unrecorded(text)]
    assert not problems, "\n".join(problems)
    assert marked > 0
    assert not remaining, "passages copied by hand, with no record:\n" + "\n".join(remaining)


def test_every_markdown_document_of_the_checkout_is_checked():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked documents")
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert {"README.md", "workflow/docs/concepts.md", "config/REFERENCE.md"} <= set(DOCS)
    assert set(listed) <= set(DOCS), set(listed) - set(DOCS)


def _copy_docs(tmp_path: Path) -> Path:
    """Every document and the records, in a checkout-shaped folder."""
    for document in DOCS:
        (tmp_path / document).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / document, tmp_path / document)
    shutil.copytree(RECORDS, tmp_path / "workflow/docs/records", dirs_exist_ok=True)
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
        "<!-- constants: why -->1.5 s",
        "<!-- const -->n/a",
    ],
    ids=[
        "unclosed passage",
        "rec without a path",
        "block without its fence",
        "rec without a number",
        "unclosed constants",
        "const without a figure",
    ],
)
def test_a_marker_the_parser_cannot_read_is_refused(text: str, tmp_path: Path):
    (tmp_path / "r1.json").write_text(json.dumps({"output": {"P1": 0.5}, "printed": []}))
    assert differences(text, "doc.md", Records(tmp_path))


INVENTED = ["(0.999 test accuracy)", "~75x cheaper", "took 12.5 s", "3.1 GB/s", "+0.042 ± 0.006"]


def _insert(work: Path, document: str, sentence: str) -> int:
    """Append a sentence to the first paragraph after a copied document's title; the line it is on."""
    path = work / document
    text = path.read_text()
    end = text.index("\n\n", text.index("\n\n") + 2)
    path.write_text(f"{text[:end]} It is {sentence}.{text[end:]}")
    return text.count("\n", 0, end) + 1


def _marked(work: Path, document: str, line: int, figure: str, marker: str) -> None:
    """The copied document with `marker` right before the first unmarked `figure` on a line."""
    path = work / document
    lines = path.read_text().split("\n")
    text = lines[line - 1]
    start = next(m.start() for m in re.finditer(re.escape(figure), text) if not text[: m.start()].endswith("-->"))
    lines[line - 1] = text[:start] + marker + text[start:]
    path.write_text("\n".join(lines))


@pytest.mark.parametrize("document", ["README.md", "workflow/docs/concepts.md"])
@pytest.mark.parametrize("sentence", INVENTED)
def test_an_invented_figure_is_refused_is_fixed_by_declaring_it_a_constant(document: str, sentence: str, tmp_path: Path):
    work = _copy_docs(tmp_path)
    line = _insert(work, document, sentence)
    problems = unmarked((work / document).read_text(), document)
    numbers = re.findall(r"[-+]?\d[\d.]*(?: ?(?:s|x|GB/s))?", sentence)
    assert len(problems) == len(numbers), problems
    for problem, number in zip(problems, numbers, strict=True):
        assert problem.startswith(f"{document}:{line}: {number!r} ") and " Fix: " in problem, problem
        marker = re.search(r"<!-- const -->", fix_of(problem)).group(0)  # what the Fix says to write, literally
        _marked(work, document, line, number, marker)
    assert not unmarked((work / document).read_text(), document)
    run_fix("rffm figures --check", work)


def test_an_invented_figure_is_fixed_by_marking_it_from_its_record(tmp_path: Path):
    work = _copy_docs(tmp_path)
    line = _insert(work, "workflow/docs/concepts.md", "took 12.5 s")
    (problem,) = unmarked((work / "workflow/docs/concepts.md").read_text(), "workflow/docs/concepts.md")
    fix = fix_of(problem)
    marker = re.search(r"<!-- rec NAME PATH FORMAT -->", fix).group(0)
    record = re.search(r"`(rffm record NAME -- COMMAND)`", fix).group(1)
    command = f'{sys.executable} -c \'print("{{\\"wall\\": 12.47}}")\''
    run_fix(record.replace("NAME", "probe_took").replace("COMMAND", command), work)
    filled = marker.replace("NAME", "probe_took").replace("PATH", "output.wall").replace("FORMAT", ".1f")
    _marked(work, "workflow/docs/concepts.md", line, "12.5 s", filled)
    run_fix("rffm figures --check", work)


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("lr <!-- const -->0.003 and <!-- constants: prices -->$0.85/h, 375 GB<!-- /constants -->", []),
        ("a key `lr=0.003`, a link [x](a-0.5.md), a name RadioML 2016.10a, torch 2.13.0 on 127.0.0.1", []),
        ("```bash\nrffm bench --size-gb 1.6  # 12.5 s\n```", []),
        ("```\nprinted: 12.5 s\n```", ["12.5 s"]),
        ("shown as code, a figure alone is still one: `0.999`", ["0.999"]),
        ("11 classes, 1,040 steps, issue 47, 2026-12-05, 20 SNRs from -20 to 18 dB", []),
        (
            "0.570, 25%, 67.7x, 10× the data, 2 min, 3 h, 36 MB, 713 GiB, 2 SE",
            ["0.570", "25%", "67.7x", "10×", "2 min", "3 h", "36 MB", "713 GiB", "2 SE"],
        ),
        ("<!-- BEGIN config-reference: generated -->\n| `a` | `1.1` | 0.5 |\n<!-- END config-reference -->", []),
    ],
    ids=["declared", "code, links, names", "code block", "printed block", "lone figure in code", "integers", "figures", "generated"],
)
def test_what_counts_as_a_figure(text: str, flagged: list[str]):
    assert [problem.split("'")[1] for problem in unmarked(text, "doc.md")] == flagged
