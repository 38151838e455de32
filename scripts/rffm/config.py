"""The workflow configuration: checked against the schema, with one readable line per problem, and
completed with the schema's defaults (the only place defaults live).

One validator, in three passes, each problem one line `dotted.key: what is wrong. Fix: how`:
1. the files as written (keys given twice), every number finite, the schema (types, ranges, names);
2. once the shape is right: cross-references and constraints between fields (splits, SNR ranges,
   attention heads, patch vs signal length), and paths that would resolve to the filesystem root;
3. where the caller says so, the machine: results/scratch usable, imported files present, the GPU there.
Nothing is ever written while checking.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

from rffm.errors import ConfigError

# Shipped inside the package (the worker image has no checkout); workflow/schemas/ links to it.
SCHEMA = Path(__file__).resolve().parent / "config.schema.yaml"

# JSON Schema counts 3.0 as an integer; range(), torch seeds and array shapes do not.
_TYPES = Draft202012Validator.TYPE_CHECKER.redefine("integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool))
Validator = validators.extend(Draft202012Validator, type_checker=_TYPES)

SPLIT_TOLERANCE = 1e-6  # as staging checks it
MAX_SNR_POINTS = 1000
MAX_STRATUM_SAMPLES = 1 << 28  # one (class, SNR) pair is generated in memory: 2 GiB of float32 I and Q
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
DIRECTORY_KEYS = ("results", "scratch", "checkpoint_store")
ROOT_WRITES = {"results": " (/datasets, /runs ...)"}
BOUNDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))


def load_schema(schema_path: str | Path = SCHEMA) -> dict[str, Any]:
    """The config schema as a mapping."""
    return yaml.safe_load(Path(schema_path).read_text())


def _where(path: Iterable[Any]) -> str:
    return ".".join(str(part) for part in path) or "(top level)"


def _key(where: str, name: str) -> str:
    return name if where == "(top level)" else f"{where}.{name}"


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A schema node with its $ref followed (local references only)."""
    while "$ref" in node:
        target = schema
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _node_at(schema: dict[str, Any], schema_path: Iterable[Any]) -> dict[str, Any]:
    """The schema node at a jsonschema schema path, $refs followed and merged with their siblings."""
    node: Any = schema
    for part in schema_path:
        if isinstance(node, dict):
            node = _resolve(node, schema)
        if part != "$ref":
            node = node[part]
    return _resolve(node, schema) if isinstance(node, dict) else {}


def _node_for(schema: dict[str, Any], path: Iterable[Any]) -> dict[str, Any]:
    """The schema node that describes a config key (empty when the key is unknown)."""
    node = _resolve(schema, schema)
    for part in path:
        if isinstance(part, int):
            child = node.get("items")
        else:
            child = node.get("properties", {}).get(part, node.get("additionalProperties"))
        if not isinstance(child, dict):
            return {}
        node = _resolve(child, schema)
    return node


def allowed(node: dict[str, Any]) -> str:
    """What a schema node accepts, in words ('an integer >= 1 and <= 10000')."""
    if "enum" in node:
        return "one of " + ", ".join(map(str, node["enum"]))
    kinds = node.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    words = " or ".join(TYPE_WORDS.get(kind, kind) for kind in kinds) or "a value"
    bounds = [f"{symbol} {node[key]}" for key, symbol in BOUNDS if key in node]
    return f"{words} {' and '.join(bounds)}" if bounds else words


def _type_problem(error: Any, where: str, node: dict[str, Any]) -> str:
    value = error.instance
    if value is None:
        return f"{where}: has no value. Fix: write {allowed(node)}"
    if error.validator_value == "integer" and isinstance(value, float) and value.is_integer():
        return f"{where}: {error.message}. Fix: write {int(value)} ({allowed(node)})"
    return f"{where}: {error.message}. Fix: write {allowed(node)}"


def _describe(error: Any, schema: dict[str, Any]) -> str:
    """One line for one schema violation: the dotted key, what is wrong, the fix."""
    where = _where(error.absolute_path)
    node = _node_at(schema, list(error.absolute_schema_path)[:-1])
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
    return f"{where}: {error.message}. Fix: see config/REFERENCE.md"


# ---- pass 1: the files as written, finite numbers, the schema ----


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
                yield _where((*path, key)), first[key], line
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
            found[path] = f"{_where(path)}: {written} is not a finite number. Fix: write {allowed(_node_for(schema, path))}"
    return found


def schema_errors(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Every non-finite number and schema violation as 'dotted.key: what is wrong. Fix: how'."""
    bad_numbers = non_finite(config, schema)
    errors = sorted(Validator(schema).iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    # A NaN also fails every bound of its key: the non-finite line says it once.
    described = [_describe(error, schema) for error in errors if tuple(error.absolute_path) not in bad_numbers]
    return list(dict.fromkeys([*bad_numbers.values(), *described]))


# ---- pass 2: once the shape is right ----


def _follows_from(reference_problem: str, schema_problems: list[str]) -> bool:
    """Whether a reference problem is a consequence of a schema problem (of its own entry or the table it names)."""
    key = reference_problem.split(": ")[0]
    table = {"dataset": "datasets", "backbone": "backbones"}.get(key.rsplit(".", 1)[-1], "")
    for bad in (problem.split(": ")[0] for problem in schema_problems):
        if bad in ("(top level)", table) or key == bad or key.startswith(f"{bad}.") or bad.startswith(f"{key}."):
            return True
    return False


def _references_as_written(config: dict[str, Any]) -> list[str]:
    """reference_errors on a config that failed the schema (no defaults): only the names it can read."""
    sections = ("datasets", "backbones", "runs", "references")
    readable = {k: v for k, v in config.items() if k in sections and isinstance(v, dict)}
    readable = {k: {n: e for n, e in v.items() if isinstance(e, dict)} for k, v in readable.items()}
    try:
        return [p for p in reference_errors(readable) if "required for source" not in p and "needs both" not in p]
    except (TypeError, AttributeError, KeyError):
        return []


def reference_errors(config: dict[str, Any]) -> list[str]:
    """Runs and backbones must name datasets and backbones that exist."""
    problems = []
    for name, spec in config.get("backbones", {}).items():
        if spec.get("source") in ("pretrain", "random"):
            if "dataset" not in spec:
                problems.append(
                    f"backbones.{name}.dataset: required for source {spec['source']!r} (the staged dataset it is built on). "
                    "Fix: name one of the datasets"
                )
            elif spec["dataset"] not in config.get("datasets", {}):
                problems.append(f"backbones.{name}.dataset: {spec['dataset']!r} is not defined under datasets")
        elif spec.get("source") in ("checkpoint", "python", "export") and not {"path", "sha256"} <= spec.keys():
            problems.append(f"backbones.{name}: source {spec['source']!r} needs both `path` and `sha256`. Fix: add the missing one")
    for name, run in config.get("runs", {}).items():
        for key, table in (("dataset", "datasets"), ("backbone", "backbones")):
            if key in run and run[key] not in config.get(table, {}):
                defined = ", ".join(sorted(config.get(table, {}))) or "none"
                problems.append(f"runs.{name}.{key}: {run[key]!r} is not defined under {table} (defined: {defined})")
    for name, reference in config.get("references", {}).items():
        if name in config.get("runs", {}):
            problems.append(f"references.{name}: the id is also a run's; a reference is qualified under its own id. Fix: rename one")
        if reference.get("dataset") not in config.get("datasets", {}):
            defined = ", ".join(sorted(config.get("datasets", {}))) or "none"
            problems.append(f"references.{name}.dataset: {reference.get('dataset')!r} is not defined under datasets (defined: {defined})")
    return problems


def _snr_points(grid: dict[str, float]) -> int:
    """Points of a synthetic SNR grid, min to max inclusive (as staging builds it)."""
    return math.floor((grid["max"] - grid["min"]) / grid["step"] + 0.5) + 1


def dataset_problems(name: str, spec: dict[str, Any]) -> list[str]:
    """Constraints between the fields of one dataset (defaults filled in)."""
    where, problems = f"datasets.{name}", []
    splits = spec["splits"]
    total = splits["train"] + splits["val"] + splits["test"]
    if abs(total - 1) > SPLIT_TOLERANCE:
        problems.append(f"{where}.splits: train + val + test = {total:g}, not 1. Fix: give fractions that sum to 1 (e.g. 0.6, 0.2, 0.2)")
    ranges = [(f"{where}.select.snr_db", spec.get("select", {}).get("snr_db", {}))]
    synthetic = spec.get("synthetic") if spec["source"] == "synthetic" else None
    if synthetic is not None:
        ranges.append((f"{where}.synthetic.snr_db", synthetic["snr_db"]))
    for key, span in ranges:
        if span.get("min", -math.inf) > span.get("max", math.inf):
            problems.append(f"{key}: min {span['min']} is above max {span['max']}. Fix: make min <= max")
    if synthetic is None:
        return problems
    grid = synthetic["snr_db"]
    if grid["min"] <= grid["max"] and (points := _snr_points(grid)) > MAX_SNR_POINTS:
        problems.append(
            f"{where}.synthetic.snr_db.step: {grid['step']} makes {points} SNR points from {grid['min']} to {grid['max']} dB "
            f"(at most {MAX_SNR_POINTS}). Fix: use a step >= {(grid['max'] - grid['min']) / (MAX_SNR_POINTS - 1):.6g}"
        )
    samples = synthetic["examples_per_class_snr"] * synthetic["length"]
    if samples > MAX_STRATUM_SAMPLES:
        problems.append(
            f"{where}.synthetic.examples_per_class_snr: {synthetic['examples_per_class_snr']} x length {synthetic['length']} = "
            f"{samples} IQ samples per (class, SNR) pair, generated in memory at once (at most {MAX_STRATUM_SAMPLES}). "
            "Fix: lower examples_per_class_snr or length"
        )
    return problems


def signal_length(spec: dict[str, Any]) -> tuple[int, str] | None:
    """The IQ length of a dataset's examples and the key that sets it, where the config alone says it."""
    if spec["source"] == "synthetic":
        return spec["synthetic"]["length"], "synthetic.length"
    if spec["source"] == "sigmf":
        return spec["sigmf"]["window"], "sigmf.window"
    return None


def backbone_problems(config: dict[str, Any]) -> list[str]:
    """A built backbone's heads divide its width, and its patch divides every signal it reads."""
    problems = []
    for name, spec in config["backbones"].items():
        arch = spec.get("arch") if spec["source"] in ("pretrain", "random") else None
        if arch is None:
            continue
        where = f"backbones.{name}.arch"
        if arch["dim"] % arch["heads"]:
            divisors = [str(d) for d in range(1, min(arch["dim"], 256) + 1) if arch["dim"] % d == 0]
            problems.append(f"{where}.heads: {arch['heads']} does not divide dim {arch['dim']}. Fix: use one of {', '.join(divisors)}")
        if arch["output_layers"] > arch["depth"] + 1:
            problems.append(
                f"{where}.output_layers: {arch['output_layers']} exceeds depth + 1 = {arch['depth'] + 1} (the embedding and "
                f"each block). Fix: use 1 to {arch['depth'] + 1}"
            )
        readers = [spec.get("dataset")] + [run["dataset"] for run in config["runs"].values() if run["backbone"] == name]
        for dataset in dict.fromkeys(d for d in readers if d in config["datasets"]):
            known = signal_length(config["datasets"][dataset])
            if known is None or known[0] % arch["patch"] == 0:
                continue
            length, key = known
            wrong = "is longer than" if arch["patch"] > length else "does not divide"
            problems.append(
                f"{where}.patch: {arch['patch']} {wrong} the signal length {length} (datasets.{dataset}.{key}). "
                f"Fix: use a patch that divides {length}, or change datasets.{dataset}.{key}"
            )
    return problems


def _is_root(value: str, resolve: bool) -> bool:
    path = Path(os.path.realpath(value) if resolve else os.path.normpath(value))
    return path.is_absolute() and path.parent == path


def path_problems(config: dict[str, Any], local_files: bool) -> list[str]:
    """Output directories that would resolve to the filesystem root (relative ones from the working directory)."""
    problems = []
    for key in DIRECTORY_KEYS:
        value = config.get(key)
        if isinstance(value, str) and "://" not in value and _is_root(value, local_files):
            problems.append(
                f"{key}: {value!r} resolves to the filesystem root, so the workflow would write straight into /{ROOT_WRITES.get(key, '')}. "
                "Fix: name a directory of its own below the root"
            )
    return problems


def cross_field_errors(config: dict[str, Any]) -> list[str]:
    """Constraints between fields, on a config whose defaults are filled in."""
    problems = []
    for name, spec in config["datasets"].items():
        problems += dataset_problems(name, spec)
    return problems + backbone_problems(config)


# ---- pass 3: this machine (only where the caller says the workflow's files and jobs are here) ----


def _from_cwd(path: str) -> str:
    """Where a relative path starts from, for a Fix that names it."""
    return "" if os.path.isabs(path) else f" (relative paths start from {os.getcwd()})"


def unusable_directory(value: str) -> str | None:
    """Why a directory could not be created or written at value, or None; never creates anything."""
    path = Path(os.path.abspath(value))
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path} is a file, not a directory"
    ancestor = path
    while not os.path.exists(ancestor):  # the first ancestor that exists is where mkdir -p would start
        if os.path.lexists(ancestor):
            return f"{ancestor} is a broken symbolic link (to {os.readlink(ancestor)})"
        ancestor = ancestor.parent
    if not os.path.isdir(ancestor):
        return f"{path} lies under the file {ancestor}"
    if not os.access(ancestor, os.W_OK | os.X_OK):  # root passes unless the filesystem is read-only
        return f"{ancestor} is not writable" + ("" if ancestor == path else f", so {path} cannot be created")
    if (kind := _kernel_filesystem(ancestor)) is not None:  # root passes os.access there, but mkdir fails
        return f"{ancestor} is on the kernel's {kind} filesystem, where no directory can be made or written" + (
            "" if ancestor == path else f", so {path} cannot be created"
        )
    return None


# Filesystems the kernel fills itself: their modes say writable to root, but mkdir and new files fail (EPERM/ENOENT).
KERNEL_FILESYSTEMS = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs", "debugfs", "tracefs", "configfs", "pstore", "bpf"}


def _kernel_filesystem(path: Path) -> str | None:
    """The type of the kernel filesystem `path` lies on (its mount from /proc/self/mounts), None for ordinary storage."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    real, best, kind = os.path.realpath(path), "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind if kind in KERNEL_FILESYSTEMS else None


def directory_problems(config: dict[str, Any], keys: Iterable[str]) -> list[str]:
    """Configured directories that are files, lie under a file, or cannot be written."""
    problems = []
    for key in keys:
        value = config.get(key)
        if isinstance(value, str) and "://" not in value and (why := unusable_directory(value)):
            problems.append(f"{key}: {why}. Fix: set {key} to a directory you can write{_from_cwd(value)}")
    return problems


IMPORTED_FILE = {"checkpoint": "backbone.pt", "python": "weights file", "export": ".pt2 program"}


def imported_file_problems(config: dict[str, Any]) -> list[str]:
    """Backbone checkpoints and dataset source files that are not there."""
    from rffm.data.sources import input_files

    problems = []
    for name, spec in config["backbones"].items():
        path = spec.get("path")
        if spec["source"] in ("checkpoint", "python", "export") and path and not Path(path).is_file():
            problems.append(
                f"backbones.{name}.path: {path} {'is a directory' if Path(path).is_dir() else 'does not exist'}. "
                f"Fix: point it at the {IMPORTED_FILE[spec['source']]} to import{_from_cwd(path)}"
            )
    for name, spec in config["datasets"].items():
        key = f"datasets.{name}.{spec['source']}" + (".recordings" if spec["source"] == "sigmf" else ".path")
        for path in input_files({"name": name, **spec}):
            if not Path(path).exists():
                problems.append(f"{key}: {path} does not exist. Fix: point it at the source file{_from_cwd(path)}")
    return problems


def device_problems(device: str) -> list[str]:
    """A configured CUDA device that torch cannot see on this machine."""
    if not device.startswith("cuda"):
        return []
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index < count:
        return []
    build = f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}"
    seen = f"torch sees {count} GPU(s) here" if count else f"torch sees no GPU here ({build})"
    return [f"device: {device!r} but {seen}. Fix: set device: cpu (or auto), or run where that GPU is visible"]


def machine_errors(config: dict[str, Any], runs_here: bool, local_files: bool) -> list[str]:
    """What this machine must provide: writable results, imported files, and (when jobs run here) scratch and the GPU."""
    problems = []
    if local_files:
        problems += directory_problems(config, ("results", "checkpoint_store")) + imported_file_problems(config)
    if runs_here:
        problems += directory_problems(config, ("scratch",)) + device_problems(config["device"])
    return problems


# ---- defaults ----


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
        chosen = node.get("then") if Validator(_resolve(node["if"], schema)).is_valid(instance) else node.get("else")
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


# ---- the one entry point ----


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
        return found + [p for p in _references_as_written(config) if not _follows_from(p, found)]
    filled = copy.deepcopy(config)
    fill_defaults(filled, schema, schema)
    found = reference_errors(filled) + path_problems(filled, local_files)
    if found:
        return found
    return cross_field_errors(filled) or machine_errors(filled, runs_here, local_files)


def check(config: dict[str, Any], schema_path: str | Path = SCHEMA, **where: Any) -> dict[str, Any]:
    """Raise ConfigError listing every problem; otherwise complete the config with the schema's defaults (in place).

    Keyword arguments as for `problems` (what the caller knows about the files read and this machine)."""
    found = problems(config, schema_path, **where)
    if found:
        listing = "\n  ".join(found)
        raise ConfigError(f"invalid configuration (checked against {schema_path}):\n  {listing}")
    schema = load_schema(schema_path)
    fill_defaults(config, schema, schema)
    return config


def snakemake_settings(workflow: Any) -> dict[str, Any]:
    """`check`'s keyword arguments for the workflow Snakemake is parsing (common.smk passes its `workflow`)."""
    settings = workflow.config_settings
    # Replacing the workflow config (rffm posttrain) discards the Snakefile's `configfile:`; only the given files count.
    replaced = settings.replace_workflow_config and settings.overwrite_config
    files = workflow.overwrite_configfiles if replaced else workflow.configfiles
    # The executor is chosen only after the Snakefile is parsed (workflow.local_exec is always True here), but the
    # command line has been read: a local run has cores and no node count; a cluster run (SLURM, Google Batch)
    # has --jobs as its node count, a dry run runs nothing, and a job already on a node or VM (remote mode) or in
    # a subprocess of the local run was checked by the Snakemake that started it.
    resources = workflow.resource_settings
    runs_here = (
        resources.cores is not None
        and resources.nodes is None
        and not getattr(workflow.output_settings, "dryrun", False)
        and not workflow.remote_exec
        and not workflow.subprocess_exec
    )
    # With a default storage provider (profiles/gcp-batch) results and inputs are objects in a bucket, not local paths.
    local_files = workflow.storage_settings.default_storage_provider is None
    return {"files": [Path(f) for f in files], "runs_here": runs_here, "local_files": local_files}


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


def check_default_file(path: str | Path, workflow: Any) -> None:
    """The Snakefile's own configfile, before Snakemake loads it: an empty or non-mapping file stops with the
    workflow's one line (PlanRefused) instead of Snakemake's generic message. Files given with --configfile are
    read by Snakemake's command line before any workflow code runs, so their message stays Snakemake's."""
    from rffm.errors import PlanRefused

    settings = workflow.config_settings
    if (settings.replace_workflow_config and settings.overwrite_config) or not Path(path).is_file():
        return
    try:
        read(path)
    except ConfigError as error:
        raise PlanRefused(f"rffm: {error}") from None
