"""A WavesFM-shaped RF foundation model (user code, outside rffm): a ViT over 16-sample IQ segments with a CLS token.

Stands for the published model (random weights here): IQ in [B, 2, antennas, T]; a Conv1d turns each
16-sample segment of every antenna's I and Q into one token; a learned CLS token and positions; D256 x 8
pre-norm blocks in timm's naming (blocks.N.norm1 / attn.qkv / attn.proj / norm2 / mlp.fc1 / mlp.fc2); a
final `norm`. The checkpoint is saved the way WavesFM's is: {"model": state_dict, ...}.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, dim))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class WavesLikeViT(nn.Module):
    """[B, 2, antennas, T] IQ -> [B, 1 + T/segment, dim] tokens (CLS first)."""

    def __init__(
        self,
        length: int = 128,
        antennas: int = 1,
        segment: int = 16,
        dim: int = 256,
        depth: int = 8,
        heads: int = 8,
        mlp_ratio: float = 6.0,
    ):
        super().__init__()
        if length % segment:
            raise ValueError(f"length {length} is not a multiple of the segment {segment}")
        self.patch_embed = nn.Conv1d(2 * antennas, dim, kernel_size=segment, stride=segment)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + length // segment, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, iq, antennas, samples = x.shape
        tokens = self.patch_embed(x.reshape(batch, iq * antennas, samples)).transpose(1, 2)  # [B, T, D]
        x = torch.cat([self.cls_token.expand(batch, -1, -1), tokens], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def build(**kwargs) -> WavesLikeViT:
    """The entry point rffm calls (python.entry_point: wavesfm_like:build), with python.kwargs."""
    return WavesLikeViT(**kwargs)
