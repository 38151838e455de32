"""The qualification figures: test accuracy against SNR and the normalized confusion matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rffm.report.png import plt, save_png

# Qualitative palettes: tab10 for up to 10 classes, tab20 (its 10 strong colours, then their light
# partners) for up to 20; past that the colours repeat with another line style, so every class curve
# differs from every other in colour or style (RadioML 2018 has 24 classes; up to 60 are told apart).
LINE_STYLES = ("-", "--", "-.")


def class_styles(count: int) -> list[tuple[tuple[float, ...], str]]:
    """A (colour, line style) pair per class, pairwise distinct up to 60 classes, the same for the same count."""
    if count <= 10:
        colors = list(plt.get_cmap("tab10").colors)
    else:
        tab20 = plt.get_cmap("tab20").colors
        colors = list(tab20[0::2] + tab20[1::2])
    return [(tuple(colors[i % len(colors)]), LINE_STYLES[i // len(colors) % len(LINE_STYLES)]) for i in range(count)]


def accuracy_vs_snr_figure(metrics: dict[str, Any], title: str, per_class: dict[str, dict[str, float]] | None = None):
    """The accuracy-against-SNR figure (not saved): one curve per class, the overall curve, chance."""
    keys = [k for k in metrics["accuracy_by_snr"] if k != "unknown"]
    snrs = [float(k) for k in keys]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if per_class:
        for (name, curve), (color, style) in zip(per_class.items(), class_styles(len(per_class)), strict=True):
            ax.plot(snrs, [curve.get(k, np.nan) for k in keys], color=color, ls=style, lw=1.1, alpha=0.85, label=name)
    ax.plot(snrs, [metrics["accuracy_by_snr"][k] for k in keys], "k-o", lw=2.2, ms=3, label="all classes")
    ax.axhline(1 / len(metrics["classes"]), color="grey", ls=":", lw=1, label="chance")
    ax.set(xlabel="SNR (dB)", ylabel="test accuracy", ylim=(0, 1.02), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    return fig


def accuracy_vs_snr(metrics: dict[str, Any], path: str | Path, title: str, per_class: dict[str, dict[str, float]] | None = None) -> None:
    """Overall (and optionally per-class) test accuracy against SNR, as a PNG."""
    save_png(accuracy_vs_snr_figure(metrics, title, per_class), path)


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
