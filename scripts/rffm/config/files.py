"""Config files as written: read one, merge several (as Snakemake does), and list every key given twice."""

from __future__ import annotations

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


def read(path: str | Path) -> dict[str, Any]:
    """One config file as a mapping; an unreadable, empty or non-mapping file is a ConfigError."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"{path}: cannot read the configuration ({detail}). Fix: pass an existing YAML file.") from None
    if loaded is None:
        raise ConfigError(f"{path}: the configuration file is empty. Fix: write the configuration (see config/config.yaml)")
    if not isinstance(loaded, dict):
        kind = type(loaded).__name__
        raise ConfigError(f"{path}: holds a {kind}, not a mapping of keys. Fix: write `key: value` lines (see config/config.yaml)")
    return loaded
