"""The config schema: where it lives, its validator, and how to walk it (local $refs, the node of a key)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

# Shipped inside the package (the worker image has no checkout); workflow/schemas/ links to it.
SCHEMA = Path(__file__).resolve().parents[1] / "config.schema.yaml"

# JSON Schema counts 3.0 as an integer; range(), torch seeds and array shapes do not.
_TYPES = Draft202012Validator.TYPE_CHECKER.redefine("integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool))
Validator = validators.extend(Draft202012Validator, type_checker=_TYPES)
# Keys naming directories the workflow writes into, and what it would write at the root for each.
DIRECTORY_KEYS = ("results", "scratch", "checkpoint_store")
ROOT_WRITES = {"results": " (/datasets, /runs ...)"}


def load_schema(schema_path: str | Path = SCHEMA) -> dict[str, Any]:
    """The config schema as a mapping (libyaml's safe loader: every planning reads it)."""
    return yaml.load(Path(schema_path).read_text(), Loader=yaml.CSafeLoader)


def dotted(path: Iterable[Any]) -> str:
    """A key path as the dotted key problems name (`runs.baseline.train.lr`)."""
    return ".".join(str(part) for part in path) or "(top level)"


def resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A schema node with its $ref followed (local references only)."""
    while "$ref" in node:
        target = schema
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def node_at(schema: dict[str, Any], schema_path: Iterable[Any]) -> dict[str, Any]:
    """The schema node at a jsonschema schema path, $refs followed and merged with their siblings."""
    node: Any = schema
    for part in schema_path:
        if isinstance(node, dict):
            node = resolve(node, schema)
        if part != "$ref":
            node = node[part]
    return resolve(node, schema) if isinstance(node, dict) else {}


def node_for(schema: dict[str, Any], path: Iterable[Any]) -> dict[str, Any]:
    """The schema node that describes a config key (empty when the key is unknown)."""
    node = resolve(schema, schema)
    for part in path:
        if isinstance(part, int):
            child = node.get("items")
        else:
            child = node.get("properties", {}).get(part, node.get("additionalProperties"))
        if not isinstance(child, dict):
            return {}
        node = resolve(child, schema)
    return node
