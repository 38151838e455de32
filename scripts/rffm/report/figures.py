"""`rffm figures` (`make figures`): every figure the documentation marks, rewritten from its committed record.

A record is workflow/docs/records/NAME.json, written by `rffm record NAME -- COMMAND` (rffm.report.measurement). In a
Markdown document a figure taken from one is preceded by an HTML comment, which renders as nothing:

    <!-- rec NAME PATH FORMAT -->0.927

  NAME    the record's file name without .json;
  PATH    where the figure is in it: keys joined by dots (output.P3, output.detail.cache_build_s, wall_s), a list
          item by index (printed[2]) or by a field's value (output.rows[run=floor].accuracy);
  FORMAT  how it is written: a Python format spec (.3f, ,.1f, .0f, +.3f), optionally after a scale (*1e-6:,.1f for
          bytes as MB), or min_s (seconds as "2 min 10 s"). Omitted: the value as JSON writes it.

The figure is the text right after the comment (a number, or for min_s "[M min ]S s"). A fenced block that is a
record's printed table is marked on the line before its opening fence:

    <!-- rec-block NAME PATH -->

(PATH names a list of lines or a string, e.g. printed[0:4]); the block's lines are the value. Passages whose figures
were copied by hand and have no record yet are enclosed in

    <!-- unrecorded: why -->  ...  <!-- /unrecorded -->

and counted (numbers with a decimal point or a unit); they are never rewritten, and tests/unit/test_doc_figures.py fails
while the documents hold one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NUMBER = r"[-+−]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-+]?\d+)?"
MIN_S = r"(?:\d+ min )?\d+ s"
INLINE = re.compile(r"<!-- rec (?P<name>[\w-]+) (?P<path>\S+?)(?: (?P<format>\S+))? -->")
BLOCK = re.compile(
    r"^<!-- rec-block (?P<name>[\w-]+) (?P<path>\S+) -->\n(?P<fence>```[^\n]*\n)(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL
)
REGION = re.compile(r"<!-- unrecorded: (?P<why>.*?) -->(?P<body>.*?)<!-- /unrecorded -->", re.DOTALL)
# what counts as a hand-copied figure inside an unrecorded passage
FIGURE = re.compile(r"(?<![\w.])\d[\d,]*\.\d+|(?<![\w.])\d[\d,]*(?:\.\d+)? ?(?:s|min|MB|GB|MB/s|GB/s|SE|%|x)(?![\w/])")
STEP = re.compile(r"([^.\[\]]+)|\[(\d+)?:(\d+)?\]|\[(\d+)\]|\[([^=\]]+)=([^\]]+)\]")


class FigureError(ValueError):
    """A marker whose record, field or format is wrong."""


@dataclass
class Figure:
    """One marked figure (or block) of a document: where it is and what it says."""

    document: str
    line: int
    name: str
    path: str
    format: str | None
    start: int  # of the figure's text (after the comment)
    end: int
    text: str
    block: bool = False

    def label(self) -> str:
        return f"{self.document}:{self.line}: rec {self.name} {self.path}"


def value_at(record: dict[str, Any], path: str) -> Any:
    """The value PATH names in a record (see the module docstring)."""
    value: Any = record
    for match in STEP.finditer(path):
        key, start, stop, index, field, wanted = match.groups()
        try:
            if key is not None:
                value = value[key]
            elif index is not None:
                value = value[int(index)]
            elif field is not None:
                value = next(item for item in value if str(item.get(field)) == wanted)
            else:
                value = value[int(start) if start else None : int(stop) if stop else None]
        except (KeyError, IndexError, TypeError, StopIteration) as exc:
            raise FigureError(f"no {match.group(0).lstrip('.')!r} at {path!r}") from exc
    return value


def formatted(value: Any, spec: str | None) -> str:
    """The figure as the document writes it."""
    if spec is None:
        return json.dumps(value)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise FigureError(f"{value!r} is not a number (format {spec})")
    if spec == "min_s":
        minutes, seconds = divmod(round(value), 60)
        return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"
    scale, _, spec = spec.rpartition(":") if spec.startswith("*") else ("", "", spec)
    if scale:
        value = value * float(scale[1:])
    try:
        return format(value, spec)
    except ValueError as exc:
        raise FigureError(f"format {spec!r}: {exc}") from exc


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def figures(text: str, document: str) -> list[Figure]:
    """Every marked figure and block of a document, in order."""
    found = []
    for match in INLINE.finditer(text):
        pattern = MIN_S if match["format"] == "min_s" else NUMBER
        figure = re.compile(pattern).match(text, match.end())
        end = figure.end() if figure else match.end()
        found.append(
            Figure(
                document,
                _line(text, match.start()),
                match["name"],
                match["path"],
                match["format"],
                match.end(),
                end,
                text[match.end() : end],
            )
        )
    for match in BLOCK.finditer(text):
        body = match.start("body")
        found.append(
            Figure(document, _line(text, match.start()), match["name"], match["path"], None, body, match.end("body"), match["body"], True)
        )
    return sorted(found, key=lambda f: f.start)


def unrecorded(text: str) -> list[tuple[int, str, int]]:
    """(line, why, how many figures) of every passage marked as not yet from a record."""
    return [(_line(text, m.start()), m["why"], len(FIGURE.findall(m["body"]))) for m in REGION.finditer(text)]


def malformed(text: str, document: str) -> list[str]:
    """Markers the parser would silently skip: an unclosed passage, a rec comment it cannot read, a block without its fence."""
    problems = []
    if text.count("<!-- unrecorded:") != text.count("<!-- /unrecorded -->") or len(REGION.findall(text)) != text.count("<!-- unrecorded:"):
        problems.append(f"{document}: an <!-- unrecorded: ... --> passage without its <!-- /unrecorded --> (or the reverse)")
    if text.count("<!-- rec ") != len(INLINE.findall(text)):
        problems.append(f"{document}: a <!-- rec ... --> comment that is not <!-- rec NAME PATH [FORMAT] -->")
    if text.count("<!-- rec-block ") != len(BLOCK.findall(text)):
        problems.append(f"{document}: a <!-- rec-block NAME PATH --> not followed by a fenced block")
    return problems


class Records:
    """The records folder, each file read once."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.read: dict[str, dict[str, Any]] = {}

    def __call__(self, name: str) -> dict[str, Any]:
        if name not in self.read:
            path = self.folder / f"{name}.json"
            if not path.is_file():
                raise FigureError(f"no record {path}")
            self.read[name] = json.loads(path.read_text())
        return self.read[name]


def expected(figure: Figure, records: Records) -> str:
    """What the record says the figure's text is."""
    value = value_at(records(figure.name), figure.path)
    if figure.block:
        lines = value if isinstance(value, list) else str(value).splitlines()
        return "".join(f"{line}\n" for line in lines)
    return formatted(value, figure.format)


def resolved(text: str, document: str, records: Records, problems: list[str]):
    """Each marked figure with the text its record gives it; a figure whose record or field is missing goes to `problems`."""
    for figure in figures(text, document):
        try:
            yield figure, expected(figure, records)
        except FigureError as exc:
            problems.append(
                f"{figure.label()}: {exc}. Fix: rffm record {figure.name} -- <the command that measures it>, or correct the marker"
            )


def differences(text: str, document: str, records: Records) -> list[str]:
    """One line per marked figure that differs from its record (or whose record or field is missing), and per bad marker."""
    problems = malformed(text, document)
    for figure, wanted in resolved(text, document, records, problems):
        if figure.text != wanted:
            shown, recorded = (figure.text, wanted) if not figure.block else (f"{figure.text.count(chr(10))} lines", "other lines")
            problems.append(f"{figure.label()}: the document says {shown!r}, the record {recorded!r}. Fix: rffm figures")
    return problems


def regenerate(text: str, document: str, records: Records) -> tuple[str, list[str]]:
    """The document with every marked figure rewritten from its record, and the markers that could not be."""
    problems = malformed(text, document)
    pieces, last = [], 0
    for figure, wanted in resolved(text, document, records, problems):
        pieces += [text[last : figure.start], wanted]
        last = figure.end
    return "".join([*pieces, text[last:]]), problems


def main(docs: list[str], records_dir: Path, check: bool = False) -> int:
    """Rewrite (or with check, only compare) the marked figures of `docs`; print the counts. Exit 1 on any problem."""
    records = Records(records_dir)
    problems, counted, remaining, passages = [], 0, 0, 0
    for document in docs:
        path = Path(document)
        text = path.read_text()
        counted += len(figures(text, document))
        for _, _, count in unrecorded(text):
            remaining, passages = remaining + count, passages + 1
        if check:
            problems += differences(text, document, records)
            continue
        new, found = regenerate(text, document, records)
        problems += found
        if new != text:
            path.write_text(new)
            print(f"{document}: figures rewritten from {records_dir}")
    for problem in problems:
        print(problem)
    print(f"{counted} figures from records; {remaining} numbers not yet from a record, in {passages} passages marked unrecorded")
    return 1 if problems else 0
