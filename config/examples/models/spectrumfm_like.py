"""A SpectrumFM-shaped RF foundation model (user code, outside rffm): one token per IQ sample, Conformer-style blocks.

Stands for the published model (random weights here): IQ in [B, L, 2] (samples first); each sample is
embedded as one token; every block is feed-forward / self-attention / depthwise-convolution /
feed-forward (a Conformer block). `hidden_states(x)` returns the embedding and every block's output,
the way such models expose their layers for probing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kernel: int):
        super().__init__()
        self.ff1 = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))
        self.attn_norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.conv_norm = nn.LayerNorm(dim)
        self.pointwise = nn.Conv1d(dim, 2 * dim, 1)
        self.depthwise = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.conv_out = nn.Conv1d(dim, dim, 1)
        self.ff2 = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        h = F.glu(self.pointwise(self.conv_norm(x).transpose(1, 2)), dim=1)
        x = x + self.conv_out(F.silu(self.depthwise(h))).transpose(1, 2)
        x = x + 0.5 * self.ff2(x)
        return self.norm(x)


class SpectrumLikeConformer(nn.Module):
    """[B, L, 2] IQ -> [B, L, dim] (one token per sample); `hidden_states` gives every layer."""

    def __init__(self, length: int = 128, dim: int = 256, depth: int = 16, heads: int = 4, kernel: int = 15):
        super().__init__()
        self.embed = nn.Linear(2, dim)
        self.position = nn.Parameter(torch.zeros(1, length, dim))
        self.layers = nn.ModuleList(ConformerBlock(dim, heads, kernel) for _ in range(depth))
        nn.init.normal_(self.position, std=0.02)

    def hidden_states(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.embed(x) + self.position
        states = [x]
        for layer in self.layers:
            x = layer(x)
            states.append(x)
        return states

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hidden_states(x)[-1]


class LayerOutputs(nn.Module):
    """The model with its chosen layers as outputs: what `make_weights.py` exports as a .pt2 program."""

    def __init__(self, model: SpectrumLikeConformer, layers: list[int]):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states = self.model.hidden_states(x)
        return tuple(states[i] for i in self.layers)


def build(**kwargs) -> SpectrumLikeConformer:
    """The entry point rffm calls (python.entry_point: spectrumfm_like:build), with python.kwargs."""
    return SpectrumLikeConformer(**kwargs)
