"""The exportable classifier: IQ [B, 2, L] -> logits, as one module (the encoder, the BF16 rounding the cache stored, the
head), and what it does to its input, stated once for every card that describes it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rffm.model import encoder as encoders
from rffm.model.head import AttentionPoolHead

LAYOUT = "float32 [batch >= 1, 2, length]: I then Q samples, channels first"
ROUNDING = "hidden states are rounded to BF16 as the training cache stored them, and the head computes in FP32"
ADAPTER_NORMALISATION = {
    "none": "none: the IQ window as staged",
    "rms": "per-example unit RMS of the IQ window",
    "peak": "per-example unit peak magnitude of the IQ window",
}


def normalisation(adapter: dict[str, Any], native: bool) -> str:
    """What is done to the IQ before the head reads it, for every card that states it (the selection's, the export's):
    an rffm backbone's own unit RMS, or the input adapter's normalisation and layout; then the BF16 rounding."""
    if native and adapter.get("normalize", "none") == "none":  # the in-workflow backbone normalises inside itself
        return f"per-example unit RMS of the IQ window (iq / sqrt(mean(iq^2))); the backbone's {ROUNDING}"
    how = ADAPTER_NORMALISATION.get(adapter.get("normalize"), adapter.get("normalize"))
    return f"{how}, then the backbone's input layout {adapter.get('layout')}; the tapped {ROUNDING}"


class Classifier(nn.Module):
    """IQ [B, 2, L] -> logits [B, classes]: the encoder (adapter, backbone, taps, keep), BF16-rounded features, the head."""

    def __init__(self, encoder: encoders.Encoder, head: AttentionPoolHead):
        super().__init__()
        self.backbone, self.head = encoder.model, head  # registered: their weights are the program's
        self.encoder = encoder  # the one way the backbone is called, as build_cache and qualify call it

    def states(self, iq: torch.Tensor) -> torch.Tensor:
        """The cache row the head reads, in FP32 (before the BF16 rounding)."""
        return encoders.as_row(self.encoder.features(iq))

    def forward(self, iq: torch.Tensor) -> torch.Tensor:
        return self.head(rounded(self.states(iq)))


def rounded(states: torch.Tensor) -> torch.Tensor:
    """What train_epoch read from the cache: the states rounded to BF16, computed on in FP32."""
    return states.to(torch.bfloat16).float()


class States(nn.Module):
    """IQ -> the classifier's FP32 hidden states: exported only to check the backbone half of the ONNX program."""

    def __init__(self, classifier: Classifier):
        super().__init__()
        self.classifier = classifier
        self.training = False  # as the classifier: a torch.export backbone refuses train(), so never .eval()

    def forward(self, iq: torch.Tensor) -> torch.Tensor:
        return self.classifier.states(iq)
