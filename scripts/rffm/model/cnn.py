"""The end-to-end supervised reference: a standard RadioML-style 1-D CNN trained from scratch on IQ.

Four blocks of Conv1d (kernel 7) + BatchNorm + ReLU + MaxPool(2), global average pooling and an MLP,
the usual shape of the RadioML 2016 baselines (about 0.1 M parameters at width 64). Input `iq` is the
per-example unit-RMS IQ, as the backbone sees it; `rf` feeds the backbone's rf stem features instead
(module rffm.model.backbone), to separate what the stem gives from what pretraining gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rffm.model import backbone


@dataclass(frozen=True)
class CNNConfig:
    """The reference CNN: the data's classes and length, and a schema-filled `references.<id>.model` (its defaults
    live only in the config schema)."""

    classes: int
    length: int
    width: int
    blocks: int
    kernel: int
    hidden: int
    dropout: float
    input: str  # iq: unit-RMS IQ; rf: the backbone's rf stem features (lag = symbol_period)
    symbol_period: int


class RadioMLCNN(nn.Module):
    """IQ [B, 2, L] -> logits [B, classes]."""

    def __init__(self, config: CNNConfig):
        super().__init__()
        self.config = config
        channels = backbone.STEM_CHANNELS[config.input]
        layers: list[nn.Module] = []
        for _ in range(config.blocks):
            layers += [
                nn.Conv1d(channels, config.width, config.kernel, padding=config.kernel // 2),
                nn.BatchNorm1d(config.width),
                nn.ReLU(),
                nn.MaxPool1d(2),
            ]
            channels = config.width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(config.width, config.hidden), nn.ReLU(), nn.Dropout(config.dropout), nn.Linear(config.hidden, config.classes)
        )
        if config.input == "rf":
            self.register_buffer("lowpass", backbone.lowpass_matrix(config.length), persistent=False)

    def forward(self, iq: torch.Tensor) -> torch.Tensor:
        x = backbone.normalize(iq)
        if self.config.input == "rf":
            x = backbone.rf_features(x, self.config.symbol_period, self.lowpass)
        return self.classifier(self.features(x))


def build(config: CNNConfig, seed: int) -> RadioMLCNN:
    """A freshly initialized CNN, deterministic from the seed (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return RadioMLCNN(config)
