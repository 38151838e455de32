from pathlib import Path

import pytest
import torch

from rffm.config import entry_defaults
from rffm.errors import ConfigError, IntegrityError
from rffm.model import backbone

SCHEMA_ARCH = entry_defaults("backbones", {"source": "random"})["arch"]  # the defaults live only in the schema
SMALL = {"length": 64, "patch": 16, "dim": 16, "depth": 1, "heads": 2, "stem": "iq", "output_layers": 1}
ARCH = backbone.BackboneArch(**{**SCHEMA_ARCH, **SMALL})


def test_forward_shapes_and_scale_invariance():
    model = backbone.build(ARCH, seed=0).eval()
    iq = torch.randn(5, 2, 64)
    hidden = model(iq)
    assert hidden.shape == (5, 4, 16)
    assert torch.allclose(model(iq * 1e-3), hidden, atol=1e-5)  # per-example unit RMS


def test_outputs_do_not_depend_on_the_batch_they_are_in():
    model = backbone.build(ARCH, seed=0).eval()
    iq = torch.randn(8, 2, 64)
    with torch.no_grad():
        assert torch.equal(model(iq)[:3], model(iq[:3]))


def test_fingerprint_changes_with_any_weight_and_survives_a_round_trip(tmp_path: Path):
    model = backbone.build(ARCH, seed=0)
    fp = backbone.save(tmp_path / "b.pt", model, {})
    loaded = backbone.load(tmp_path / "b.pt")
    assert loaded.fingerprint == fp and not any(p.requires_grad for p in loaded.parameters())
    other = backbone.build(ARCH, seed=1)
    assert backbone.fingerprint(ARCH, other.state_dict()) != fp


def test_tampered_weights_are_refused(tmp_path: Path):
    model = backbone.build(ARCH, seed=0)
    backbone.save(tmp_path / "b.pt", model, {})
    blob = torch.load(tmp_path / "b.pt", weights_only=True)
    blob["state_dict"]["embed.bias"][0] += 1.0
    torch.save(blob, tmp_path / "b.pt")
    with pytest.raises(IntegrityError, match="fingerprint"):
        backbone.load(tmp_path / "b.pt")


def test_invalid_arch_is_a_config_error():
    with pytest.raises(ConfigError, match="multiple of patch"):
        backbone.IQPatchTransformer(backbone.BackboneArch(**{**SCHEMA_ARCH, "length": 60, "patch": 16}))


def test_rf_stem_is_blind_to_carrier_phase_and_outputs_several_layers():
    rf = {"length": 64, "patch": 8, "dim": 16, "depth": 2, "heads": 2, "stem": "rf", "output_layers": 3}
    arch = backbone.BackboneArch(**{**SCHEMA_ARCH, **rf})
    model = backbone.build(arch, seed=0).eval()
    iq = torch.randn(4, 2, 64)
    rotated = torch.stack([iq[:, 0] * 0.6 - iq[:, 1] * 0.8, iq[:, 0] * 0.8 + iq[:, 1] * 0.6], dim=1)  # e^{j 53.13 deg}
    with torch.no_grad():
        hidden = model(iq)
        assert hidden.shape == (4, 3, 8, 16)
        assert torch.allclose(model(rotated), hidden, atol=1e-4)
        assert torch.equal(hidden[:, -1], backbone.build(backbone.BackboneArch(**{**arch.__dict__, "output_layers": 1}), 0)(iq))


def test_hidden_states_of_kept_tokens_only():
    model = backbone.build(ARCH, seed=0).eval()
    layers = model.hidden_states(torch.randn(2, 2, 64), keep=torch.tensor([[0, 2], [3, 1]]))
    assert len(layers) == ARCH.depth + 1 and all(layer.shape == (2, 2, 16) for layer in layers)


@pytest.mark.parametrize("change", [{"stem": "spectrogram"}, {"output_layers": 3}])
def test_unknown_stem_or_too_many_output_layers_is_a_config_error(change):
    with pytest.raises(ConfigError, match="stem must be one of"):
        backbone.IQPatchTransformer(backbone.BackboneArch(**{**ARCH.__dict__, **change}))


def test_the_multirate_stem_is_the_rf_stem_at_each_symbol_period_of_its_bank():
    iq = backbone.normalize(torch.randn(3, 2, 256))
    features = backbone.multirate_features(iq, backbone.rate_filters())
    assert features.shape == (3, 9 * len(backbone.RATE_BANK), 256)
    for index, period in enumerate(backbone.RATE_BANK):  # each branch: the rf stem's features at lag p, band 0.64 / p
        taps = 2 * round(1.5 * period) + 1
        alone = backbone.rf_features(iq, period, backbone.lowpass_matrix(256, min(0.45, 0.64 / period), taps))
        assert torch.allclose(features[:, 9 * index : 9 * (index + 1)], alone, atol=1e-5), period
    assert torch.allclose(backbone.rate_filters().sum(dim=-1), torch.ones(len(backbone.RATE_BANK), 1))  # unit DC gain
    multirate = {"length": 256, "patch": 8, "dim": 16, "depth": 1, "heads": 2, "stem": "rf-multirate", "output_layers": 2}
    model = backbone.build(backbone.BackboneArch(**{**SCHEMA_ARCH, **multirate}), seed=0).eval()
    rotated = torch.stack([iq[:, 0] * 0.6 - iq[:, 1] * 0.8, iq[:, 0] * 0.8 + iq[:, 1] * 0.6], dim=1)
    with torch.no_grad():
        assert model(iq).shape == (3, 2, 32, 16)
        assert torch.allclose(model(rotated), model(iq), atol=1e-4)  # blind to carrier phase, as the rf stem
