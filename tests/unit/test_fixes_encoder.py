"""Issue 34: refusals of a backbone's input length, taps and form whose printed Fix no other test follows; each is
provoked, its Fix is done as written (the tap, form or length it names), and the same call then gives features."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from cached_tiny import BACKBONE, DATASET
from torch import nn

from conftest import cache_build, make_backbone, stage, tiny_config
from fixes import fix_of
from rffm.config import check
from rffm.data import cache_plan
from rffm.errors import ConfigError
from rffm.model import head
from rffm.model.encoder import Encoder
from rffm.model.taps import spec_for

WHERE = "backbones.x"


class Layered(nn.Module):
    """Two blocks run by forward (tokens [B, L, 4] each), one built but never called; `layers` returns both blocks' outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(2, 4), nn.Linear(4, 4)])
        self.spare = nn.Linear(4, 4)

    def layers(self, x: torch.Tensor) -> list[torch.Tensor]:
        first = self.blocks[0](x.transpose(1, 2))
        return [first, self.blocks[1](first)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)[-1]


def encoder(length: int | None = None, **config) -> Encoder:
    return Encoder(Layered().eval(), "f" * 64, spec_for(config), WHERE, length=length)


def features(enc: Encoder, length: int = 8) -> list[torch.Tensor]:
    with torch.no_grad():
        return enc.features(torch.randn(3, 2, length))


def test_a_method_the_model_lacks_is_fixed_by_naming_one_returning_the_layers():
    with pytest.raises(ConfigError) as caught:
        features(encoder(taps={"method": "hidden_states"}))
    assert fix_of(caught) == "name a method that returns the per-layer tensors."
    assert [f.shape for f in features(encoder(taps={"method": "layers"}))] == [(3, 8, 4), (3, 8, 4)]


def test_a_selected_index_past_the_outputs_is_fixed_by_selecting_below_their_count():
    with pytest.raises(ConfigError) as caught:
        features(encoder(taps={"method": "layers", "select": [0, 2]}))
    fix = fix_of(caught)
    assert fix == "select indices below 2."
    below = int(re.fullmatch(r"select indices below (\d+)\.", fix).group(1))
    assert len(features(encoder(taps={"method": "layers", "select": [0, below - 1]}))) == 2


def test_a_module_name_the_model_lacks_is_fixed_by_naming_it_as_named_modules_prints_it():
    with pytest.raises(ConfigError) as caught:
        features(encoder(taps={"modules": ["blocks3"]}))
    assert fix_of(caught) == "name modules as model.named_modules() prints them, e.g. blocks.3."
    printed = [name for name, _ in Layered().named_modules()]
    assert "blocks.1" in printed  # the name as printed, where the config said blocks3
    assert features(encoder(taps={"modules": ["blocks.1"]}))[0].shape == (3, 8, 4)


def test_a_module_forward_never_calls_is_fixed_by_tapping_one_it_calls():
    with pytest.raises(ConfigError) as caught:
        features(encoder(taps={"modules": ["spare"]}))
    assert fix_of(caught) == "tap modules the forward pass calls."
    assert features(encoder(taps={"modules": ["blocks.0"]}))[0].shape == (3, 8, 4)


def test_iq_of_another_length_is_fixed_by_data_of_the_backbones_length():
    with pytest.raises(ConfigError) as caught:
        features(encoder(length=16), length=8)
    fix = fix_of(caught)
    assert fix == "use a dataset of length 16."
    length = int(re.fullmatch(r"use a dataset of length (\d+)\.", fix).group(1))
    assert features(encoder(length=16), length=length)[0].shape == (3, 16, 4)


def test_a_tap_of_another_form_is_fixed_by_declaring_the_form_it_gives():
    with pytest.raises(ConfigError) as caught:
        features(encoder(taps={"form": "pooled"}))
    assert "gives [3, 8, 4]" in str(caught.value)
    assert fix_of(caught) == "set taps.form to tokens [B, T, D], channels [B, D, T] or pooled [B, D], or tap another module."
    assert features(encoder(taps={"form": "tokens"}))[0].shape == (3, 8, 4)  # [B, T, D], what the tap gives


def test_a_head_naming_taps_the_cache_lacks_is_fixed_by_naming_its_taps_once_each():
    meta = {
        "classes": ["a", "b"],
        "shapes": {"train": [4, 3, 5, 8]},
        "taps": [{"name": f"output {i}", "tokens": 5, "dim": 8} for i in range(3)],
    }
    with pytest.raises(ConfigError) as caught:
        head.build({"hidden": 8, "dropout": 0.0, "taps": ["output 1", "output 1", "output 3"]}, meta)
    assert fix_of(caught) == "name taps the backbone's cache holds, each once."
    assert head.build({"hidden": 8, "dropout": 0.0, "taps": ["output 1", "output 2"]}, meta)(torch.randn(4, 3, 5, 8)).shape == (4, 2)


def test_a_declared_length_the_dataset_lacks_is_fixed_while_planning_by_a_dataset_of_that_length():
    config = tiny_config()  # its dataset's examples are 64 samples long
    (name,) = config["backbones"]
    config["backbones"][name]["adapter"] = {"length": 128}
    (problem,) = cache_plan.refusals(check(config), "/nonexistent", "/tmp")
    assert problem.endswith("Fix: use a dataset of length 128, or a backbone built for 64 samples."), problem
    (dataset,) = config["datasets"]
    config["datasets"][dataset]["synthetic"]["length"] = 128
    assert cache_plan.refusals(check(config), "/nonexistent", "/tmp") == []


def test_a_declared_length_the_staged_dataset_lacks_is_fixed_by_restaging_it_at_that_length(tmp_path: Path):
    spec = spec_for({"adapter": {"length": 64}})  # the tiny dataset's examples are 32 samples long
    data, backbone = tmp_path / "datasets/t", tmp_path / "backbones/b"
    stage(DATASET, data)
    make_backbone(BACKBONE, data, backbone)
    with pytest.raises(ConfigError) as caught:
        cache_build(data, backbone, tmp_path / "caches/t__b", tmp_path / "scratch", encoder=spec)
    fix = fix_of(caught)
    assert fix == "use a dataset of length 64 (e.g. datasets.t.synthetic.length), or a backbone built for 32 samples."
    restaged = {**DATASET, "synthetic": {**DATASET["synthetic"], "length": 64}}  # datasets.t.synthetic.length: 64
    stage(restaged, tmp_path / "datasets/t64")
    make_backbone(BACKBONE, tmp_path / "datasets/t64", tmp_path / "backbones/b64")  # the backbone is built on its dataset
    record = cache_build(
        tmp_path / "datasets/t64", tmp_path / "backbones/b64", tmp_path / "caches/t__b", tmp_path / "scratch", encoder=spec
    )
    assert record.is_file()
