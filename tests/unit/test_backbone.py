from pathlib import Path

import pytest
import torch

from rffm.errors import ConfigError, IntegrityError
from rffm.model import backbone

ARCH = backbone.BackboneArch(length=64, patch=16, dim=16, depth=1, heads=2, mlp_ratio=2)


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
        backbone.IQPatchTransformer(backbone.BackboneArch(length=60, patch=16))
