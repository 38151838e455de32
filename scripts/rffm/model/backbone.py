"""The frozen RF backbone: a small transformer over IQ patches, and its fingerprint.

Stems: `iq` embeds raw IQ patches linearly; `rf` first computes phase-invariant features per
sample from the low-passed signal (envelope, lag-1 product, and the lag-`patch` product with its
phase multiplied by 1, 2 and 4) and embeds patches of those; `rf-multirate` computes the same
features once per symbol period of a bank (2 to 32 samples), each from the signal low-passed to the
bandwidth of that period, so which symbol rate and band a signal has is left to the weights that
pretraining learns, not fixed by the patch or one generator. With `output_layers` k > 1 the model
returns the last k of [embedding, block 1, ..., last block (normed)] stacked: [B, k, T, D].
"""

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
    """Architecture of the IQ patch transformer: the signal length and a schema-filled `backbones.<name>.arch`
    (its defaults live only in the config schema; rffm.config.entry_defaults fills them)."""

    length: int
    patch: int
    dim: int
    depth: int
    heads: int
    mlp_ratio: int
    stem: str  # iq: raw IQ patches; rf: phase-invariant RF features (module docstring)
    output_layers: int  # hidden states returned per token: the last k of depth + 1

    @property
    def tokens(self) -> int:
        return self.length // self.patch


RATE_BANK = (2, 4, 8, 16, 32)  # symbol periods (samples) rf-multirate computes features for
STEM_CHANNELS = {"iq": 2, "rf": 9, "rf-multirate": 9 * len(RATE_BANK)}
LOWPASS_CUTOFF = 0.08  # cycles/sample: about the band edge of RML-style signals at 8 samples/symbol; cuts most of the noise
LOWPASS_LENGTH = 23


def lowpass_kernel(cutoff: float, count: int) -> torch.Tensor:
    """float64 kernel of a Hann-windowed sinc low-pass FIR with unit DC gain."""
    n = torch.arange(count, dtype=torch.float64) - (count - 1) / 2
    window = torch.hann_window(count + 2, periodic=False, dtype=torch.float64)[1:-1]
    kernel = torch.sinc(2 * cutoff * n) * window
    return kernel / kernel.sum()


def lowpass_matrix(length: int, cutoff: float = LOWPASS_CUTOFF, count: int = LOWPASS_LENGTH) -> torch.Tensor:
    """[L, L] matrix of a Hann-windowed sinc low-pass FIR with unit DC gain ('same' zero-padded convolution)."""
    kernel = lowpass_kernel(cutoff, count)
    offset = torch.arange(length).view(-1, 1) - torch.arange(length).view(1, -1) + (count - 1) // 2  # [input, output]
    inside = (offset >= 0) & (offset < count)
    return torch.where(inside, kernel[offset.clamp(0, count - 1)], 0.0).float()


def lag_product(i: torch.Tensor, q: torch.Tensor, lag: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Real and imaginary parts of z[n] conj(z[n - lag]), zero for n < lag."""
    real = i[:, lag:] * i[:, :-lag] + q[:, lag:] * q[:, :-lag]
    imag = q[:, lag:] * i[:, :-lag] - i[:, lag:] * q[:, :-lag]
    return F.pad(real, (lag, 0)), F.pad(imag, (lag, 0))


def rf_features(iq: torch.Tensor, lag: int, lowpass: torch.Tensor) -> torch.Tensor:
    """[B, 2, L] -> [B, 9, L] carrier-phase-invariant features of the low-passed signal."""
    return phase_features(iq @ lowpass, lag)


def rate_filters() -> torch.Tensor:
    """[len(RATE_BANK), 1, K] low-pass FIRs, one per symbol period p: cutoff 0.64 / p (0.08 at p = 8, as the rf stem)."""
    count = 3 * max(RATE_BANK) + 1  # odd; the narrowest band needs the longest filter
    filters = []
    for period in RATE_BANK:
        used = 2 * round(1.5 * period) + 1
        kernel = lowpass_kernel(min(0.45, 0.64 / period), used)
        filters.append(F.pad(kernel, ((count - used) // 2, (count - used) // 2)))
    return torch.stack(filters).unsqueeze(1).float()


def multirate_features(iq: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """[B, 2, L] -> [B, 9 x len(RATE_BANK), L]: rf_features at each symbol period of the bank, each in its own band."""
    batch, _, length = iq.shape
    smooth = F.conv1d(iq.reshape(batch * 2, 1, length), filters, padding=filters.shape[-1] // 2)  # [2B, bank, L]
    smooth = smooth.view(batch, 2, len(RATE_BANK), length)
    return torch.cat([phase_features(smooth[:, :, index], period) for index, period in enumerate(RATE_BANK)], dim=1)


def phase_features(smooth: torch.Tensor, lag: int) -> torch.Tensor:
    """[B, 2, L] low-passed IQ -> [B, 9, L]: envelope, lag-1 product, lag-`lag` product with its phase times 1, 2, 4."""
    i, q = smooth[:, 0], smooth[:, 1]
    channels = [torch.sqrt(i * i + q * q)]
    for k, powers in ((1, (1,)), (lag, (1, 2, 4))):
        real, imag = lag_product(i, q, k)
        magnitude = torch.sqrt(real * real + imag * imag).clamp_min(1e-12)
        cos, sin, scale = real / magnitude, imag / magnitude, magnitude.sqrt()
        for power in (1, 2, 4):
            if power in powers:
                channels += [cos * scale, sin * scale]
            cos, sin = cos * cos - sin * sin, 2 * cos * sin  # double the phase
    return torch.stack(channels, dim=1)


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
        if arch.stem not in STEM_CHANNELS or not 1 <= arch.output_layers <= arch.depth + 1:
            raise ConfigError(f"backbone arch: stem must be one of {sorted(STEM_CHANNELS)}, output_layers 1..depth+1; got {asdict(arch)}")
        self.arch = arch
        self.embed = nn.Linear(STEM_CHANNELS[arch.stem] * arch.patch, arch.dim)
        if arch.stem == "rf":  # [L, L]: 64 MB at 4096 samples, so only where it is used
            self.register_buffer("lowpass", lowpass_matrix(arch.length), persistent=False)
        if arch.stem == "rf-multirate":
            self.register_buffer("rate_filters", rate_filters(), persistent=False)
        self.position = nn.Parameter(torch.zeros(1, arch.tokens, arch.dim))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, arch.dim))
        self.blocks = nn.ModuleList(Block(arch.dim, arch.heads, arch.mlp_ratio) for _ in range(arch.depth))
        self.norm = nn.LayerNorm(arch.dim)
        nn.init.normal_(self.position, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)

    def patchify(self, signal: torch.Tensor) -> torch.Tensor:
        """[B, C, L] per-sample channels -> [B, T, C*patch] patches."""
        batch, channels = signal.shape[:2]
        return signal.view(batch, channels, self.arch.tokens, self.arch.patch).permute(0, 2, 1, 3).reshape(batch, self.arch.tokens, -1)

    def stem(self, iq: torch.Tensor) -> torch.Tensor:
        """[B, 2, L] IQ -> [B, C, L] per-sample stem channels (unit-RMS IQ, or its RF features)."""
        iq = normalize(iq)
        if self.arch.stem == "rf-multirate":
            return multirate_features(iq, self.rate_filters)
        return rf_features(iq, self.arch.patch, self.lowpass) if self.arch.stem == "rf" else iq

    def hidden_states(self, iq: torch.Tensor, mask: torch.Tensor | None = None, keep: torch.Tensor | None = None) -> list[torch.Tensor]:
        """[embedding, block 1, ..., last block (normed)], each [B, T, D]; `mask` replaces tokens, `keep` [B, K] runs only those."""
        if iq.shape[-1] != self.arch.length:
            raise ConfigError(f"backbone expects IQ of length {self.arch.length}, got {iq.shape[-1]}")
        tokens = self.embed(self.patchify(self.stem(iq)))
        if mask is not None:
            tokens = torch.where(mask.unsqueeze(-1), self.mask_token.expand_as(tokens), tokens)
        hidden = tokens + self.position
        if keep is not None:
            hidden = torch.gather(hidden, 1, keep.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        layers = [hidden]
        for block in self.blocks:
            hidden = block(hidden)
            layers.append(hidden)
        layers[-1] = self.norm(hidden)
        return layers

    def forward(self, iq: torch.Tensor) -> torch.Tensor:
        """Hidden states [B, T, D], or [B, k, T, D] of the last k = output_layers layers."""
        layers = self.hidden_states(iq)
        if self.arch.output_layers == 1:
            return layers[-1]
        return torch.stack(layers[-self.arch.output_layers :], dim=1)


def normalize(iq: torch.Tensor) -> torch.Tensor:
    """Per-example unit RMS, so sources with different scaling (e.g. RML2016's L1) look alike."""
    return iq / iq.pow(2).mean(dim=(1, 2), keepdim=True).sqrt().clamp_min(1e-8)


def build(arch: BackboneArch, seed: int) -> IQPatchTransformer:
    """A freshly initialized backbone, deterministic from the seed."""
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
        torch.manual_seed(seed)
        return IQPatchTransformer(arch)


def fingerprint(arch: BackboneArch, state: dict[str, torch.Tensor]) -> str:
    """sha256 of the architecture and the weights (names, dtypes, shapes, bytes)."""
    return hash_tensors(hashlib.sha256(canonical_json(asdict(arch)).encode()), state).hexdigest()


def hash_tensors(digest: Any, state: dict[str, torch.Tensor]) -> Any:
    """`digest` (a hashlib object) updated with a state_dict's names, dtypes, shapes and bytes, in name order."""
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest


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
