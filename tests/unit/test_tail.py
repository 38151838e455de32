"""Tail adaptation (train.tail, issue 49): the head holds the backbone's last blocks, started from its weights, and
runs them on the cached input of the first of them; epochs resume bit for bit; a tail the cache cannot feed is
refused in one line with its Fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cached_tiny import BACKBONE, build_cache

from conftest import tiny_config, train_one_epoch
from rffm.config import check
from rffm.errors import ConfigError
from rffm.model import backbone as native
from rffm.model import head as head_model
from rffm.training import epoch as train

TWO_LAYERS = {**BACKBONE, "arch": {**BACKBONE["arch"], "output_layers": 2}}  # embedding + the one block: a tail of 1 fits
SPEC = {"run": "r", "train": {"lr": 0.01, "batch_size": 8, "seed": 0, "tail": {"blocks": 1, "lr": 0.001}}}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return build_cache(tmp_path_factory.mktemp("tail"), TWO_LAYERS)


def epoch(spec: dict, record: Path, number: int, previous: Path | None, out: Path) -> Path:
    return train_one_epoch(spec, record, number, previous, out, record.parents[2] / "scratch", memo_store=out.parent / "memo")


def test_an_unchanged_tail_gives_the_backbones_own_last_layer(cache_dir: Path):
    model = native.load(cache_dir.parents[1] / "backbones/b/backbone.pt")
    meta = json.loads((cache_dir.parents[2] / "scratch/t__b/meta.json").read_text())
    options = train.train_options({"train": {**SPEC["train"], "head": {"hidden": 8, "dropout": 0.1}}})
    head = train.tail_head(meta, options, model_path(cache_dir), "runs.r.train")
    iq = torch.randn(4, 2, model.arch.length)
    with torch.no_grad():
        layers = model.hidden_states(iq)
        cached = torch.stack(layers[-2:], dim=1)  # what the cache holds: output_layers 2
        assert torch.equal(head.eval().run_tail(cached), layers[-1])
    assert head_model.from_record(head_model.config_record(head.config)).config == head.config


def model_path(cache_dir: Path) -> Path:
    return cache_dir.parents[1] / "backbones/b/backbone.pt"


def test_tail_epochs_learn_resume_bit_for_bit_and_train_the_tail_at_its_own_lr(cache_dir: Path, tmp_path: Path):
    spec = {**SPEC, "train": {**SPEC["train"], "head": {}}}
    for number in (1, 2, 3):
        epoch(spec, cache_dir, number, tmp_path / "a" / str(number - 1) if number > 1 else None, tmp_path / "a" / str(number))
    metrics = [json.loads((tmp_path / "a" / str(e) / "metrics.json").read_text()) for e in (1, 2, 3)]
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
    epoch(spec, cache_dir, 3, tmp_path / "a/2", tmp_path / "again3")
    assert (tmp_path / "again3/checkpoint.pt").read_bytes() == (tmp_path / "a/3/checkpoint.pt").read_bytes()
    checkpoint = torch.load(tmp_path / "a/3/checkpoint.pt", weights_only=True)
    assert checkpoint["head_config"]["tail"] == [1, 0, 2, 2]
    start = native.load(model_path(cache_dir)).blocks[0].state_dict()
    trained = {k.removeprefix("tail.0."): v for k, v in checkpoint["head"].items() if k.startswith("tail.0.")}
    assert trained.keys() == start.keys() and any(not torch.equal(trained[k], start[k]) for k in start)  # adapted
    groups = checkpoint["optimizer"]["param_groups"]
    assert [g["initial_lr"] for g in groups] == [0.01, 0.001]


def test_a_tail_the_cache_cannot_feed_is_refused_with_its_fix(tmp_path: Path):
    record = build_cache(tmp_path, BACKBONE)  # output_layers 1: only the last layer is cached
    with pytest.raises(ConfigError, match=r"^runs\.r\.train\.tail\.blocks: 1 block\(s\) of a depth-1 backbone need .* Fix: set"):
        epoch(SPEC, record, 1, None, tmp_path / "e1")
    assert not (tmp_path / "e1/sentinel.json").exists()


def test_the_config_refuses_a_tail_it_cannot_run_while_planning():
    config = tiny_config()
    config["runs"]["base"]["train"]["tail"] = {"blocks": 1, "lr": 0.001}
    said = r"runs\.base\.train\.tail\.blocks: 1 block\(s\) of backbone mini .* Fix: set backbones\.mini\.arch\.output_layers to at least 2"
    with pytest.raises(ConfigError, match=said):
        check(config)
    config["backbones"]["mini"]["arch"]["output_layers"] = 2
    check(config)  # the Fix
    config["runs"]["base"]["sweep"] = {"train.tail.lr": [0.001, 0.003]}
    check(config)
    del config["runs"]["base"]["train"]["tail"]
    with pytest.raises(ConfigError, match=r"runs\.base\.sweep\.train\.tail\.lr: the run has no train\.tail\. Fix: "):
        check(config)
