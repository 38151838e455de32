"""Config files as written: read one, merge several (as Snakemake does), and list every key given twice."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from rffm.config.schema import dotted
from rffm.errors import ConfigError


class DuplicateKeyLoader(yaml.SafeLoader):
    """A SafeLoader that also lists every mapping key given twice (plain YAML silently keeps the last)."""

    def duplicates(self, node: yaml.Node, path: tuple[Any, ...] = (), seen: set[int] | None = None) -> Iterator[tuple[str, int, int]]:
        """(dotted key, first line, repeated line) for every repeated key under node."""
        seen = set() if seen is None else seen
        if id(node) in seen:  # an alias: its keys were walked where the anchor is
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                yield from self.duplicates(item, (*path, index), seen)
        if not isinstance(node, yaml.MappingNode):
            return
        first: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: keys given next to it override it, as YAML means
                continue
            key = self._key(key_node)
            line = key_node.start_mark.line + 1
            if key in first:
                yield dotted((*path, key)), first[key], line
            first.setdefault(key, line)
            yield from self.duplicates(value_node, (*path, key), seen)

    def _key(self, node: yaml.Node) -> Any:
        """The key as YAML reads it (`1` and `"1"` differ); a key no config uses (a mapping, a bad tag) stands for itself."""
        try:
            key = self.construct_object(node, deep=True)
            hash(key)
        except (yaml.YAMLError, TypeError):
            return id(node)
        return key


def duplicate_keys(path: str | Path, text: str | None = None) -> list[str]:
    """Keys given twice in one YAML (or JSON) config file, one line each naming the file and both lines."""
    text = Path(path).read_text() if text is None else text
    loader = DuplicateKeyLoader(text)
    try:
        node = loader.get_single_node()
        found = sorted(loader.duplicates(node), key=lambda item: item[2]) if node is not None else []
    finally:
        loader.dispose()
    lines = [f"lines {first} and {again}" if first != again else f"twice on line {first}" for _, first, again in found]
    return [
        f"{key}: given twice in {path} ({where}); YAML silently keeps the last. Fix: keep one of them"
        for (key, _, _), where in zip(found, lines, strict=True)
    ]


def file_problems(paths: Iterable[str | Path]) -> list[str]:
    """Keys given twice in the config files Snakemake (or `load`) read; files that are gone are skipped."""
    problems = []
    for path in paths:
        try:
            problems += duplicate_keys(path)
        except OSError:
            continue  # the reader of the file already said what was wrong with it
        except yaml.YAMLError:
            continue  # JSON that YAML cannot parse: Snakemake read it as JSON, which has no line numbers to report
    return problems


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Nested merge, later values winning (as Snakemake merges several --configfile)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# What YAML's parser says when a line's indentation does not fit the block it is in (a key indented by 3 spaces among
# 2-space siblings, one a space short, a list item out of line): the Fix for these is the indentation, not the file.
MISALIGNED = ("expected <block end>", "did not find expected key", "could not find expected ':'")
SYNTAX_FIXES = {
    "tab": "indent with spaces only: replace the tab with as many spaces as the keys beside it use (see config/config.yaml)",
    "misaligned": "indent every key of one mapping by the same number of spaces (no tabs), e.g. compare with config/config.yaml",
    # a key indented deeper than the line above it, or a value holding `: ` (`name: a: b`)
    "colon": (
        "indent every key of one mapping by the same number of spaces (no tabs), and quote a value that holds ': ', "
        "e.g. compare with config/config.yaml"
    ),
    "other": "correct the YAML there (close every quote and bracket it opens), e.g. compare with config/config.yaml",
}


def not_yaml(path: str | Path, error: yaml.MarkedYAMLError) -> str:
    """A YAML syntax error as one line: `<path>:<line>:<column>: not valid YAML (what YAML found). Fix: how`."""
    mark = error.problem_mark or error.context_mark
    problem = error.problem or error.context or "unreadable"
    # Where the block the misfit breaks began (YAML's context), when on another line: the line to compare it with.
    if error.problem and error.context and error.context_mark and error.context_mark.line != mark.line:
        block = error.context.replace("while parsing ", "in ").replace("while scanning ", "in ")
        problem += f", {block} from line {error.context_mark.line + 1}"
    if "'\\t'" in problem:  # YAML names the character it cannot start a token with as its repr
        kind = "tab"
    elif problem.startswith("mapping values are not allowed here"):
        kind = "colon"
    else:
        kind = "misaligned" if problem.startswith(MISALIGNED) else "other"
    return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML ({problem}). Fix: {SYNTAX_FIXES[kind]}"


def _json(text: str) -> Any:
    """The JSON document `text` holds, or None when it is no JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def read(path: str | Path) -> dict[str, Any]:
    """One config file as a mapping; an unreadable, empty, non-mapping or non-YAML file is a ConfigError."""
    try:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        if (as_json := _json(text)) is not None:  # JSON that YAML cannot read (tab-indented): Snakemake reads it as JSON
            loaded = as_json
        elif not (exc.problem_mark or exc.context_mark):
            raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())}). Fix: {SYNTAX_FIXES['other']}") from None
        else:  # the file, line and column of the misfit, as an editor reads them (Snakemake's own message names none)
            raise ConfigError(not_yaml(path, exc)) from None
    except (OSError, yaml.YAMLError) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"{path}: cannot read the configuration ({detail}). Fix: pass an existing YAML file.") from None
    if loaded is None:
        raise ConfigError(f"{path}: the configuration file is empty. Fix: write the configuration (see config/config.yaml)")
    if not isinstance(loaded, dict):
        kind = type(loaded).__name__
        raise ConfigError(f"{path}: holds a {kind}, not a mapping of keys. Fix: write `key: value` lines (see config/config.yaml)")
    return loaded
