"""Configuration checks with one readable line per problem (used by the workflow before any job)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator


def selection_options(run: dict[str, Any]) -> dict[str, str]:
    """A run's selection metric and mode; without a mode, losses are minimized and everything else maximized."""
    options = {"metric": "val_accuracy", **run.get("selection", {})}
    options.setdefault("mode", "min" if options["metric"].endswith("loss") else "max")
    return options


def _where(path) -> str:
    return ".".join(str(part) for part in path) or "(top level)"


def _describe(error) -> str:
    where = _where(error.absolute_path)
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        known = ", ".join(sorted(error.schema.get("properties", {})))
        return f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed here: {known}"
    if error.validator == "required" and "then" in error.schema_path and isinstance(error.instance, dict):
        return f"{where}: {error.message} for source {error.instance.get('source')!r} (its options block; see README)"
    if error.validator == "required":
        return f"{where}: {error.message}"
    if "propertyNames" in error.schema_path:
        return f"{where}: name {error.instance!r} is not allowed: use lower-case letters, digits, '-' and '_' (no '__')"
    return f"{where}: {error.message}"


def schema_errors(config: dict[str, Any], schema_path: str | Path) -> list[str]:
    """Every schema violation as 'dotted.key: what is wrong'."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
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


def problems(config: dict[str, Any], schema_path: str | Path) -> list[str]:
    """Schema violations first; cross-references only once the shape is right."""
    return schema_errors(config, schema_path) or reference_errors(config)
