"""Every evaluation: validation metrics of heads on a cached split and of the reference CNN in memory; the test metrics.

Validation produces one dict (val_metrics) whatever the model kind; the test split is read by
qualification_metrics only, through a kind's predictor (predict_heads: the frozen backbone's encoder and a
head; predict_cnn: the end-to-end reference).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from rffm.data.cache_reader import CacheSplit, prefetched
from rffm.model import cnn
from rffm.model import encoder as encoders
from rffm.model.head import AttentionPoolHead
from rffm.model.metrics import CORRECT_KEY, VAL_CORRECT_KEY, confusion_matrix, macro_f1, pack_correct, summarize
from rffm.records.layout import SENTINEL_NAME, split_file
from rffm.records.sentinel import require_intact
from rffm.runtime import batching
from rffm.runtime.profiling import BatchTracer, PhaseTimes
from rffm.runtime.progress import Progress

CNN_BATCH = 1024  # rows of IQ the reference CNN evaluates at once (validation and test)


def val_metrics(loss: float, labels: np.ndarray, predicted: np.ndarray, classes: int) -> dict[str, Any]:
    """The validation metrics every model kind reports: val_loss (given), val_accuracy, val_macro_f1, and which val
    examples it got right (val_count, VAL_CORRECT_KEY: rffm status and compare pair two designs on them)."""
    return {
        "val_loss": loss,
        "val_accuracy": float((predicted == labels).mean()),
        "val_macro_f1": macro_f1(confusion_matrix(labels, predicted, classes)),
        "val_count": int(len(labels)),
        VAL_CORRECT_KEY: pack_correct(predicted == labels),
    }


def validate_heads(
    heads: list[AttentionPoolHead],
    split: CacheSplit,
    batch_size: int,
    device: torch.device | None = None,
    phases: PhaseTimes | None = None,
    tracer: BatchTracer | None = None,
) -> list[dict[str, Any]]:
    """val_metrics of each head on a cached split, in file order, from one pass: each batch is gathered once and fed to all."""
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
    return [
        val_metrics(loss / len(split), split.labels, np.concatenate(predicted), head.config.classes)
        for head, loss, predicted in zip(heads, total_loss, predictions, strict=True)
    ]


def validate_cnn(model: cnn.RadioMLCNN, iq: torch.Tensor, labels: np.ndarray) -> dict[str, Any]:
    """val_metrics of the reference CNN on a split held in memory, in file order."""
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(iq[start : start + CNN_BATCH]) for start in range(0, len(iq), CNN_BATCH)])
    loss = float(F.cross_entropy(logits, torch.from_numpy(labels), reduction="mean"))
    return val_metrics(loss, labels, logits.argmax(dim=1).numpy(), model.config.classes)


def qualification_metrics(
    dataset_dir: Path, classes: list[str], high_snr_db: float, predict: Callable[[Path], np.ndarray], rule: str
) -> dict[str, Any]:
    """The qualification metrics of a model: the one read of the test split (checked first), predictions from `predict`."""
    require_intact(dataset_dir / SENTINEL_NAME, [split_file("test")], rule)
    test_path = dataset_dir / split_file("test")
    with h5py.File(test_path, "r") as handle:
        labels, snr_db = handle["label"][()], handle["snr_db"][()]
    predictions = predict(test_path)
    # which test examples it got right (row order): rffm compare pairs two results scored on this split
    return {**summarize(labels, predictions, snr_db, classes, high_snr_db), CORRECT_KEY: pack_correct(labels == predictions)}


def predict_heads(
    model: encoders.Encoder,
    head: AttentionPoolHead,
    test_path: Path,
    batch_size: int = 512,
    batch_profile: str | Path | None = None,
    device: torch.device | str = "cpu",
) -> tuple[np.ndarray, dict[str, int]]:
    """Class predictions of a head behind the frozen encoder (hidden states rounded to BF16 exactly as in training)."""
    device = torch.device(device)
    head = head.to(device)
    with h5py.File(test_path, "r") as handle:
        iq = handle["iq"]
        predictions = np.empty(iq.shape[0], dtype=np.int64)
        profile = batching.BatchProfile(batch_profile)
        key = batching.profile_key(model.identity, tuple(iq.shape[1:]), "float32", batching.device_context(device))
        controller = batching.AdaptiveBatch(maximum=batch_size)
        profile.seed(key, controller)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)

        def step(start: int, stop: int) -> None:
            with torch.no_grad():
                with autocast:
                    hidden = encoders.as_row(model.features(torch.from_numpy(iq[start:stop]).to(device)))
                hidden = hidden.to(torch.bfloat16).float()
                predictions[start:stop] = head(hidden).argmax(dim=1).cpu().numpy()

        progress = Progress("qualify (test split)", total=iq.shape[0], unit="example")

        def tracked(start: int, stop: int) -> None:
            step(start, stop)
            progress.update(stop - start)

        stats = batching.run_adaptive(iq.shape[0], controller, tracked)
        progress.close()
        if controller.largest_good:
            profile.remember(
                key, controller, controller.largest_good, {"input_shape": list(iq.shape[1:]), **batching.device_context(device)}
            )
    return predictions, stats


def predict_cnn(model: cnn.RadioMLCNN, test_path: Path) -> np.ndarray:
    """Class predictions of the reference CNN, CNN_BATCH rows at a time."""
    with h5py.File(test_path, "r") as handle:
        iq = handle["iq"]
        predictions = np.empty(iq.shape[0], dtype=np.int64)
        with torch.no_grad():
            for start in range(0, iq.shape[0], CNN_BATCH):
                batch = torch.from_numpy(np.ascontiguousarray(iq[start : start + CNN_BATCH], np.float32))
                predictions[start : start + CNN_BATCH] = model(batch).argmax(dim=1).numpy()
    return predictions
