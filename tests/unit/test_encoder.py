"""One encoder for every backbone kind: adapter layouts, taps (hooks, method, outputs), forms, keep options, the head over any taps."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from byo import SPECTRUM, WAVES, spectrumfm_like, wavesfm_like
from conftest import tiny_config
from rffm.config import check
from rffm.data import cache_plan
from rffm.errors import ConfigError
from rffm.model import head
from rffm.model.encoder import Encoder, adapt, as_row, keep_tokens, row_shape
from rffm.model.taps import kept_count, spec_for


def encoder(model, **config) -> Encoder:
    return Encoder(model.eval(), "f" * 64, spec_for(config), "backbones.x")


def test_adapter_layouts_and_normalisation():
    iq = torch.randn(3, 2, 8)
    assert adapt(iq, {"layout": "samples", "normalize": "none"}).shape == (3, 8, 2)
    assert adapt(iq, {"layout": "antenna", "normalize": "none"}).shape == (3, 2, 1, 8)
    complex_ = adapt(iq, {"layout": "complex", "normalize": "rms"})
    assert complex_.dtype == torch.complex64 and complex_.shape == (3, 8)
    assert torch.allclose(complex_.abs().pow(2).mean(dim=1), torch.ones(3))
    assert torch.allclose(adapt(iq, {"layout": "channels", "normalize": "peak"}).pow(2).sum(1).amax(1), torch.ones(3))


@pytest.mark.parametrize("keep, tokens", [("all", 9), ("prefix", 1), ("mean", 1), ("prefix+mean", 2), ("every:3", 1 + 3)])
def test_keep_options_give_the_planned_token_counts(keep: str, tokens: int):
    hidden = torch.randn(2, 9, 4)  # 1 prefix + 8 signal tokens
    kept = keep_tokens(hidden, 1, keep)
    assert kept.shape == (2, tokens, 4) and kept_count(9, 1, keep) == tokens
    if keep == "prefix+mean":
        assert torch.equal(kept[:, 0], hidden[:, 0]) and torch.allclose(kept[:, 1], hidden[:, 1:].mean(1))


def test_hooks_on_named_modules_with_a_cls_prefix():
    model = wavesfm_like.build(**WAVES)
    enc = encoder(model, adapter={"layout": "antenna"}, taps={"modules": ["blocks.0", "norm"], "prefix": 1}, keep="prefix+mean")
    with torch.no_grad():
        x = torch.randn(3, 2, 64)
        features = enc.features(x)
        assert [f.shape for f in features] == [(3, 2, 32), (3, 2, 32)]
        out = model(x.unsqueeze(2))  # [B, 1 + 4, D]: CLS, then the mean of the signal tokens
        assert torch.allclose(features[1], torch.stack([out[:, 0], out[:, 1:].mean(1)], dim=1), atol=1e-6)


def test_a_method_returning_layers_and_a_channels_first_form():
    model = spectrumfm_like.build(**SPECTRUM)
    enc = encoder(model, adapter={"layout": "samples"}, taps={"method": "hidden_states", "select": [0, -1]})
    assert enc.tap_shapes(64) == [(64, 16), (64, 16)]

    class ChannelsFirst(nn.Module):
        def forward(self, x):
            return x.transpose(1, 2) * 2  # [B, L, 2] -> [B, 2, L]: D=2 channels, T=L tokens

    features = encoder(ChannelsFirst(), adapter={"layout": "samples"}, taps={"form": "channels"}).features(torch.ones(1, 2, 5))
    assert features[0].shape == (1, 5, 2)


def test_pooled_taps_and_rows_of_differing_taps_feed_one_head():
    class Mixed(nn.Module):
        def forward(self, x):
            return x.mean(dim=2) @ torch.ones(2, 6), x.transpose(1, 2) @ torch.ones(2, 4)  # [B, 6] pooled, [B, L, 4] tokens

    pooled = encoder(Mixed(), taps={"select": [0], "form": "pooled"}).features(torch.randn(4, 2, 8))
    tokens = encoder(Mixed(), taps={"select": [1]}).features(torch.randn(4, 2, 8))
    features = [pooled[0], tokens[0]]  # [4, 1, 6] and [4, 8, 4]: differing tokens and widths
    taps = [(1, 6), (8, 4)]
    assert row_shape(taps) == [38] and as_row(features).shape == (4, 38)
    meta = {"classes": ["a", "b", "c"], "shapes": {"train": [4, 38]}, "taps": [{"tokens": 1, "dim": 6}, {"tokens": 8, "dim": 4}]}
    model = head.build({"hidden": 8, "dropout": 0.0}, meta)
    assert model(as_row(features)).shape == (4, 3)
    assert head.from_record(head.config_record(model.config)).config == model.config


def test_a_head_reads_only_the_taps_it_names_from_whole_rows():
    """train.head.taps: the head picks its taps from the row it is fed, and equals a head built on those taps alone."""
    outputs = [{"name": f"output {i}", "tokens": 5, "dim": 8} for i in range(3)]
    stacked = {"classes": ["a", "b"], "shapes": {"train": [4, 3, 5, 8]}, "taps": outputs}
    rows = torch.randn(4, 3, 5, 8)
    mixed = [{"name": "pool", "tokens": 1, "dim": 6}, {"name": "blocks.1", "tokens": 8, "dim": 4}]
    flat = {"classes": ["a", "b"], "shapes": {"train": [4, 38]}, "taps": mixed}
    flat_rows = torch.randn(4, 38)
    cases = [
        (stacked, ["output 1"], rows, {"shapes": {"train": [4, 5, 8]}}, rows[:, 1]),
        (stacked, ["output 2", "output 0"], rows, {"shapes": {"train": [4, 2, 5, 8]}}, rows[:, [0, 2]]),
        (flat, ["blocks.1"], flat_rows, {"shapes": {"train": [4, 8, 4]}}, flat_rows[:, 6:].view(4, 8, 4)),
    ]
    for meta, names, fed, alone_shape, alone_rows in cases:
        torch.manual_seed(0)
        reader = head.build({"hidden": 8, "dropout": 0.0, "taps": names}, meta).eval()
        torch.manual_seed(0)
        alone = head.build({"hidden": 8, "dropout": 0.0}, {**meta, **alone_shape, "taps": []}).eval()
        assert torch.equal(reader(fed), alone(alone_rows)), names
        assert head.from_record(head.config_record(reader.config)).config == reader.config
    assert head.config_record(head.build({"hidden": 8, "dropout": 0.1, "taps": ["output 1"]}, stacked).config)["read"] == [1]
    every = head.build({"hidden": 8, "dropout": 0.1, "taps": ["output 2", "output 1", "output 0"]}, stacked)
    assert "read" not in head.config_record(every.config)  # naming every tap is the default head
    with pytest.raises(ConfigError) as error:
        head.build({"hidden": 8, "dropout": 0.1, "taps": ["blocks.2"]}, flat)
    assert one_line(error) == (
        "train.head.taps: ['blocks.2'] is not a list of distinct taps of this cache (its taps: ['pool', 'blocks.1']). "
        "Fix: name taps the backbone's cache holds, each once."
    )


def test_a_uniform_head_saves_the_config_it_always_saved():
    model = head.build({"hidden": 8, "dropout": 0.1}, {"classes": ["a", "b"], "shapes": {"train": [10, 4, 16, 64]}, "taps": []})
    assert head.config_record(model.config) == {"dim": 64, "classes": 2, "hidden": 8, "dropout": 0.1, "layers": 4}


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message and "Fix:" in message, message
    return message


def test_a_tap_name_that_does_not_exist_is_one_line():
    model = wavesfm_like.build(**WAVES)
    with pytest.raises(ConfigError) as error:
        encoder(model, adapter={"layout": "antenna"}, taps={"modules": ["blocks.9"]}).features(torch.randn(1, 2, 64))
    assert "no module 'blocks.9'" in one_line(error) and "blocks, norm" in str(error.value)


def test_a_tap_of_another_form_is_one_line():
    model = wavesfm_like.build(**WAVES)
    with pytest.raises(ConfigError) as error:
        encoder(model, adapter={"layout": "antenna"}, taps={"modules": ["norm"], "form": "pooled"}).features(torch.randn(2, 2, 64))
    assert "gives [2, 5, 32]" in one_line(error) and "pooled [B, D]" in str(error.value)

    class FourD(nn.Module):
        def forward(self, x):
            return x.unsqueeze(-1)  # [B, 2, L, 1]: no form of the three

    with pytest.raises(ConfigError) as error:
        encoder(FourD()).features(torch.randn(2, 2, 8))
    assert "gives [2, 2, 8, 1]" in one_line(error) and "not the declared form tokens [B, T, D]" in str(error.value)


def test_a_length_mismatch_is_refused_while_planning_naming_both_lengths():
    config = tiny_config()  # examples of length 64
    config["backbones"]["mini"]["adapter"] = {"length": 128}
    (problem,) = cache_plan.refusals(check(config), "/nonexistent", "/tmp")
    assert "length 64" in problem and "length 128" in problem and "\n" not in problem


def test_planned_sizes_per_keep_option_are_exact():
    counts = {"train": 1000, "val": 300}
    spec = spec_for({"taps": {"modules": ["blocks.3", "blocks.7", "head"], "prefix": 1}})
    sizes = cache_plan.option_sizes(
        counts, [(9, 256, False), (9, 256, False), (1, 64, True)], spec, ["a", "b"], ["all", "mean", "prefix+mean", "every:4"]
    )
    block = 4096
    overhead = 2 * block + sum(-(-(128 + b * n) // block) * block for n in counts.values() for b in (8, 4))  # meta, sentinel: a block each
    for option, tokens in (("all", 9), ("mean", 1), ("prefix+mean", 2), ("every:4", 1 + 2)):
        elements = 2 * tokens * 256 + 64
        assert sizes[option] == overhead + sum(-(-(n * elements * 2) // block) * block for n in counts.values())


def test_the_local_budget_is_free_space_over_headroom_and_a_profile_disk_wins(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_plan.shutil, "disk_usage", lambda path: type("U", (), {"free": 11_000})())
    assert cache_plan.scratch_budget(str(tmp_path / "not/yet"), 1.1, {})[0] == 10_000
    assert cache_plan.scratch_budget(str(tmp_path), 1.1, {"googlebatch_local_ssd_gb": 375})[0] == int(375e9 / 1.1)
