"""The workflow configuration: checked against the schema, with one readable line per problem, and
completed with the schema's defaults (the only place defaults live)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

from rffm.errors import ConfigError

# Shipped inside the package (the worker image has no checkout); workflow/schemas/ links to it.
SCHEMA = Path(__file__).resolve().parent / "config.schema.yaml"


def load_schema(schema_path: str | Path = SCHEMA) -> dict[str, Any]:
    """The config schema as a mapping."""
    return yaml.safe_load(Path(schema_path).read_text())


def _where(path) -> str:
    return ".".join(str(part) for part in path) or "(top level)"


def _describe(error) -> str:
    where = _where(error.absolute_path)
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        known = ", ".join(sorted(error.schema.get("properties", {})))
        return f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed here: {known}"
    if error.validator == "required" and "then" in error.schema_path and isinstance(error.instance, dict):
        return f"{where}: {error.message} for source {error.instance.get('source')!r} (its options block; see config/README.md)"
    if error.validator == "required":
        return f"{where}: {error.message}"
    if "propertyNames" in error.schema_path:
        return f"{where}: name {error.instance!r} is not allowed: use lower-case letters, digits, '-' and '_' (no '__')"
    return f"{where}: {error.message}"


def schema_errors(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Every schema violation as 'dotted.key: what is wrong'."""
    errors = sorted(Draft202012Validator(schema).iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    return [_describe(error) for error in errors]


def reference_errors(config: dict[str, Any]) -> list[str]:
    """Runs and backbones must name datasets and backbones that exist."""
    problems = []
    for name, spec in config.get("backbones", {}).items():
        if spec.get("source") in ("pretrain", "random"):
            if "dataset" not in spec:
                problems.append(f"backbones.{name}.dataset: required for source {spec['source']!r} (the staged dataset it is built on)")
            elif spec["dataset"] not in config.get("datasets", {}):
                problems.append(f"backbones.{name}.dataset: {spec['dataset']!r} is not defined under datasets")
        elif spec.get("source") == "checkpoint" and not {"path", "sha256"} <= spec.keys():
            problems.append(f"backbones.{name}: source 'checkpoint' needs both `path` and `sha256`")
    for name, run in config.get("runs", {}).items():
        for key, table in (("dataset", "datasets"), ("backbone", "backbones")):
            if key in run and run[key] not in config.get(table, {}):
                defined = ", ".join(sorted(config.get(table, {}))) or "none"
                problems.append(f"runs.{name}.{key}: {run[key]!r} is not defined under {table} (defined: {defined})")
    return problems


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A schema node with its $ref followed (local references only)."""
    while "$ref" in node:
        target = schema
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def fill_defaults(instance: Any, node: dict[str, Any], schema: dict[str, Any]) -> None:
    """Set every absent key that has a `default` in the schema, recursively (also under if/then/else)."""
    before = None
    while before != instance:  # a default set by an if/then branch is filled in on the next pass
        before = copy.deepcopy(instance)
        _fill(instance, node, schema)


def _fill(instance: Any, node: dict[str, Any], schema: dict[str, Any]) -> None:
    node = _resolve(node, schema)
    if not isinstance(instance, dict):
        return
    properties = node.get("properties", {})
    for key, sub in properties.items():
        sub = _resolve(sub, schema)
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
        chosen = node.get("then") if Draft202012Validator(_resolve(node["if"], schema)).is_valid(instance) else node.get("else")
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


def problems(config: dict[str, Any], schema_path: str | Path = SCHEMA) -> list[str]:
    """Schema violations first; cross-references only once the shape is right."""
    return schema_errors(config, load_schema(schema_path)) or reference_errors(config)


def check(config: dict[str, Any], schema_path: str | Path = SCHEMA) -> dict[str, Any]:
    """Raise ConfigError listing every problem; otherwise complete the config with the schema's defaults (in place)."""
    found = problems(config, schema_path)
    if found:
        listing = "\n  ".join(found)
        raise ConfigError(f"invalid configuration (checked against {schema_path}):\n  {listing}")
    schema = load_schema(schema_path)
    fill_defaults(config, schema, schema)
    return config


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Nested merge, later values winning (as Snakemake merges several --configfile)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load(paths: list[str | Path], schema_path: str | Path = SCHEMA) -> dict[str, Any]:
    """Merge config files in order, check them and fill the defaults."""
    config: dict[str, Any] = {}
    for path in paths:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read the configuration ({exc}). Fix: pass an existing YAML file.") from None
        config = merge(config, loaded)
    return check(config, schema_path)


def for_results(results_dir: str | Path, paths: list[str | Path] | None = None) -> dict[str, Any]:
    """The workflow config that plans a results tree: the given files, else config/config.yaml when its
    `results` is this tree, else nothing (then every run found counts and nothing is stale)."""
    if paths:
        return load(paths)
    default = Path("config/config.yaml")
    if not default.exists():
        return {}
    config = load([default])
    return config if Path(config["results"]).resolve() == Path(results_dir).resolve() else {}
