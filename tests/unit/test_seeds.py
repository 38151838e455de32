"""Seeds as an axis (rffm.config.seeds): each seed its own entry, the first unchanged; compare's seed groups."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from conftest import tiny_config
from rffm import config
from rffm.config.seeds import group_of
from rffm.ops import compare


def seeded(**seeds) -> dict:
    """The tiny config with a floor backbone and a reference, `seeds:` set where named (run, backbone, cnn)."""
    c = tiny_config()
    c["backbones"]["rand"] = {"source": "random", "dataset": "tiny", "arch": copy.deepcopy(c["backbones"]["mini"]["arch"])}
    c["runs"]["floor"] = {**copy.deepcopy(c["runs"]["base"]), "backbone": "rand"}
    c["references"] = {"cnn": {"dataset": "tiny", "train": {"epochs": 1, "lr": 0.01, "batch_size": 16, "seed": 0}}}
    for where, value in seeds.items():
        section, name = {"run": ("runs", "base"), "backbone": ("backbones", "rand"), "cnn": ("references", "cnn")}[where]
        c[section][name]["seeds"] = value
    return c


def test_a_count_adds_the_next_seeds_as_their_own_entries_and_leaves_the_first_as_it_was():
    plain = config.check(seeded())
    expanded = config.check(seeded(run=3, cnn=[0, 7]))
    assert sorted(expanded["runs"]) == ["base", "base-seed1", "base-seed2", "floor"]
    assert sorted(expanded["references"]) == ["cnn", "cnn-seed7"]
    assert expanded["runs"]["base"] == plain["runs"]["base"] and expanded["references"]["cnn"] == plain["references"]["cnn"]
    for name, seed in (("base-seed1", 1), ("base-seed2", 2)):  # only the seed differs: the same backbone, so the same cache
        assert expanded["runs"][name] == {**plain["runs"]["base"], "train": {**plain["runs"]["base"]["train"], "seed": seed}}
    assert expanded["references"]["cnn-seed7"]["train"]["seed"] == 7
    assert config.check(copy.deepcopy(expanded)) == expanded  # checked again (a step, a status): nothing more added


def test_a_seeded_entry_is_the_run_a_user_would_write_by_hand():
    by_hand = seeded()
    by_hand["runs"]["base-seed1"] = copy.deepcopy(by_hand["runs"]["base"])
    by_hand["runs"]["base-seed1"]["train"]["seed"] = 1
    assert config.check(seeded(run=2)) == config.check(by_hand)


def test_a_backbones_pretraining_seeds_repeat_every_run_on_it_crossed_with_the_runs_own_seeds():
    c = seeded(backbone=2)
    c["runs"]["floor"]["seeds"] = 2
    expanded = config.check(c)
    assert sorted(expanded["backbones"]) == ["mini", "rand", "rand-seed1"]
    assert expanded["backbones"]["rand-seed1"]["pretrain"]["seed"] == 1 and expanded["backbones"]["rand"]["pretrain"]["seed"] == 0
    floors = {name: (spec["backbone"], spec["train"]["seed"]) for name, spec in expanded["runs"].items() if group_of(name) == "floor"}
    assert floors == {
        "floor": ("rand", 0),
        "floor-seed1": ("rand", 1),
        "floor-pseed1": ("rand-seed1", 0),
        "floor-seed1-pseed1": ("rand-seed1", 1),
    }


@pytest.mark.parametrize(
    "change, problem, fix",
    [
        (
            lambda c: c["runs"]["base"].update(seeds=[3, 4]),
            "runs.base.seeds: starts with 3 but train.seed is 0; the first seed is the entry's own. Fix: set train.seed: 3",
            lambda c: c["runs"]["base"]["train"].update(seed=3),
        ),
        (
            lambda c: c["backbones"].update(ext={"source": "checkpoint", "path": "w.pt", "sha256": "0" * 64, "seeds": 2}),
            "backbones.ext.seeds: backbone source 'checkpoint' is trained elsewhere",
            lambda c: c["backbones"]["ext"].pop("seeds"),
        ),
        (
            lambda c: (
                c["runs"].update({"base-seed1": copy.deepcopy(c["runs"]["floor"]), "x": {**c["runs"]["base"], "seeds": 1}})
                or c["runs"]["base"].update(seeds=2)
            ),
            "runs.base-seed1: the name of a seed's entry, also defined in the config. Fix: rename 'base-seed1'",
            lambda c: c["runs"].update({"floor-b": c["runs"].pop("base-seed1")}),
        ),
    ],
    ids=["list not starting with the own seed", "a backbone trained elsewhere", "a replica's name taken"],
)
def test_seeds_that_cannot_expand_are_one_line_each_and_the_fix_works(change, problem, fix):
    c = seeded()
    change(c)
    found = config.problems(c)
    assert len(found) == 1 and found[0].startswith(problem), found
    fix(c)
    assert [p for p in config.problems(c) if "backbones.ext" not in p or "path" not in p] == []


def test_group_of_strips_only_the_seed_suffixes():
    assert [group_of(n) for n in ("base", "base-seed2", "base-pseed1", "base-seed2-pseed1", "my-seedling", "b-seed")] == [
        "base",
        "base",
        "base",
        "base",
        "my-seedling",
        "b-seed",
    ]


def group(name: str, role: str, accuracies: list[float]) -> dict:
    return {"group": name, "role": role, "runs": [f"{name}{i}" for i in range(len(accuracies))], "accuracy": compare.spread(accuracies)}


def test_a_groups_paired_se_is_mcnemars_for_one_seed_each_and_a_lead_needs_both_bounds():
    rng = np.random.default_rng(0)
    a, b = rng.random(400) < 0.6, rng.random(400) < 0.5
    correct = {"x0": a, "y0": b}
    one = compare.group_difference(group("x", "frozen backbone", [a.mean()]), group("y", "end-to-end", [b.mean()]), correct)
    mcnemar = compare.paired_se(a, b)
    assert one["difference"] == pytest.approx(mcnemar["difference"]) and one["se"] == pytest.approx(mcnemar["se"])
    assert one["seed_spread"] is None and one["verdict"] == "1 seed: spread not measured, within 2 SE"  # 0.062 < 2 x 0.034
    assert compare.verdict(0.05, 0.01, 0.02) == "lead" and compare.verdict(-0.05, 0.01, 0.02) == "behind"
    assert compare.verdict(0.05, 0.01, 0.06) == "within seed spread" and compare.verdict(0.015, 0.01, 0.001) == "within 2 SE"
    assert compare.verdict(0.01, 0.01, 0.06) == "within 2 SE and seed spread"
    assert compare.verdict(0.01, None, 0.06) == "no per-example record"


def test_over_seeds_the_se_is_that_of_the_per_example_mean_correctness_and_the_spread_adds_both_sds():
    rng = np.random.default_rng(1)
    mine = [rng.random(300) < p for p in (0.6, 0.62, 0.58)]
    theirs = [rng.random(300) < p for p in (0.5, 0.55)]
    correct = {f"x{i}": v for i, v in enumerate(mine)} | {f"y{i}": v for i, v in enumerate(theirs)}
    x, y = group("x", "frozen backbone", [v.mean() for v in mine]), group("y", "end-to-end", [v.mean() for v in theirs])
    found = compare.group_difference(x, y, correct)
    d = np.mean(mine, axis=0) - np.mean(theirs, axis=0)
    assert found["se"] == pytest.approx(np.std(d) / math.sqrt(300))
    assert found["difference"] == pytest.approx(np.mean([v.mean() for v in mine]) - np.mean([v.mean() for v in theirs]))
    sds = np.std([v.mean() for v in mine], ddof=1), np.std([v.mean() for v in theirs], ddof=1)
    assert found["seed_spread"] == pytest.approx(math.hypot(*sds)) and found["n"] == 300
