"""Sweeps (rffm.training.sweep, steps/train_epoch): members trained together equal themselves trained alone."""

import json
from pathlib import Path

import pytest
from cached_tiny import build_cache

from conftest import train_one_epoch
from rffm.errors import ConfigError
from rffm.steps import select_checkpoint
from rffm.training import sweep
from rffm.training.selection import choose, sweep_candidates

PLAIN = {"run": "r", "dataset": "t", "backbone": "b", "train": {"lr": 0.01, "batch_size": 8, "seed": 0}}
GRID = [["train.lr", [0.003, 0.01]], ["train.head.dropout", [0.0, 0.3]]]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return build_cache(tmp_path_factory.mktemp("cache"))


def train(spec: dict, record: Path, out: Path, epochs: int, memo: Path) -> None:
    """The epochs of a run as the rule runs them, each resuming from the one before."""
    for number in range(1, epochs + 1):
        previous = out / str(number - 1) if number > 1 else None
        train_one_epoch(spec, record, number, previous, out / str(number), record.parents[2] / "scratch", memo_store=memo)


def provenance(directory: Path) -> dict:
    return json.loads((directory / "provenance.json").read_text())


def test_members_are_the_grid_in_the_order_written_named_by_their_settings():
    found = sweep.members({"run": "r", "sweep": {"train.lr": [0.1, 0.01], "train.weight_decay": [0.0, 0.5]}})
    assert [m["name"] for m in found] == [
        "lr=0.1,weight_decay=0.0",
        "lr=0.1,weight_decay=0.5",
        "lr=0.01,weight_decay=0.0",
        "lr=0.01,weight_decay=0.5",
    ]
    assert sweep.members({"run": "r"}) == [{"name": "default", "settings": {}}]
    assert sweep.member_train({"lr": 1, "head": {"hidden": 8}}, {"train.head.hidden": 4}) == {"lr": 1, "head": {"hidden": 4}}
    with pytest.raises(ConfigError, match=r"runs\.r\.sweep: 'train\.batch_size' cannot be swept"):
        sweep.members({"run": "r", "sweep": {"train.batch_size": [1, 2]}})


def test_selection_ties_go_to_the_earliest_epoch_then_grid_order():
    tables = [
        {"epoch": 2, "members": {"a": {"epoch": 2, "val_accuracy": 0.9}, "b": {"epoch": 2, "val_accuracy": 0.9}}},
        {"epoch": 1, "members": {"a": {"epoch": 1, "val_accuracy": 0.5}, "b": {"epoch": 1, "val_accuracy": 0.7}}},
    ]
    assert choose(sweep_candidates(tables, ["b", "a"]), "val_accuracy", "max") == {"epoch": 2, "val_accuracy": 0.9, "member": "b"}
    assert choose(sweep_candidates(tables, ["a", "b"]), "val_accuracy", "min")["member"] == "a"


def test_each_member_equals_itself_trained_as_a_plain_run(cache_dir: Path, tmp_path: Path):
    """Acceptance 2 at the step level: every file of every member, byte for byte, after 2 epochs."""
    spec = {**PLAIN, "sweep": GRID}
    train(spec, cache_dir, tmp_path / "sweep", 2, tmp_path / "memo-sweep")
    bundle = tmp_path / "sweep/2/checkpoint.pt"
    members = sweep.members(spec)
    assert sweep.bundle_members(bundle) == [m["name"] for m in members]
    assert provenance(tmp_path / "sweep/2")["members_trained"] == [m["name"] for m in members]
    table = json.loads((tmp_path / "sweep/2/metrics.json").read_text())["members"]
    for member in members:
        alone = tmp_path / member["name"]
        train(sweep.member_spec(spec, member), cache_dir, alone, 2, tmp_path / f"memo-{member['name']}")
        for name in sweep.MEMBER_FILES:
            assert sweep.read_member(bundle, member["name"], name) == (alone / "2" / name).read_bytes(), (member["name"], name)
        assert table[member["name"]] == json.loads((alone / "2/metrics.json").read_text())
    # members differ from one another (dropout and lr are really per member)
    assert len({sweep.read_member(bundle, m["name"], "checkpoint.pt") for m in members}) == len(members)


def test_a_grown_grid_trains_only_its_new_members_and_a_shrunk_one_trains_none(cache_dir: Path, tmp_path: Path):
    """Acceptance 3 at the step level: the epoch memo is kept per member."""
    memo = tmp_path / "memo"
    small = {**PLAIN, "sweep": [["train.lr", [0.003, 0.01]]]}
    grown = {**PLAIN, "sweep": [["train.lr", [0.003, 0.01, 0.03]]]}
    train(small, cache_dir, tmp_path / "small", 2, memo)
    train(grown, cache_dir, tmp_path / "grown", 2, memo)
    for epoch in ("1", "2"):
        record = provenance(tmp_path / "grown" / epoch)
        assert record["members_restored"] == ["lr=0.003", "lr=0.01"] and record["members_trained"] == ["lr=0.03"]
        for name in ("lr=0.003", "lr=0.01"):
            for file in sweep.MEMBER_FILES:
                before = sweep.read_member(tmp_path / "small" / epoch / "checkpoint.pt", name, file)
                assert sweep.read_member(tmp_path / "grown" / epoch / "checkpoint.pt", name, file) == before
    shrunk = {**PLAIN, "sweep": [["train.lr", [0.01, 0.03]]]}
    train(shrunk, cache_dir, tmp_path / "shrunk", 2, memo)
    assert "members_trained" not in provenance(tmp_path / "shrunk/2")
    # a plain run of a member's settings is that member: restored from the sweep's memo entry, not trained
    train(sweep.member_spec(grown, sweep.members(grown)[2]), cache_dir, tmp_path / "plain", 2, memo)
    assert "restored_from" in provenance(tmp_path / "plain/2")


def test_selection_of_a_sweep_publishes_the_best_member_and_the_whole_table(cache_dir: Path, tmp_path: Path):
    from rffm.config import entry_defaults

    spec = entry_defaults("runs", {**PLAIN, "sweep": GRID})
    runs = tmp_path / "results/runs/r"
    train(spec, cache_dir, runs / "epochs", 2, tmp_path / "memo")
    select_checkpoint.run(spec, [runs / "epochs/1", runs / "epochs/2"], runs / "selection", store=tmp_path / "results")
    selection = json.loads((runs / "selection/selection.json").read_text())
    card = json.loads((runs / "selection/model_card.json").read_text())
    values = [(c["epoch"], c["member"], c["val_accuracy"]) for c in card["sweep"]["validation"]]
    assert len(values) == 8 and card["sweep"]["member"] == selection["member"]
    best = max(v for _, _, v in values)
    assert (selection["epoch"], selection["member"]) == next((e, m) for e, m, v in values if v == best)
    assert card["training"]["lr"] == card["sweep"]["settings"]["train.lr"]
    assert [m["name"] for m in card["sweep"]["members"]] == [m["name"] for m in sweep.members(spec)]


def test_the_schema_names_what_can_be_swept_in_one_line():
    from conftest import tiny_config
    from rffm import config

    tiny = tiny_config()
    tiny["runs"]["base"]["sweep"] = {"train.lr": [0.01, 0.03], "train.batch_size": [8]}
    assert config.problems(tiny) == [
        "runs.base.sweep: unknown key(s) 'train.batch_size'. Fix: remove or rename it; allowed here: train.head.dropout, "
        "train.head.hidden, train.head.taps, train.label_smoothing, train.lr, train.lr_decay_per_epoch, train.tail.lr, train.warmup_steps, "
        "train.weight_decay"
    ]
    tiny["runs"]["base"]["sweep"] = {"train.lr": [0.01, 0.03]}
    assert config.problems(tiny) == []


def test_a_sweep_over_taps_names_its_members_by_their_taps_and_plans_only_taps_the_cache_holds():
    from conftest import tiny_config
    from rffm import config

    grid = {"train.head.taps": [["output 1"], ["output 0", "output 1"]], "train.lr": [0.01]}
    assert [m["name"] for m in sweep.members({"run": "r", "sweep": grid})] == [
        "head.taps=output 1,lr=0.01",
        "head.taps=output 0+output 1,lr=0.01",
    ]
    assert sweep.member_train({"head": {"hidden": 8}}, {"train.head.taps": ["output 1"]}) == {"head": {"hidden": 8, "taps": ["output 1"]}}
    tiny = tiny_config()
    tiny["backbones"]["mini"]["arch"]["output_layers"] = 2
    tiny["runs"]["base"]["sweep"] = {"train.head.taps": [["output 1"], ["output 2"]]}
    assert config.problems(tiny) == [
        "runs.base.sweep.train.head.taps: 'output 2' is not a tap of backbone mini (its cache holds output 0, output 1). "
        "Fix: name taps from that list"
    ]
    del tiny["runs"]["base"]["sweep"]
    tiny["runs"]["base"]["train"]["head"] = {"taps": ["blocks.0"]}
    assert config.problems(tiny) == [
        "runs.base.train.head.taps: 'blocks.0' is not a tap of backbone mini (its cache holds output 0, output 1). "
        "Fix: name taps from that list"
    ]
    tiny["runs"]["base"]["train"]["head"] = {"taps": ["output 1"]}
    assert config.problems(tiny) == []


def test_heads_that_cannot_fit_are_refused_with_the_numbers():
    assert sweep.check_memory(8, 1000, 4096, 10**9, "runs.r.sweep") == 8 * 1000 * 16 + 4096
    with pytest.raises(ConfigError, match=r"runs\.r\.sweep: 8 heads x 1000 parameters x 16 bytes \+ a 4096 byte batch = 132096 bytes"):
        sweep.check_memory(8, 1000, 4096, 100_000, "runs.r.sweep")
