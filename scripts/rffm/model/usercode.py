"""The user's model code as files (no import, no torch): where an entry point's package is and what its source is.

Snakemake computes this while planning (a param of import_backbone), so editing the user's class reruns
the import and what follows, and touching its files reruns nothing.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import sys
from pathlib import Path
from typing import Any

from rffm.errors import ConfigError
from rffm.records.files import sha256_file, sha256_json

SOURCE_SUFFIXES = (".py",)


def split_entry_point(entry_point: str, where: str) -> tuple[str, str]:
    """'package.module:factory' -> (module, factory)."""
    module, sep, attr = entry_point.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(
            f"{where}.python.entry_point: {entry_point!r} is not 'package.module:factory'. "
            f"Fix: name the module and the function that returns the nn.Module."
        )
    return module, attr


def import_path_fix(where: str, module: str) -> str:
    """The Fix for a module Python cannot find: the folder python.import_path names, or an installed package."""
    top = module.split(".")[0]
    return f"Fix: set {where}.python.import_path to the folder that holds {top}/ or {top}.py, or install the package."


def search_path(import_path: str | None) -> list[str]:
    return [str(Path(import_path).resolve())] if import_path else list(sys.path)


def user_source(entry_point: str, import_path: str | None, where: str) -> dict[str, Any]:
    """The user's package (or module) as files, without importing it: name, version, per-file sha256, one digest."""
    module, _ = split_entry_point(entry_point, where)
    top = module.split(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, search_path(import_path))
    if spec is None or (spec.origin in (None, "built-in", "frozen") and not spec.submodule_search_locations):
        place = f"in {import_path}" if import_path else "on the Python path (installed packages)"
        missing = f"{where}.python.entry_point: module {top!r} of {entry_point!r} is not found {place}."
        raise ConfigError(f"{missing} {import_path_fix(where, top)}")
    if spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        files = sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts)
        base = root.parent
    else:
        files, base = [Path(spec.origin)], Path(spec.origin).parent
    digests = {str(p.relative_to(base)): sha256_file(p) for p in files}
    try:
        version = importlib.metadata.version(top)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"package": top, "version": version, "files": digests, "sha256": sha256_json(digests)}
