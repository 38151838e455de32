"""The trainable classifier head over frozen per-token hidden states."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class HeadConfig:
    """Attention-pooling + MLP head shape."""

    dim: int
    classes: int
    hidden: int = 128
    dropout: float = 0.1


class AttentionPoolHead(nn.Module):
    """Learned attention pooling over tokens, concatenated with mean pooling, then an MLP."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        self.norm = nn.LayerNorm(config.dim)
        self.score = nn.Linear(config.dim, 1)
        self.mlp = nn.Sequential(
            nn.Linear(2 * config.dim, config.hidden),
            nn.GELU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.hidden, config.classes),
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, T, D] FP32 hidden states -> [B, classes] logits."""
        hidden = self.norm(hidden)
        weights = torch.softmax(self.score(hidden), dim=1)
        pooled = torch.cat([(weights * hidden).sum(dim=1), hidden.mean(dim=1)], dim=-1)
        return self.mlp(pooled)
