"""Schema violations as one readable line each: `dotted.key: what is wrong. Fix: how` (every NaN and infinity too)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from rffm.config.schema import DIRECTORY_KEYS, ROOT_WRITES, Validator, dotted, node_at, node_for

TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
}
PATTERN_FIXES = {
    "device": "use auto, cpu, cuda or cuda:N",
    "sha256": "write the file's sha256 as 64 lower-case hex digits (`sha256sum <file>`)",
    "launch_profile": "use letters, digits, '.', '_' and '-' only",
}
BOUNDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))
# The schema keywords a violation of which _describe puts in words (its own line and Fix for each): the schema uses
# no other (tests/unit/test_fixes_config.py walks it), so a keyword added to it without its words fails that test.
DESCRIBED = frozenset(
    {"additionalProperties", "propertyNames", "required", "type", "enum", "const", "pattern", "minLength", "minProperties"}
    | {"minItems", "uniqueItems", "oneOf", *(key for key, _ in BOUNDS)}
)


def _key(where: str, name: str) -> str:
    return name if where == "(top level)" else f"{where}.{name}"


def allowed(node: dict[str, Any]) -> str:
    """What a schema node accepts, in words ('an integer >= 1 and <= 10000')."""
    if "enum" in node:
        return "one of " + ", ".join(map(str, node["enum"]))
    kinds = node.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    words = " or ".join(TYPE_WORDS.get(kind, kind) for kind in kinds) or "a value"
    bounds = [f"{symbol} {node[key]}" for key, symbol in BOUNDS if key in node]
    return f"{words} {' and '.join(bounds)}" if bounds else words


def alternatives(branches: list[dict[str, Any]]) -> str:
    """What the branches of a oneOf accept, in words ('an integer >= 2, or a list of distinct items, each an integer >= 2')."""
    words = []
    for branch in branches:
        if branch.get("type") == "array" and isinstance(branch.get("items"), dict):
            words.append(f"a list of {'distinct ' if branch.get('uniqueItems') else ''}items, each {allowed(branch['items'])}")
        else:
            words.append(allowed(branch))
    return ", or ".join(words)


def _type_problem(error: Any, where: str, node: dict[str, Any]) -> str:
    value = error.instance
    if value is None:
        return f"{where}: has no value. Fix: write {allowed(node)}"
    if error.validator_value == "integer" and isinstance(value, float) and value.is_integer():
        return f"{where}: {error.message}. Fix: write {int(value)} ({allowed(node)})"
    return f"{where}: {error.message}. Fix: write {allowed(node)}"


def _describe(error: Any, schema: dict[str, Any]) -> str:
    """One line for one schema violation: the dotted key, what is wrong, the fix."""
    where = dotted(error.absolute_path)
    node = node_at(schema, list(error.absolute_schema_path)[:-1])
    kind = error.validator
    if kind == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        known = ", ".join(sorted(error.schema.get("properties", {})))
        return f"{where}: unknown key(s) {', '.join(map(repr, unknown))}. Fix: remove or rename it; allowed here: {known}"
    if "propertyNames" in error.absolute_schema_path:
        return f"{where}: name {error.instance!r} is not allowed. Fix: use lower-case letters, digits, '-' and '_' (no '__')"
    if kind == "required":
        name = next(p for p in error.validator_value if error.message.startswith(repr(p)))
        if "then" in error.absolute_schema_path and isinstance(error.instance, dict):
            source = error.instance.get("source")
            return f"{_key(where, name)}: missing; source {source!r} needs it. Fix: add its options block (config/examples/{source}.yaml)"
        return f"{_key(where, name)}: missing (required). Fix: add it (see config/REFERENCE.md)"
    if kind == "type":
        return _type_problem(error, where, node)
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{where}: {error.message}. Fix: use {allowed(node)}"
    if kind in ("enum", "const"):
        return f"{where}: {error.instance!r} is not allowed. Fix: use {allowed(node) if kind == 'enum' else repr(error.validator_value)}"
    if kind == "pattern":
        fix = PATTERN_FIXES.get(str(error.absolute_path[-1]) if error.absolute_path else "", f"match {error.validator_value}")
        return f"{where}: {error.instance!r} is not allowed. Fix: {fix}"
    if kind == "minLength" and where in DIRECTORY_KEYS:
        root = f"every path under it would resolve against the filesystem root{ROOT_WRITES.get(where, '')}"
        example = f", e.g. {where}: {node['default']}" if "default" in node else ""
        return f"{where}: empty, so {root}. Fix: name a directory{example}"
    if kind == "minLength":
        return f"{where}: empty. Fix: write a non-empty value"
    if kind == "minProperties":
        return f"{where}: nothing defined. Fix: define at least one entry (see config/config.yaml)"
    if kind == "minItems":
        return f"{where}: {len(error.instance)} item(s). Fix: list at least {error.validator_value}"
    if kind == "uniqueItems":
        return f"{where}: an item is listed twice. Fix: list each once"
    if kind == "oneOf":
        return f"{where}: {error.instance!r} is not allowed. Fix: write {alternatives(node['oneOf'])}"
    # unreachable while DESCRIBED covers the schema's keywords: no Fix is claimed for a check nothing here words
    return f"{where}: {error.message} (schema keyword {kind!r}, which rffm.config.messages does not word: a bug). Fix: report this line"


def _numbers(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], float]]:
    if isinstance(value, float):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _numbers(item, (*path, index))


def non_finite(config: dict[str, Any], schema: dict[str, Any]) -> dict[tuple[Any, ...], str]:
    """Every NaN or infinity in the config (YAML .nan/.inf, JSON NaN/Infinity), by key path."""
    found = {}
    for path, value in _numbers(config):
        if not math.isfinite(value):
            written = ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
            found[path] = f"{dotted(path)}: {written} is not a finite number. Fix: write {allowed(node_for(schema, path))}"
    return found


def schema_errors(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Every non-finite number and schema violation as 'dotted.key: what is wrong. Fix: how'."""
    bad_numbers = non_finite(config, schema)
    errors = sorted(Validator(schema).iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    # A NaN also fails every bound of its key: the non-finite line says it once.
    described = [_describe(error, schema) for error in errors if tuple(error.absolute_path) not in bad_numbers]
    return list(dict.fromkeys([*bad_numbers.values(), *described]))
