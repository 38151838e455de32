"""The frozen RF backbone: a small transformer over IQ patches, and its fingerprint."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rffm.errors import ConfigError, IntegrityError
from rffm.records.files import atomic_torch_save, canonical_json


@dataclass(frozen=True)
class BackboneArch:
    """Architecture of the IQ patch transformer."""

    length: int = 128
    patch: int = 8
    dim: int = 64
    depth: int = 3
    heads: int = 4
    mlp_ratio: int = 2

    @property
    def tokens(self) -> int:
        return self.length // self.patch


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, dim)
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


class IQPatchTransformer(nn.Module):
    """Maps IQ [B, 2, L] to per-token hidden states [B, L/patch, dim]."""

    def __init__(self, arch: BackboneArch):
        super().__init__()
        if arch.length % arch.patch or arch.dim % arch.heads:
            raise ConfigError(f"backbone arch: length must be a multiple of patch and dim of heads; got {asdict(arch)}")
        self.arch = arch
        self.embed = nn.Linear(2 * arch.patch, arch.dim)
        self.position = nn.Parameter(torch.zeros(1, arch.tokens, arch.dim))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, arch.dim))
        self.blocks = nn.ModuleList(Block(arch.dim, arch.heads, arch.mlp_ratio) for _ in range(arch.depth))
        self.norm = nn.LayerNorm(arch.dim)
        nn.init.normal_(self.position, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)

    def patchify(self, iq: torch.Tensor) -> torch.Tensor:
        """[B, 2, L] unit-RMS IQ -> [B, T, 2*patch] patches."""
        batch = iq.shape[0]
        return iq.view(batch, 2, self.arch.tokens, self.arch.patch).permute(0, 2, 1, 3).reshape(batch, self.arch.tokens, -1)

    def forward(self, iq: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if iq.shape[-1] != self.arch.length:
            raise ConfigError(f"backbone expects IQ of length {self.arch.length}, got {iq.shape[-1]}")
        tokens = self.embed(self.patchify(normalize(iq)))
        if mask is not None:
            tokens = torch.where(mask.unsqueeze(-1), self.mask_token.expand_as(tokens), tokens)
        hidden = tokens + self.position
        for block in self.blocks:
            hidden = block(hidden)
        return self.norm(hidden)


def normalize(iq: torch.Tensor) -> torch.Tensor:
    """Per-example unit RMS, so sources with different scaling (e.g. RML2016's L1) look alike."""
    return iq / iq.pow(2).mean(dim=(1, 2), keepdim=True).sqrt().clamp_min(1e-8)


def build(arch: BackboneArch, seed: int) -> IQPatchTransformer:
    """A freshly initialized backbone, deterministic from the seed."""
    generator_state = torch.get_rng_state()
    torch.manual_seed(seed)
    model = IQPatchTransformer(arch)
    torch.set_rng_state(generator_state)
    return model


def fingerprint(arch: BackboneArch, state: dict[str, torch.Tensor]) -> str:
    """sha256 of the architecture and the weights (names, dtypes, shapes, bytes)."""
    digest = hashlib.sha256(canonical_json(asdict(arch)).encode())
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def save(path: str | Path, model: IQPatchTransformer, info: dict[str, Any]) -> str:
    """Write backbone.pt (arch, weights, fingerprint, info); return the fingerprint."""
    state = {name: tensor.detach().cpu().clone() for name, tensor in model.state_dict().items()}
    print_ = fingerprint(model.arch, state)
    atomic_torch_save(path, {"arch": asdict(model.arch), "state_dict": state, "fingerprint": print_, "info": info})
    return print_


def load(path: str | Path, device: str | torch.device = "cpu") -> IQPatchTransformer:
    """Load a backbone for inference, frozen, after checking its fingerprint."""
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated, foreign or hostile (never unpickled with code): one line, no advice to do so
        raise IntegrityError(
            f"{path}: not a loadable rffm backbone checkpoint ({type(error).__name__}); it holds objects other than "
            "tensors and plain values, or is damaged. Fix: point at an rffm backbone.pt (the files pretrain_backbone writes)."
        ) from None
    try:
        arch = BackboneArch(**blob["arch"])
        state = blob["state_dict"]
    except (KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"{path}: not an rffm backbone checkpoint (missing {exc}); expected keys arch, state_dict.") from None
    actual = fingerprint(arch, state)
    if blob.get("fingerprint") not in (None, actual):
        raise IntegrityError(f"{path}: weights fingerprint {actual[:16]}… differs from the recorded {blob['fingerprint'][:16]}…")
    model = IQPatchTransformer(arch)
    model.load_state_dict(state)
    model.fingerprint = actual
    model.requires_grad_(False)
    return model.eval().to(device)
