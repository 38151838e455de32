"""Classification metrics: accuracy, macro-F1, confusion matrix, per-class and per-SNR accuracy."""

from __future__ import annotations

import base64
import math

import numpy as np

# The qualification metrics' key of the per-example correctness: base64 of numpy.packbits over the test rows in order.
CORRECT_KEY = "correct_by_example"
# The validation metrics' key of the same, over the val rows in order: a design compared on val pairs its results on it.
VAL_CORRECT_KEY = "val_correct_by_example"


def sentinel_metrics(metrics: dict) -> dict:
    """An epoch's metrics as its sentinel keeps them: the figures, without the per-example val record (it grows with the
    val split and stays in metrics.json, which the sentinel vouches for by digest; status reads every sentinel)."""
    return {key: value for key, value in metrics.items() if key != VAL_CORRECT_KEY}


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, n_classes: int) -> np.ndarray:
    """Counts [true, predicted]."""
    return np.bincount(labels * n_classes + predictions, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def macro_f1(confusion: np.ndarray) -> float:
    """Unweighted mean of per-class F1 (a class never predicted nor present counts as 0)."""
    true_positive = np.diag(confusion).astype(np.float64)
    denominator = confusion.sum(0) + confusion.sum(1)
    f1 = np.divide(2 * true_positive, denominator, out=np.zeros_like(true_positive), where=denominator > 0)
    return float(f1.mean())


def snr_key(snr: float) -> str:
    """Stable JSON key for an SNR value in dB."""
    return "unknown" if math.isnan(snr) else f"{snr:g}"


def summarize(labels: np.ndarray, predictions: np.ndarray, snr_db: np.ndarray, classes: list[str], high_snr_db: float = 10.0) -> dict:
    """All qualification metrics for one set of predictions."""
    confusion = confusion_matrix(labels, predictions, len(classes))
    correct = labels == predictions
    by_class = {name: float(correct[labels == i].mean()) if (labels == i).any() else None for i, name in enumerate(classes)}
    keys = np.array([snr_key(float(s)) for s in snr_db])
    ordered = sorted(set(keys.tolist()), key=lambda k: (k == "unknown", float(k) if k != "unknown" else 0.0))
    by_snr = {key: float(correct[keys == key].mean()) for key in ordered}
    by_class_snr = {
        name: {key: float(correct[(labels == i) & (keys == key)].mean()) for key in ordered if ((labels == i) & (keys == key)).any()}
        for i, name in enumerate(classes)
    }
    high = snr_db >= high_snr_db
    return {
        "count": int(len(labels)),
        "accuracy": float(correct.mean()) if len(labels) else float("nan"),
        "macro_f1": macro_f1(confusion),
        "accuracy_by_class": by_class,
        "accuracy_by_snr": by_snr,
        "accuracy_by_class_and_snr": by_class_snr,
        "accuracy_high_snr": {"min_snr_db": high_snr_db, "accuracy": float(correct[high].mean()) if high.any() else None},
        "confusion_matrix": confusion.tolist(),
        "classes": list(classes),
    }


def pack_correct(correct: np.ndarray) -> str:
    """Per-example correctness (test rows in order) as base64 of its bits (numpy.packbits, most significant bit first)."""
    return base64.b64encode(np.packbits(np.asarray(correct, dtype=bool)).tobytes()).decode("ascii")


def unpack_correct(text: str, count: int) -> np.ndarray:
    """The `count` booleans pack_correct recorded (ValueError when the record holds fewer)."""
    bits = np.unpackbits(np.frombuffer(base64.b64decode(text, validate=True), dtype=np.uint8))
    if len(bits) < count or len(bits) - count >= 8:
        raise ValueError(f"{len(bits)} bits recorded for {count} examples")
    return bits[:count].astype(bool)
