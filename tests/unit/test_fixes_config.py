"""Issue 34: configuration refusals whose printed Fix the battery (test_config_battery.py) does not follow; each is
provoked, its Fix is done as written, and the configuration (or the call that refused it) then passes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import tiny_cnn, tiny_config, tiny_text
from fixes import run_fix
from rffm import config
from rffm.cli import main
from rffm.config.messages import DESCRIBED, alternatives, schema_errors
from rffm.config.schema import Validator, dotted, load_schema, resolve
from rffm.errors import ConfigError
from rffm.ops import config_reference
from rffm.training import sweep


def only_fix(c: dict) -> str:
    """The Fix of the one problem `c` has."""
    found = config.problems(c, files=[], runs_here=True, local_files=True)
    assert len(found) == 1 and " Fix: " in found[0], found
    return found[0].split(" Fix: ", 1)[1]


def passes(c: dict) -> bool:
    return config.problems(c, files=[], runs_here=True, local_files=True) == []


def test_an_empty_class_name_is_fixed_by_writing_a_non_empty_value(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = tiny_config()
    c["datasets"]["tiny"]["class_map"] = {"BPSK": ""}
    assert only_fix(c) == "write a non-empty value"
    c["datasets"]["tiny"]["class_map"]["BPSK"] = "bpsk"
    assert passes(c)


def test_a_class_listed_twice_is_fixed_by_listing_each_once(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = tiny_config()
    c["datasets"]["tiny"]["select"] = {"classes": ["BPSK", "QPSK", "BPSK"]}
    assert only_fix(c) == "list each once"
    c["datasets"]["tiny"]["select"]["classes"] = list(dict.fromkeys(c["datasets"]["tiny"]["select"]["classes"]))
    assert passes(c)


def test_a_pretrained_backbone_without_its_dataset_is_fixed_by_naming_one(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = tiny_config()
    del c["backbones"]["mini"]["dataset"]
    assert only_fix(c) == "name one of the datasets"
    c["backbones"]["mini"]["dataset"] = next(iter(c["datasets"]))
    assert passes(c)


def test_an_imported_backbone_without_its_sha256_is_fixed_by_adding_it(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "backbone.pt").write_bytes(b"the backbone a user imports")
    c = tiny_config()
    c["backbones"]["mini"] = {"source": "checkpoint", "path": "backbone.pt"}
    assert only_fix(c) == "add the missing one"
    c["backbones"]["mini"]["sha256"] = hashlib.sha256((tmp_path / "backbone.pt").read_bytes()).hexdigest()  # `sha256sum`
    assert passes(c)


def test_a_reference_named_like_a_run_is_fixed_by_renaming_one(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = tiny_config()
    train = {"epochs": 1, "lr": 0.003, "batch_size": 16, "seed": 0}
    c["references"] = {"base": {"dataset": "tiny", "train": train}}
    assert only_fix(c) == "rename one"
    c["references"]["cnn"] = c["references"].pop("base")
    assert passes(c)


def refused_sweep(grid: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        sweep.members({"run": "r", "sweep": grid})
    return str(caught.value).split(" Fix: ", 1)[1]


@pytest.mark.parametrize(
    "grid, expected, follow",
    [
        (
            {"train.batch_size": [1, 2]},
            f"use one of {', '.join(sweep.SWEEP_KEYS)}.",
            lambda g: g.update({sweep.SWEEP_KEYS[0]: g.pop("train.batch_size")}),
        ),
        ({"train.lr": [0.1], "train.weight_decay": []}, "list at least one value, or drop the key.", lambda g: g.pop("train.weight_decay")),
        ({"train.lr": [0.1, 0.01, 0.1]}, "list each value once.", lambda g: g.update({"train.lr": [0.1, 0.01]})),
    ],
)
def test_a_sweep_grid_refused_when_members_are_named_is_fixed_as_printed(grid: dict, expected: str, follow: Callable[[dict], None]):
    """The schema refuses these first; members() says the same where it is called without it (a step's own spec)."""
    assert refused_sweep(grid) == expected
    follow(grid)
    assert sweep.members({"run": "r", "sweep": grid})


def test_heads_that_cannot_fit_are_fixed_by_fewer_sweep_values():
    with pytest.raises(ConfigError) as caught:
        sweep.check_memory(8, 1000, 4096, 100_000, "runs.r.sweep")
    assert str(caught.value).split(" Fix: ", 1)[1].startswith("fewer sweep values")
    assert sweep.check_memory(4, 1000, 4096, 100_000, "runs.r.sweep")  # half the values: 4 heads


def test_a_stale_config_reference_is_fixed_by_the_printed_command(tmp_path: Path, capsys):
    document = tmp_path / "REFERENCE.md"
    document.write_text(f"# Title\n\n{config_reference.BEGIN}\n| stale |\n{config_reference.END}\n")
    assert main(["config_reference", "--check", str(document)]) == 1
    run_fix(capsys.readouterr().out.strip().split(" Fix: ", 1)[1], tmp_path)
    assert main(["config_reference", "--check", str(document)]) == 0


def test_a_document_without_the_generated_section_is_fixed_by_adding_its_marker_lines(tmp_path: Path):
    document = tmp_path / "README.md"
    document.write_text("# no markers\n")
    with pytest.raises(ConfigError) as caught:
        config_reference.update(document, write=True)
    message = str(caught.value)
    assert "\n" not in message
    fix = message.split(" Fix: ", 1)[1]
    begin, end = fix.removeprefix("add the lines ").removesuffix(", each on its own line").split(" and ")
    document.write_text(f"{document.read_text()}{begin}\n{end}\n")  # the Fix: those lines, each on its own
    config_reference.update(document, write=True)
    assert config_reference.update(document)


# ---- every check the schema makes has its own words (config/messages.py) ----

NOT_CHECKS = {"$schema", "$defs", "$ref", "title", "description", "default", "examples"}  # and the applicators:
NOT_CHECKS |= {"properties", "items", "allOf", "if", "then", "else"}


def schema_nodes(node: dict, path: tuple = ()) -> Iterator[tuple[tuple, dict]]:
    """Every subschema with the config key path it describes ('*': any entry's name, 0: any item; $refs followed)."""
    node = resolve(node, SCHEMA)
    yield path, node
    children = [(path + (key,), child) for key, child in node.get("properties", {}).items()]
    children += [(path + ("*",), node.get("additionalProperties")), (path + (0,), node.get("items")), (path, node.get("propertyNames"))]
    children += [(path, child) for key in ("allOf", "oneOf") for child in node.get(key, [])]
    children += [(path, node.get(key)) for key in ("if", "then", "else")]
    for child_path, child in children:
        if isinstance(child, dict):
            yield from schema_nodes(child, child_path)


SCHEMA = load_schema()
NODES = list(schema_nodes(SCHEMA))


def test_every_keyword_of_the_schema_is_put_in_words_with_its_fix():
    """No violation of the schema reaches the fallback of messages._describe (which claims no fix: a bug)."""
    used = {key for _, node in NODES for key in node} - NOT_CHECKS
    assert used <= DESCRIBED, f"worded by no branch of rffm.config.messages._describe: {sorted(used - DESCRIBED)}"
    subschemas = [child for _, node in NODES for child in [*node.get("properties", {}).values(), node.get("items"), node.get("then")]]
    assert not [child for child in subschemas if isinstance(child, bool)]  # a `false` schema fails under no keyword to word


def test_a_check_no_branch_words_is_reported_as_a_bug_without_a_fix_it_cannot_do():
    (line,) = schema_errors({"name": "abc"}, {"type": "object", "properties": {"name": {"type": "string", "maxLength": 2}}})
    said = "name: 'abc' is too long (schema keyword 'maxLength', which rffm.config.messages does not word: a bug)."
    assert line == f"{said} Fix: report this line"


def example(node: dict) -> object:
    """A value a oneOf branch accepts, as its words (messages.alternatives) tell it."""
    if "enum" in node:
        return node["enum"][0]
    if node.get("type") == "array":
        return [example(node["items"])] * node.get("minItems", 1)
    return node.get("minimum", node.get("exclusiveMinimum", 0) + 1)


@pytest.mark.parametrize("path", [path for path, node in NODES if "oneOf" in node], ids=lambda path: dotted(path))
def test_every_oneof_of_the_schema_has_its_words_and_its_fix_works(path: tuple, tmp_path: Path, monkeypatch):
    """A value no branch accepts names what each accepts; writing the first of them passes."""
    monkeypatch.chdir(tmp_path)
    c = tiny_config()
    c["references"] = {"cnn": tiny_cnn()}  # the tiny config has none: a oneOf under references needs an entry
    parent = c
    for key in path[:-1]:  # '*': the tiny config's entry of that section
        parent = parent[next(iter(parent)) if key == "*" else key]
    node = next(node for at, node in NODES if at == path and "oneOf" in node)
    parent[path[-1]] = value = next(v for v in ("neither", 0.5, {"neither": 1}) if not any(Validator(b).is_valid(v) for b in node["oneOf"]))
    where = dotted([next(iter(c[path[0]])) if key == "*" else key for key in path])
    assert only_fix(c) == f"write {alternatives(node['oneOf'])}" and " a value" not in alternatives(node["oneOf"])
    assert f"{where}: {value!r} is not allowed. Fix: " in config.problems(c, files=[], runs_here=True, local_files=True)[0]
    parent[path[-1]] = example(node["oneOf"][0])
    assert passes(c)


# ---- a config file that is not valid YAML names its file, line and column (issue 50) ----


def indented_like_the_line_above(text: str, line: int) -> str:
    """`text` with line `line` (1-based) indented by the spaces of the line above it, its sibling key: the Fix done."""
    lines = text.splitlines(keepends=True)
    above = lines[line - 2]
    lines[line - 1] = above[: len(above) - len(above.lstrip(" "))] + lines[line - 1].lstrip(" \t")
    return "".join(lines)


MISALIGNED_FIX = "indent every key of one mapping by the same number of spaces (no tabs), e.g. compare with config/config.yaml"
COLON_FIX = (
    "indent every key of one mapping by the same number of spaces (no tabs), and quote a value that holds ': ', "
    "e.g. compare with config/config.yaml"
)
TAB_FIX = "indent with spaces only: replace the tab with as many spaces as the keys beside it use (see config/config.yaml)"


@pytest.mark.parametrize(
    "line, written, problem, fix",
    [
        # a key one space short of its siblings (3 among 4): YAML stops on it, in the mapping begun two lines above
        (
            24,
            "   backbone: mini\n",
            "expected <block end>, but found '<block mapping start>', in a block mapping from line 22",
            MISALIGNED_FIX,
        ),
        # a key one space deeper than the key above it, whose value it then seems to continue
        (8, "     seed: 11\n", "mapping values are not allowed here", COLON_FIX),
        (2, "  scratch: scratch\n", "mapping values are not allowed here", COLON_FIX),
        (8, "\tseed: 11\n", "found character '\\t' that cannot start any token", TAB_FIX),
    ],
    ids=["key-a-space-short", "key-a-space-deep", "top-level-key-indented", "tab"],
)
def test_a_misindented_config_names_its_file_and_line_and_is_fixed_by_indenting_like_its_siblings(
    tmp_path: Path, monkeypatch, capsys, line: int, written: str, problem: str, fix: str
):
    """Snakemake's own message for these blames tabs and names no file (workflow/docs/troubleshooting.md); rffm's
    reader (config.load, `rffm status --config`, the Snakefile's config/config.yaml) says where, in one line."""
    monkeypatch.chdir(tmp_path)  # the tiny config's relative paths (results, scratch) land here
    lines = tiny_text().splitlines(keepends=True)
    lines[line - 1] = written
    path = tmp_path / "bad.yaml"
    path.write_text("".join(lines))
    with pytest.raises(ConfigError) as caught:
        config.load([path])
    message = str(caught.value)
    assert "\n" not in message and message.count(" Fix: ") == 1, message
    assert message.startswith(f"{path}:{line}:") and f": not valid YAML ({problem}). Fix: {fix}" in message, message

    assert main(["status", "--config", str(path)]) == 2  # the command troubleshooting.md gives to pinpoint it
    assert capsys.readouterr().err == f"rffm status: error: {message}\n"

    path.write_text(indented_like_the_line_above(path.read_text(), line))  # the Fix, done on the line named
    assert path.read_text() == tiny_text()
    assert config.load([path])["runs"]["base"]["backbone"] == "mini"
    assert main(["status", "--config", str(path)]) == 0


def test_an_unclosed_bracket_names_where_yaml_stopped_and_is_fixed_by_closing_it(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text(tiny_text().replace("cache: {batch_size: 64}\n", "cache: {batch_size: 64\n"))
    with pytest.raises(ConfigError) as caught:
        config.load([path])
    message = str(caught.value)
    assert message.startswith(f"{path}:5:") and "in a flow mapping from line 4). " in message, message
    assert message.endswith("Fix: correct the YAML there (close every quote and bracket it opens), e.g. compare with config/config.yaml")
    path.write_text(path.read_text().replace("cache: {batch_size: 64\n", "cache: {batch_size: 64}\n"))  # the bracket closed
    assert config.load([path])["cache"]["batch_size"] == 64


def test_a_tab_indented_json_config_is_read_as_json_as_snakemake_reads_it(tmp_path: Path, monkeypatch):
    """YAML refuses the tabs valid JSON may indent with; Snakemake reads a config as JSON first, so rffm reads it too."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(tiny_config(), indent="\t"))
    assert config.load([path])["runs"]["base"]["backbone"] == "mini"
