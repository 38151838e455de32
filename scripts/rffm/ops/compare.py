"""Floor | frozen backbone | end-to-end: the qualified runs and references of a results tree side by side.

Read from each qualified run's manifest and its steps' provenance only (never from data). Roles: a run on
a backbone of source `random` is the floor, a run on any other backbone the frozen backbone, a reference
(`references:` in the config) the end-to-end CNN. Step time is the sum of the recorded durations of the
steps that produced the result after staging (each step's own work: not its process start nor Snakemake's
scheduling): backbone, cache, every epoch, selection and qualification for a run;
training (with selection) and qualification for a reference. A backbone or cache several runs share
counts in each of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rffm.errors import IntegrityError
from rffm.records import provenance
from rffm.records.layout import (
    EPOCHS,
    MANIFEST_NAME,
    PROVENANCE_NAME,
    QUALIFICATION,
    SELECTION,
    SENTINEL_NAME,
    backbone_folder,
    cache_folder,
    qualification_folder,
)

ROLES = ("floor", "frozen backbone", "end-to-end")


def _duration(directory: Path) -> float | None:
    try:
        return float(provenance.read(directory / PROVENANCE_NAME, directory / SENTINEL_NAME)["duration_s"])
    except (IntegrityError, FileNotFoundError, KeyError, TypeError, ValueError):
        return None


def wall_time(results: Path, run_dir: Path, manifest: dict[str, Any]) -> float | None:
    """Seconds of the steps behind one qualified result (None when a record is missing)."""
    if manifest.get("kind") == "end_to_end":
        folders = [run_dir / SELECTION, run_dir / QUALIFICATION]
    else:
        dataset, backbone = manifest["dataset"]["name"], manifest["backbone"]["name"]
        epochs = [run_dir / EPOCHS / str(e["epoch"]) for e in manifest["training"]["epochs"]]
        folders = [results / backbone_folder(backbone), results / cache_folder(dataset, backbone), *epochs]
        folders += [run_dir / SELECTION, run_dir / QUALIFICATION]
    durations = [_duration(folder) for folder in folders]
    return None if any(d is None for d in durations) else round(sum(durations), 1)


def role_of(manifest: dict[str, Any]) -> str:
    if manifest.get("kind") == "end_to_end":
        return "end-to-end"
    return "floor" if manifest["backbone"]["source"] == "random" else "frozen backbone"


def collect(
    results_dir: str | Path, config: dict[str, Any] | None = None, names: list[str] | None = None, unknown: list[str] = ()
) -> list[dict[str, Any]]:
    """One row per qualified run or reference (of the config's and the `unknown` runs no plan speaks for, or those
    named, when given): by labels per (class, SNR) (k ascending, all last), then floor first."""
    from rffm.ops.status import exposure

    results = Path(results_dir)
    if names is None and config:
        names = [*config.get("runs", {}), *config.get("references", {}), *unknown]
    rows = []
    for path in sorted(results.glob(f"{qualification_folder('*')}/{MANIFEST_NAME}")):
        run_dir = path.parents[1]
        if (names is not None and run_dir.name not in names) or not (path.parent / SENTINEL_NAME).exists():
            continue
        manifest = json.loads(path.read_text())
        quality = manifest["qualification"]
        rows.append(
            {
                "run": run_dir.name,
                "role": role_of(manifest),
                "dataset": manifest["dataset"]["name"],
                "model": manifest.get("backbone", {}).get("name") or f"cnn ({manifest['model']['input']} input)",
                "labels": manifest["training"]["params"].get("labels_per_class_snr"),  # per (class, SNR); None: all
                "accuracy": quality["accuracy"],
                "accuracy_high_snr": quality["accuracy_high_snr"]["accuracy"],
                "high_snr_db": quality["accuracy_high_snr"]["min_snr_db"],
                "macro_f1": quality["macro_f1"],
                "wall_s": wall_time(results, run_dir, manifest),
                "exposure_count": quality["exposure_count"],
                "member": manifest.get("selection", {}).get("member"),  # a sweep's chosen member
                "exposure": exposure(results, run_dir, None),
            }
        )
    return sorted(rows, key=lambda r: (r["labels"] is None, r["labels"] or 0, ROLES.index(r["role"]), r["run"]))


def labels_text(labels: int | None) -> str:
    """The labels column: k labelled train examples per (class, SNR), or all of them."""
    return "all" if labels is None else str(labels)


def render(rows: list[dict[str, Any]]) -> str:
    """A plain-text table, one row per result (labels: k per (class, SNR) or all), and a line saying what wall time counts."""
    high = rows[0]["high_snr_db"] if rows else 10
    from rffm.ops.status import exposure_words

    header = ["labels", "role", "run", "dataset", "backbone / model", "test acc", f"acc >={high:g} dB", "macro-F1", "step time"]
    header.append("test exposure: run (split)")
    table = [header]
    for r in rows:
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f} s"
        table.append(
            [
                labels_text(r.get("labels")),
                r["role"],
                r["run"] + (f" [{r['member']}]" if r.get("member") else ""),
                r["dataset"],
                r["model"],
                f"{r['accuracy']:.3f}",
                f"{r['accuracy_high_snr']:.3f}",
                f"{r['macro_f1']:.3f}",
                wall,
                exposure_words(r["exposure"]),
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.append(
        "step time: the sum of the recorded durations of the steps after staging (backbone, cache, epochs, selection, "
        "qualification; end-to-end: training, qualification), each from its work's start to its end: not the process "
        "start (Python, torch imports) nor Snakemake's scheduling, so less than the run's wall-clock time"
    )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Grouped bars: test accuracy, high-SNR accuracy and macro-F1 of every result; wall time in the legend."""
    from rffm.report.png import plt, save_png

    metrics = [
        ("accuracy", "test accuracy"),
        ("accuracy_high_snr", f"accuracy >= {rows[0]['high_snr_db']:g} dB" if rows else "high SNR"),
        ("macro_f1", "macro-F1"),
    ]
    colors = {"floor": "#9e9e9e", "frozen backbone": "#1f77b4", "end-to-end": "#d62728"}
    hatches = ["", "//", "..", "xx"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / max(1, len(rows))
    x = np.arange(len(metrics))
    for i, r in enumerate(rows):
        values = [r[key] for key, _ in metrics]
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f} s"
        same_role = [q for q in rows[:i] if q["role"] == r["role"]]
        bars = ax.bar(
            x + (i - (len(rows) - 1) / 2) * width,
            values,
            width,
            color=colors[r["role"]],
            hatch=hatches[len(same_role) % len(hatches)],
            edgecolor="white",
            label=f"{r['role']}: {r['run']}, labels {labels_text(r.get('labels'))} ({wall})",
        )
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=1)
    ax.set_xticks(x, [label for _, label in metrics])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("test split")
    ax.set_title("floor | frozen backbone | end-to-end (test split; wall time in brackets)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(3, max(1, len(rows))), frameon=False)
    save_png(fig, path)
