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

and counted (their figures, as below); they are never rewritten, and tests/unit/test_doc_figures.py fails while the
documents hold one.

Every other figure is checked too (`rffm figures --check`, over every document DOCUMENTS names): a measured-looking
number that neither comes from a record (a rec figure, a rec-block) nor is declared a constant fails, as
`file:line: 'FIGURE' is neither ...`. A figure (FIGURE) is

  - a number with a decimal point (0.570, +0.042, 3.11), or
  - a number with a unit of time, size, rate, share or ratio (12 s, 2 min, 3 h, 36 MB, 713 GiB, 3 GB/s, 25%, 75x,
    10×, 2 SE; the list is UNIT). A whole integer without one (11 classes, 1,040 steps, issue 47, 2026-12-05) is not.

A definition, not a measurement (a config value, a code constant, a price, a formula) is declared as one:

    lr <!-- const -->0.003                       the one figure right after the comment
    <!-- constants: why -->  ...  <!-- /constants -->   every figure of the passage (a parameter list, a price list)

Not checked, because they are not prose a reader takes for a measurement (the only exemptions):

  - text in an inline code span (`lr=0.003`, `--size-gb 1.6`), unless the span is a figure alone (`0.999`);
  - a fenced block whose fence names a language in CODE (```bash, ```yaml, ```python): commands and config. A bare
    fence (```) or ```text can hold printed output and is checked like prose (or marked as a rec-block);
  - HTML comments, link targets and URLs;
  - a number glued to a letter or part of a dotted run: a name or version (RadioML 2016.10a, 2.13.0, 127.0.0.1);
  - config/REFERENCE.md's generated section (GENERATED): written from the config schema by `rffm config_reference`,
    its numbers are the schema's defaults and bounds, and `rffm config_reference --check` keeps them equal to it.
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
CONST = re.compile(r"<!-- const -->")
CONSTANTS = re.compile(r"<!-- constants: (?P<why>.*?) -->(?P<body>.*?)<!-- /constants -->", re.DOTALL)
GENERATED = re.compile(r"<!-- BEGIN config-reference: .*?<!-- END config-reference -->", re.DOTALL)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
FENCED = re.compile(r"^ *(?P<fence>```+)(?P<info>[^\n]*)\n.*?^ *(?P=fence) *$", re.MULTILINE | re.DOTALL)
CODE = {"bash", "sh", "shell", "yaml", "yml", "python", "json", "toml", "dockerfile", "mermaid"}
INLINE_CODE = re.compile(r"(?<!`)`(?!`)(?P<code>(?:[^`\n]|\n(?![ \t]*\n))+)`")  # a span ends at its paragraph's end
LINK = re.compile(r"\]\([^)\s]*\)|https?://[^\s`)>\]]+")
UNIT = r"(?:MB/s|GB/s|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB|CPU-s|ms|minutes|min|seconds|s|hours|h|SE|%|x|×)"
# a figure starts at a sign or a digit that no letter, digit or "letter." precedes (so 2.13.0 and x86 hold none), and
# ends at no letter and no ".digit" (so 2016.10a and 127.0.0.1 hold none); "_" is no letter here: _0.9_ is emphasis
ALNUM = r"[^\W_]"
LEAD = rf"(?:(?<!{ALNUM})(?<!\.)[-+−]|(?<!{ALNUM})(?<!{ALNUM}\.))"
MANTISSA = r"\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-+]?\d+)?"
DECIMAL = r"\d(?:[\d,]*\d)?\.\d+(?:e[-+]?\d+)?"
FIGURE = re.compile(rf"{LEAD}{MANTISSA} ?{UNIT}(?!{ALNUM}|/)|{LEAD}{DECIMAL}(?!{ALNUM}|\.\d)")
# every Markdown document of the checkout (tests/unit/test_doc_figures.py checks that git tracks no other)
DOCUMENTS = ("README.md", "config/*.md", "profiles/*.md", "workflow/docs/*.md", "workflow/docs/records/*.md", "docs/**/*.md")
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


def markup(text: str) -> str:
    """The text with its code blanked (code blocks with a language, inline code): a marker shown as code marks nothing."""
    blocks = list(FENCED.finditer(text))
    spans = [block.span() for block in blocks if _is_code(block)]
    return _masked(text, spans + [code.span() for code in _inline_code(text, blocks)])


def _is_code(block: re.Match) -> bool:
    return block["info"].strip().lower() in CODE


def _inline_code(text: str, blocks: list[re.Match]) -> list[re.Match]:
    # found with every fenced block and comment blanked, so that no backtick there pairs with one outside
    quiet = _masked(text, [block.span() for block in blocks] + [m.span() for m in COMMENT.finditer(text)])
    return list(INLINE_CODE.finditer(quiet))


def figures(text: str, document: str) -> list[Figure]:
    """Every marked figure and block of a document, in order."""
    found, prose = [], markup(text)
    for match in INLINE.finditer(prose):
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
    for match in BLOCK.finditer(prose):
        body, end = match.span("body")
        found.append(Figure(document, _line(text, match.start()), match["name"], match["path"], None, body, end, text[body:end], True))
    return sorted(found, key=lambda f: f.start)


def unrecorded(text: str) -> list[tuple[int, str, int]]:
    """(line, why, how many figures) of every passage marked as not yet from a record."""
    checked = _masked(text, not_prose(text))
    return [(_line(text, m.start()), m["why"], len(FIGURE.findall(checked, *m.span("body")))) for m in REGION.finditer(markup(text))]


def malformed(text: str, document: str) -> list[str]:
    """Markers the parser would silently skip: an unclosed passage, a rec comment it cannot read, a block without its fence."""
    problems, prose = [], markup(text)
    if _unpaired(prose, REGION, "<!-- unrecorded:", "<!-- /unrecorded -->"):
        problems.append(f"{document}: an <!-- unrecorded: ... --> passage without its <!-- /unrecorded --> (or the reverse)")
    if prose.count("<!-- rec ") != len(INLINE.findall(prose)):
        problems.append(f"{document}: a <!-- rec ... --> comment that is not <!-- rec NAME PATH [FORMAT] -->")
    if prose.count("<!-- rec-block ") != len(BLOCK.findall(prose)):
        problems.append(f"{document}: a <!-- rec-block NAME PATH --> not followed by a fenced block")
    if _unpaired(prose, CONSTANTS, "<!-- constants:", "<!-- /constants -->"):
        problems.append(f"{document}: a <!-- constants: ... --> passage without its <!-- /constants --> (or the reverse)")
    for match in CONST.finditer(prose):
        if not FIGURE.match(text, match.end()):
            problems.append(f"{document}:{_line(text, match.start())}: a <!-- const --> not followed by a figure")
    return problems


def _unpaired(prose: str, passage: re.Pattern, opening: str, closing: str) -> bool:
    return not prose.count(opening) == prose.count(closing) == len(passage.findall(prose))


def constants(text: str) -> int:
    """How many figures a document declares constants."""
    prose = markup(text)
    return len(CONST.findall(prose)) + sum(len(FIGURE.findall(m["body"])) for m in CONSTANTS.finditer(prose))


def declared(text: str, document: str) -> list[tuple[int, int]]:
    """The spans whose figures are accounted for: from a record, declared constants, unrecorded or generated passages."""
    prose = markup(text)
    spans = [(figure.start, figure.end) for figure in figures(text, document)]
    spans += [found.span() for match in CONST.finditer(prose) if (found := FIGURE.match(text, match.end()))]
    for pattern in (CONSTANTS, REGION, GENERATED):
        spans += [match.span() for match in pattern.finditer(prose)]
    return spans


def not_prose(text: str) -> list[tuple[int, int]]:
    """The spans that are not prose (see the module docstring): comments, link targets, code blocks, inline code."""
    spans = [match.span() for pattern in (COMMENT, LINK) for match in pattern.finditer(text)]
    blocks = list(FENCED.finditer(text))
    for block in blocks:
        if _is_code(block):
            spans.append(block.span())
        else:  # a bare block is checked, but not its fences' backticks
            spans += [(block.start(), text.index("\n", block.start())), (text.rindex("\n", 0, block.end()), block.end())]
    spans += [code.span() for code in _inline_code(text, blocks) if not FIGURE.fullmatch(code["code"].strip())]
    return spans


def _masked(text: str, spans: list[tuple[int, int]]) -> str:
    """The text with every span blanked, its newlines kept (so lines keep their numbers)."""
    chars = list(text)
    for start, end in spans:
        chars[start:end] = [c if c == "\n" else " " for c in chars[start:end]]
    return "".join(chars)


def unmarked(text: str, document: str) -> list[str]:
    """One line per figure of the prose that is neither from a record nor declared a constant."""
    masked = _masked(text, declared(text, document) + not_prose(text))
    return [
        f"{document}:{_line(text, found.start())}: {found.group()!r} is neither from a record nor declared a constant. "
        "Fix: write <!-- rec NAME PATH FORMAT --> right before it (NAME a record of `rffm record NAME -- COMMAND`), "
        "or <!-- const --> if it is a definition, not a measurement"
        for found in FIGURE.finditer(masked)
    ]


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


def documents(root: Path) -> list[str]:
    """Every Markdown document of the checkout at root (DOCUMENTS), relative to it."""
    found = {path for pattern in DOCUMENTS for path in root.glob(pattern)}
    return sorted(str(path.relative_to(root)) for path in found)


def main(docs: list[str], records_dir: Path, check: bool = False) -> int:
    """Rewrite (or with check, only compare) the marked figures of `docs` and check the rest; print the counts. Exit 1 on any problem."""
    records = Records(records_dir)
    problems, counted, declared_constants, remaining, passages = [], 0, 0, 0, 0
    for document in docs:
        path = Path(document)
        text = path.read_text()
        counted += len(figures(text, document))
        declared_constants += constants(text)
        for _, _, count in unrecorded(text):
            remaining, passages = remaining + count, passages + 1
        if check:
            problems += differences(text, document, records) + unmarked(text, document)
            continue
        new, found = regenerate(text, document, records)
        problems += found + unmarked(new, document)
        if new != text:
            path.write_text(new)
            print(f"{document}: figures rewritten from {records_dir}")
    for problem in problems:
        print(problem)
    print(
        f"{len(docs)} documents: {counted} figures from records, {declared_constants} declared constants; "
        f"{remaining} numbers not yet from a record, in {passages} passages marked unrecorded"
    )
    return 1 if problems else 0
