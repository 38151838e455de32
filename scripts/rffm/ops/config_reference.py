"""The configuration reference: the config schema's keys, types, defaults and descriptions as Markdown.

config/REFERENCE.md holds the rendered table between two marker lines; `make docs`
(`rffm config_reference --write config/REFERENCE.md`) refreshes it after a schema change, and a test
fails while it is out of date.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from rffm.config import SCHEMA
from rffm.errors import ConfigError

BEGIN = "<!-- BEGIN config-reference: generated from the config schema by `rffm config_reference --write config/REFERENCE.md` -->"
END = "<!-- END config-reference -->"


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if not ref:
        return node
    target = schema
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**_resolve(target, schema), **{k: v for k, v in node.items() if k != "$ref"}}


def _code(value: Any) -> str:
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def describe_type(node: dict[str, Any]) -> str:
    """A short human summary of a schema node's type and constraints."""
    if "enum" in node:
        return "one of " + ", ".join(_code(v) for v in node["enum"])
    kind = node.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    bounds = []
    for key, symbol in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")):
        if key in node:
            bounds.append(f"{symbol} {node[key] if isinstance(node[key], int) else format(node[key], 'g')}")  # ints exact: 4294967295
    if kind == "array":
        items = node.get("items", {})
        inner = "one of " + ", ".join(_code(v) for v in items["enum"]) if "enum" in items else items.get("type", "any")
        size = f", at least {node['minItems']}" if "minItems" in node else ""
        return f"list ({inner}{size}{', unique' if node.get('uniqueItems') else ''})"
    if "pattern" in node and kind == "string":
        return f"string matching `{node['pattern']}`"
    return kind + (" " + ", ".join(bounds) if bounds else "")


def rows(schema: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) for every key, depth first in schema order."""
    out: list[tuple[str, str, str, str]] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        node = _resolve(node, schema)
        for name, child in node.get("properties", {}).items():
            child = _resolve(child, schema)
            key = f"{prefix}{name}"
            nested = "properties" in child or isinstance(child.get("additionalProperties"), dict)
            default = _code(child["default"]) if "default" in child and child["default"] != {} else ""
            kind = "mapping" if nested else describe_type(child)
            kind += " (required)" if name in node.get("required", []) else ""
            out.append((key, kind, default, " ".join(str(child.get("description", "")).split())))
            if nested:
                walk(child, f"{key}.")
        entry = node.get("additionalProperties")
        if isinstance(entry, dict):
            names = _resolve(node.get("propertyNames", {}), schema)
            placeholder = "<name>"
            rule = names.get("description")
            out.append((f"{prefix}{placeholder}", "mapping", "", f"One entry per name; names: {rule}" if rule else "One entry per name"))
            walk(entry, f"{prefix}{placeholder}.")

    walk(schema, "")
    return out


def render(schema_path: str | Path = SCHEMA) -> str:
    """The Markdown table of every configuration key."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, kind, default, description in rows(schema):
        cells = [f"`{key}`", kind, default, description]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def replace_section(text: str, table: str, path: str | Path) -> str:
    """The document with the generated section between the markers replaced by `table`."""
    if BEGIN not in text or END not in text:
        raise ConfigError(f"{path}: no generated config-reference section. Fix: add the lines {BEGIN} and {END}, each on its own line")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def update(document: str | Path, schema_path: str | Path = SCHEMA, write: bool = False) -> bool:
    """Whether the document's section is up to date; with write=True, make it so."""
    document = Path(document)
    text = document.read_text()
    fresh = replace_section(text, render(schema_path), document)
    if write and fresh != text:
        document.write_text(fresh)
    return fresh == text
