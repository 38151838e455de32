"""The schema's defaults (the only place defaults live), filled into a config or one entry of it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from rffm.config.schema import SCHEMA, Validator, load_schema, resolve


def fill_defaults(instance: Any, node: dict[str, Any], schema: dict[str, Any]) -> None:
    """Set every absent key that has a `default` in the schema, recursively (also under if/then/else)."""
    before = None
    while before != instance:  # a default set by an if/then branch is filled in on the next pass
        before = copy.deepcopy(instance)
        _fill(instance, node, schema)


def _fill(instance: Any, node: dict[str, Any], schema: dict[str, Any]) -> None:
    node = resolve(node, schema)
    if not isinstance(instance, dict):
        return
    properties = node.get("properties", {})
    for key, sub in properties.items():
        sub = resolve(sub, schema)
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            _fill(instance[key], sub, schema)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        for key in [k for k in instance if k not in properties]:
            _fill(instance[key], extra, schema)
    for branch in node.get("allOf", []):
        _fill(instance, branch, schema)
    if "if" in node:
        chosen = node.get("then") if Validator(resolve(node["if"], schema)).is_valid(instance) else node.get("else")
        if chosen:
            _fill(instance, chosen, schema)


def entry_defaults(section: str, spec: dict[str, Any], schema_path: str | Path = SCHEMA) -> dict[str, Any]:
    """A top-level block (e.g. `cache`), or one entry of `datasets`, `backbones` or `runs`, completed with the
    schema's defaults (for steps called by hand or from Python)."""
    schema = load_schema(schema_path)
    node = schema["properties"][section]
    entries = node.get("additionalProperties")
    filled = copy.deepcopy(spec)
    fill_defaults(filled, entries if isinstance(entries, dict) else node, schema)
    return filled
