"""The one validator: every problem of a config, one line each, in three passes; then the defaults filled in."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rffm.config.defaults import fill_defaults
from rffm.config.files import file_problems, merge, read
from rffm.config.host import machine_errors
from rffm.config.messages import schema_errors
from rffm.config.rules import cross_field_errors, follows_from, path_problems, reference_errors, references_as_written
from rffm.config.schema import SCHEMA, load_schema
from rffm.config.seeds import expand, seed_problems
from rffm.errors import ConfigError


def problems(
    config: dict[str, Any],
    schema_path: str | Path = SCHEMA,
    *,
    files: Iterable[str | Path] = (),
    runs_here: bool = False,
    local_files: bool = False,
) -> list[str]:
    """Every problem, one line each: files and schema first; the rest only once the shape is right.

    files: the config files read (their repeated keys); runs_here: jobs run on this machine (its scratch and GPU
    are theirs); local_files: results and imported files are paths on this machine (not in a storage bucket)."""
    schema = load_schema(schema_path)
    found = file_problems(files) + schema_errors(config, schema)
    if found:  # the names runs and backbones refer to need no valid shape: report them in the same pass
        return found + [p for p in references_as_written(config) if not follows_from(p, found)]
    filled = copy.deepcopy(config)
    fill_defaults(filled, schema, schema)
    if found := seed_problems(filled):
        return found
    expand(filled)  # each seed's run, reference or backbone is checked as any other
    found = reference_errors(filled) + path_problems(filled, local_files)
    if found:
        return found
    return cross_field_errors(filled) or machine_errors(filled, runs_here, local_files)


def check(config: dict[str, Any], schema_path: str | Path = SCHEMA, **where: Any) -> dict[str, Any]:
    """Raise ConfigError listing every problem; otherwise complete the config with the schema's defaults and expand
    each `seeds:` into its entries (rffm.config.seeds), in place.

    Keyword arguments as for `problems` (what the caller knows about the files read and this machine)."""
    found = problems(config, schema_path, **where)
    if found:
        listing = "\n  ".join(found)
        raise ConfigError(f"invalid configuration (checked against {schema_path}):\n  {listing}")
    schema = load_schema(schema_path)
    fill_defaults(config, schema, schema)
    return expand(config)


def load(paths: list[str | Path], schema_path: str | Path = SCHEMA, **where: Any) -> dict[str, Any]:
    """Merge config files in order, check them (repeated keys included) and fill the defaults."""
    config: dict[str, Any] = {}
    for path in paths:
        config = merge(config, read(path))
    return check(config, schema_path, files=paths, **where)


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
