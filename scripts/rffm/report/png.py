"""Figures as PNG files whose bytes depend only on what they draw (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rffm.records.files import commit_file, temporary_sibling  # noqa: E402

PNG_METADATA = {"Software": None}  # no version string in the file


def save_png(fig, path: str | Path) -> None:
    """Write a figure atomically and close it."""
    tmp = temporary_sibling(path)
    fig.savefig(tmp, format="png", dpi=110, metadata=PNG_METADATA, bbox_inches="tight")
    plt.close(fig)
    commit_file(tmp, path)
