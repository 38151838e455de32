"""The trainable classifier head over frozen per-token hidden states (of one layer or several)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class HeadConfig:
    """Attention-pooling + MLP head shape; `layers` > 1 mixes that many cached layers first."""

    dim: int
    classes: int
    hidden: int = 128
    dropout: float = 0.1
    layers: int = 1


class AttentionPoolHead(nn.Module):
    """Learned softmax mix of layers, then attention pooling over tokens concatenated with mean pooling, then an MLP."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        if config.layers > 1:
            self.layer_weights = nn.Parameter(torch.zeros(config.layers))
            self.layer_norm = nn.LayerNorm(config.dim)
        self.norm = nn.LayerNorm(config.dim)
        self.score = nn.Linear(config.dim, 1)
        self.mlp = nn.Sequential(
            nn.Linear(2 * config.dim, config.hidden),
            nn.GELU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.hidden, config.classes),
        )

    def mix(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, layers, T, D] -> [B, T, D]: each layer normalized, then weighted by a learned softmax."""
        if self.config.layers == 1:
            return hidden
        weights = torch.softmax(self.layer_weights, dim=0).view(1, -1, 1, 1)
        return (self.layer_norm(hidden) * weights).sum(dim=1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, T, D] or [B, layers, T, D] FP32 hidden states -> [B, classes] logits."""
        hidden = self.norm(self.mix(hidden))
        weights = torch.softmax(self.score(hidden), dim=1)
        pooled = torch.cat([(weights * hidden).sum(dim=1), hidden.mean(dim=1)], dim=-1)
        return self.mlp(pooled)
