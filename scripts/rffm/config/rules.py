"""Domain rules, checked once the shape is right (defaults filled in): names that must exist, constraints
between fields (splits, SNR ranges, attention heads, patch vs signal length), paths that resolve to the root."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from rffm.backbone_kinds import BUILT_HERE, IMPORTED, NATIVE
from rffm.config.schema import DIRECTORY_KEYS, ROOT_WRITES
from rffm.model.taps import declared_names

SPLIT_TOLERANCE = 1e-6  # as staging checks it
MAX_SNR_POINTS = 1000
MAX_STRATUM_SAMPLES = 1 << 28  # one (class, SNR) pair is generated in memory: 2 GiB of float32 I and Q


def follows_from(reference_problem: str, schema_problems: list[str]) -> bool:
    """Whether a reference problem is a consequence of a schema problem (of its own entry or the table it names)."""
    key = reference_problem.split(": ")[0]
    table = {"dataset": "datasets", "backbone": "backbones"}.get(key.rsplit(".", 1)[-1], "")
    for bad in (problem.split(": ")[0] for problem in schema_problems):
        if bad in ("(top level)", table) or key == bad or key.startswith(f"{bad}.") or bad.startswith(f"{key}."):
            return True
    return False


def references_as_written(config: dict[str, Any]) -> list[str]:
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
        if spec.get("source") in BUILT_HERE:
            if "dataset" not in spec:
                problems.append(
                    f"backbones.{name}.dataset: required for source {spec['source']!r} (the staged dataset it is built on). "
                    "Fix: name one of the datasets"
                )
            elif spec["dataset"] not in config.get("datasets", {}):
                problems.append(f"backbones.{name}.dataset: {spec['dataset']!r} is not defined under datasets")
        elif spec.get("source") in IMPORTED and not {"path", "sha256"} <= spec.keys():
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
    for name in config.get("design", {}):
        if name not in config.get("runs", {}) and name not in config.get("references", {}):
            problems.append(f"design.{name}: names no run or reference. Fix: key it by the id of the run or reference the design is behind")
    return problems


def _snr_points(grid: dict[str, float]) -> int:
    """Points of a synthetic SNR grid, min to max inclusive (as staging builds it)."""
    return math.floor((grid["max"] - grid["min"]) / grid["step"] + 0.5) + 1


def common_divisors(lengths: list[int]) -> str:
    """The numbers that divide every length, listed."""
    common = math.gcd(*lengths)
    return ", ".join(str(d) for d in range(1, common + 1) if common % d == 0)


def dataset_problems(name: str, spec: dict[str, Any]) -> list[str]:
    """Constraints between the fields of one dataset (defaults filled in)."""
    where, problems = f"datasets.{name}", []
    splits = spec["splits"]
    total = splits["train"] + splits["val"] + splits["test"]
    if abs(total - 1) > SPLIT_TOLERANCE:
        problems.append(
            f"{where}.splits: train + val + test = {total:g}, not 1. "
            "Fix: give fractions that sum to 1, e.g. splits: {train: 0.6, val: 0.2, test: 0.2}"
        )
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
        arch = spec.get("arch") if spec["source"] in BUILT_HERE else None
        if arch is None:
            continue
        where = f"backbones.{name}.arch"
        if arch["dim"] % arch["heads"]:
            divisors = [str(d) for d in range(1, min(arch["dim"], 256) + 1) if arch["dim"] % d == 0]
            problems.append(f"{where}.heads: {arch['heads']} does not divide dim {arch['dim']}. Fix: use one of {', '.join(divisors)}")
        if arch["output_layers"] > arch["depth"] + 1:
            problems.append(
                f"{where}.output_layers: {arch['output_layers']} exceeds depth + 1 = {arch['depth'] + 1} (the embedding and "
                f"each block). Fix: set output_layers to 1 to {arch['depth'] + 1} "
                "(when it is not written, its default is for the default depth)"
            )
        readers = [spec.get("dataset")] + [run["dataset"] for run in config["runs"].values() if run["backbone"] == name]
        known = {d: signal_length(config["datasets"][d]) for d in dict.fromkeys(d for d in readers if d in config["datasets"])}
        lengths = sorted({length for length, _ in filter(None, known.values())})
        for dataset, (length, key) in ((d, k) for d, k in known.items() if k is not None):
            if length % arch["patch"] == 0:
                continue
            wrong = "is longer than" if arch["patch"] > length else "does not divide"
            # one patch serves every dataset the backbone reads: name a patch that divides them all
            fits = (
                f"{length}"
                if len(lengths) == 1
                else f"every length it reads ({', '.join(map(str, lengths))}: one of {common_divisors(lengths)})"
            )
            problems.append(
                f"{where}.patch: {arch['patch']} {wrong} the signal length {length} (datasets.{dataset}.{key}). "
                f"Fix: use a patch that divides {fits}, or change datasets.{dataset}.{key}"
            )
    return problems


def head_tap_problems(config: dict[str, Any]) -> list[str]:
    """The taps a run's head reads (train.head.taps, each sweep value) are taps its backbone's cache holds."""
    problems = []
    for run, spec in config["runs"].items():
        names = declared_names(config["backbones"][spec["backbone"]])
        if names is None:
            continue  # a probe tells: train_epoch checks them against the cache record
        asked = [(f"runs.{run}.train.head.taps", spec["train"]["head"].get("taps"))]
        asked += [(f"runs.{run}.sweep.train.head.taps", value) for value in (spec.get("sweep") or {}).get("train.head.taps", [])]
        for where, read in asked:  # the names of the taps the head reads
            unknown = [tap for tap in read or [] if tap not in names]
            if unknown:
                problems.append(
                    f"{where}: {unknown[0]!r} is not a tap of backbone {spec['backbone']} (its cache holds {', '.join(names)}). "
                    "Fix: name taps from that list"
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


def tail_problems(config: dict[str, Any]) -> list[str]:
    """A run's tail (train.tail) is blocks its backbone has and its cache holds the input of; a sweep of its lr needs it."""
    problems = []
    for run, spec in config["runs"].items():
        tail, backbone = spec["train"].get("tail"), config["backbones"][spec["backbone"]]
        if "train.tail.lr" in (spec.get("sweep") or {}) and not tail:
            problems.append(f"runs.{run}.sweep.train.tail.lr: the run has no train.tail. Fix: add train.tail (blocks, lr) or drop the key")
        if not tail:
            continue
        if backbone["source"] not in NATIVE:
            problems.append(
                f"runs.{run}.train.tail: tail adaptation runs rffm's own backbone blocks; backbone {spec['backbone']} is a "
                f"{backbone['source']} backbone. Fix: drop runs.{run}.train.tail (its head then reads the frozen taps)"
            )
            continue
        arch = backbone.get("arch")
        if arch is None:
            continue  # a checkpoint: its arch is known once imported (train_epoch checks it)
        if tail["blocks"] > arch["depth"] or arch["output_layers"] < tail["blocks"] + 1 or backbone.get("keep", "all") != "all":
            problems.append(
                f"runs.{run}.train.tail.blocks: {tail['blocks']} block(s) of backbone {spec['backbone']} (depth {arch['depth']}) need "
                f"the input of the first of them cached (arch.output_layers {arch['output_layers']}, keep {backbone.get('keep', 'all')}). "
                f"Fix: set backbones.{spec['backbone']}.arch.output_layers to at least {tail['blocks'] + 1} with keep all, "
                f"or train at most {max(0, min(arch['depth'], arch['output_layers'] - 1))} block(s)"
            )
    return problems


def cross_field_errors(config: dict[str, Any]) -> list[str]:
    """Constraints between fields, on a config whose defaults are filled in."""
    problems = []
    for name, spec in config["datasets"].items():
        problems += dataset_problems(name, spec)
    return problems + backbone_problems(config) + head_tap_problems(config) + tail_problems(config)
