"""The pieces of a head epoch: the head, its optimizer and schedule, and evaluation on a cached split."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rffm.data.cache_reader import CacheSplit, prefetched
from rffm.model import head as head_model
from rffm.model.head import AttentionPoolHead
from rffm.model.metrics import confusion_matrix, macro_f1
from rffm.runtime.profiling import BatchTracer, PhaseTimes


def train_options(spec: dict[str, Any]) -> dict[str, Any]:
    """A run's train block without `epochs`: no epoch may depend on the total."""
    return {key: value for key, value in spec["train"].items() if key != "epochs"}


def lr_factor(step: int, steps_per_epoch: int, warmup_steps: int, decay: float) -> float:
    """Linear warmup, then a fixed decay per completed epoch; independent of the epoch count."""
    return min(1.0, (step + 1) / max(1, warmup_steps)) * decay ** (step // steps_per_epoch)


def make_head(meta: dict[str, Any], options: dict[str, Any]) -> AttentionPoolHead:
    """The head for a cache's rows (rffm.model.head.build)."""
    return head_model.build(options["head"], meta)


def make_optimizer(head: AttentionPoolHead, options: dict[str, Any], steps_per_epoch: int):
    optimizer = torch.optim.AdamW(head.parameters(), lr=options["lr"], weight_decay=options["weight_decay"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, steps_per_epoch, options["warmup_steps"], options["lr_decay_per_epoch"])
    )
    return optimizer, scheduler


def evaluate(
    head: AttentionPoolHead,
    split: CacheSplit,
    batch_size: int,
    device: torch.device | None = None,
    phases: PhaseTimes | None = None,
    tracer: BatchTracer | None = None,
) -> dict[str, float]:
    """Loss, accuracy and macro-F1 of the head on a cached split, in file order."""
    return evaluate_members([head], split, batch_size, device, phases, tracer)[0]


def evaluate_members(
    heads: list[AttentionPoolHead],
    split: CacheSplit,
    batch_size: int,
    device: torch.device | None = None,
    phases: PhaseTimes | None = None,
    tracer: BatchTracer | None = None,
) -> list[dict[str, float]]:
    """evaluate() of several heads from one pass over the split: each batch is gathered once and fed to all."""
    device = device or torch.device("cpu")
    phases = phases or PhaseTimes()
    for head in heads:
        head.eval()
    total_loss, predictions = [0.0] * len(heads), [[] for _ in heads]
    batches = [np.arange(start, min(start + batch_size, len(split))) for start in range(0, len(split), batch_size)]
    with torch.no_grad():
        for hidden, labels in prefetched(split, batches, device, phases):
            with phases.phase("head"):
                for index, head in enumerate(heads):
                    logits = head(hidden)
                    total_loss[index] += F.cross_entropy(logits, labels, reduction="sum").item()
                    predictions[index].append(logits.argmax(dim=1).cpu().numpy())
            if tracer is not None:
                tracer.step()
    results = []
    for head, loss, predicted in zip(heads, total_loss, predictions, strict=True):
        predicted = np.concatenate(predicted)
        confusion = confusion_matrix(split.labels, predicted, head.config.classes)
        results.append({"loss": loss / len(split), "accuracy": float((predicted == split.labels).mean()), "macro_f1": macro_f1(confusion)})
    return results
