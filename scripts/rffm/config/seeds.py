"""Seeds as an axis: a run, reference or built backbone trained with several seeds, each seed its own entry.

`seeds:` on a run or reference lists its train seeds (or counts them from train.seed); on a backbone built here
(source pretrain or random) its pretraining seeds (from pretrain.seed). The first seed keeps the entry's name and
config, so adding seeds to a finished study reruns nothing; every other seed s becomes an entry of its own,
`<id>-seed<s>` (a backbone's: runs on it are repeated on each, `<run>-pseed<s>`), a copy with only that seed changed.
Each is an ordinary run, reference or backbone to the workflow (its own artifact and test exposure; replicas of a
run share its cache when the backbone is the same). `rffm compare` shows a seed group as one row (`group_of`).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from rffm.backbone_kinds import BUILT_HERE

SEEDS = "seeds"
SEED_SUFFIX = "-seed"  # a train seed's replica: <id>-seed<s>
PRETRAIN_SUFFIX = "-pseed"  # a run on a pretraining seed's replica of its backbone: <run>-pseed<s>
REPLICA = re.compile(rf"^(?P<base>.+?)(?:{SEED_SUFFIX}(?P<seed>\d+))?(?:{PRETRAIN_SUFFIX}(?P<pseed>\d+))?$")


def seed_list(given: int | list[int], first: int) -> list[int]:
    """The seeds `seeds:` names: a count n is first, first + 1, ..., first + n - 1; a list as written."""
    return [first + i for i in range(given)] if isinstance(given, int) else list(given)


def _first_seed(section: str, spec: dict[str, Any]) -> tuple[str, int] | None:
    """(the key that holds an entry's seed, its value), or None for a backbone with no seed (not built here)."""
    if section == "backbones":
        return ("pretrain.seed", spec.get("pretrain", {}).get("seed", 0)) if spec.get("source") in BUILT_HERE else None
    return "train.seed", spec.get("train", {}).get("seed", 0)


def replicas(config: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(section, name, config) of every entry the config's `seeds:` add, backbones first (each run on a seeded
    backbone repeated on each of its replicas, `<run>-pseed<s>`), then each run's and reference's train seeds
    (a pretraining replica's: `<run>-seed<s>-pseed<p>`). The config is not changed; `seeds:` that cannot expand
    (seed_problems) are skipped."""
    added: list[tuple[str, str, dict[str, Any]]] = []
    runs = dict(config.get("runs", {}))
    for name, spec in config.get("backbones", {}).items():
        first = _first_seed("backbones", spec)
        if SEEDS not in spec or first is None or seed_list(spec[SEEDS], first[1])[0] != first[1]:
            continue
        for seed in seed_list(spec[SEEDS], first[1])[1:]:
            backbone = f"{name}{SEED_SUFFIX}{seed}"
            replica = _without_seeds(spec)
            replica.setdefault("pretrain", {})["seed"] = seed
            added.append(("backbones", backbone, replica))
            for run, run_spec in config.get("runs", {}).items():
                if run_spec.get("backbone") == name:
                    runs[f"{run}{PRETRAIN_SUFFIX}{seed}"] = {**copy.deepcopy(run_spec), "backbone": backbone}
                    added.append(("runs", f"{run}{PRETRAIN_SUFFIX}{seed}", _without_seeds(runs[f"{run}{PRETRAIN_SUFFIX}{seed}"])))
    for section, entries in (("runs", runs), ("references", config.get("references", {}))):
        for name, spec in entries.items():
            first = _first_seed(section, spec)
            if SEEDS not in spec or seed_list(spec[SEEDS], first[1])[0] != first[1]:
                continue
            base, _, pretrain = name.partition(PRETRAIN_SUFFIX)
            for seed in seed_list(spec[SEEDS], first[1])[1:]:
                replica = _without_seeds(spec)
                replica["train"]["seed"] = seed
                added.append((section, f"{base}{SEED_SUFFIX}{seed}" + (f"{PRETRAIN_SUFFIX}{pretrain}" if pretrain else ""), replica))
    return added


def _without_seeds(spec: dict[str, Any]) -> dict[str, Any]:
    return {key: copy.deepcopy(value) for key, value in spec.items() if key != SEEDS}


def seed_problems(config: dict[str, Any]) -> list[str]:
    """`seeds:` that cannot expand: a list not starting with the entry's own seed, a backbone not built here, or a
    replica's name taken by another entry (one line each, with the fix)."""
    problems = []
    for section in ("runs", "references", "backbones"):
        for name, spec in config.get(section, {}).items():
            if SEEDS not in spec:
                continue
            where = f"{section}.{name}.{SEEDS}"
            first = _first_seed(section, spec)
            if first is None:
                problems.append(
                    f"{where}: backbone source {spec.get('source')!r} is trained elsewhere: only a backbone built here "
                    f"(source {' or '.join(BUILT_HERE)}) has pretraining seeds. Fix: remove {SEEDS}"
                )
            elif (start := seed_list(spec[SEEDS], first[1])[0]) != first[1]:
                problems.append(
                    f"{where}: starts with {start} but {first[0]} is {first[1]}; the first seed is the entry's own. "
                    f"Fix: set {first[0]}: {start}"
                )
    taken = {name for section in ("runs", "references", "backbones") for name in config.get(section, {})}
    for section, name, _ in replicas(config):
        if name in taken:
            problems.append(f"{section}.{name}: the name of a seed's entry, also defined in the config. Fix: rename {name!r}")
        taken.add(name)
    return problems


def expand(config: dict[str, Any]) -> dict[str, Any]:
    """Add every seed's entry and drop `seeds:` (in place; a config without `seeds:` is left as it is)."""
    added = replicas(config)
    for section in ("runs", "references", "backbones"):
        for spec in config.get(section, {}).values():
            spec.pop(SEEDS, None)
    for section, name, spec in added:
        config.setdefault(section, {})[name] = spec
    return config


def group_of(name: str) -> str:
    """The entry a seed replica was made from (`baseline-seed2-pseed1` -> `baseline`); any other name itself."""
    return REPLICA.match(name)["base"]
