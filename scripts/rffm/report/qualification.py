"""The qualification figures: test accuracy against SNR and the normalized confusion matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rffm.report.png import plt, save_png


def accuracy_vs_snr(metrics: dict[str, Any], path: str | Path, title: str, per_class: dict[str, dict[str, float]] | None = None) -> None:
    """Overall (and optionally per-class) test accuracy against SNR."""
    keys = [k for k in metrics["accuracy_by_snr"] if k != "unknown"]
    snrs = [float(k) for k in keys]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if per_class:
        for name, curve in per_class.items():
            ax.plot(snrs, [curve.get(k, np.nan) for k in keys], lw=0.9, alpha=0.6, label=name)
    ax.plot(snrs, [metrics["accuracy_by_snr"][k] for k in keys], "k-o", lw=2.2, ms=3, label="all classes")
    ax.axhline(1 / len(metrics["classes"]), color="grey", ls=":", lw=1, label="chance")
    ax.set(xlabel="SNR (dB)", ylabel="test accuracy", ylim=(0, 1.02), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    save_png(fig, path)


def confusion(metrics: dict[str, Any], path: str | Path, title: str) -> None:
    """Row-normalized confusion matrix (true class by row)."""
    counts = np.asarray(metrics["confusion_matrix"], dtype=float)
    normalized = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    classes = metrics["classes"]
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    image = ax.imshow(normalized, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(classes)), classes, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(classes)), classes, fontsize=8)
    for i in range(len(classes)):
        for j in range(len(classes)):
            if normalized[i, j] >= 0.01:
                ax.text(
                    j,
                    i,
                    f"{normalized[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if normalized[i, j] > 0.5 else "black",
                )
    ax.set(xlabel="predicted class", ylabel="true class", title=title)
    fig.colorbar(image, ax=ax, fraction=0.046, label="fraction of true class")
    save_png(fig, path)
