"""plot_cache_lifecycle: a profiled run's cache lifecycle phases as a bar chart (inclusive timings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm.errors import DataError
from rffm.records.files import read_json
from rffm.records.layout import CACHE_LIFECYCLE, SENTINEL_NAME
from rffm.records.rebuild import rebuild_command
from rffm.records.step import Step
from rffm.report.png import plt, save_png

RULE = "plot_cache_lifecycle"
FIGURE = CACHE_LIFECYCLE


def cache_lifecycle(summary: dict[str, Any], path: str | Path, title: str) -> None:
    """Horizontal bars of each profiled phase's inclusive total time (phases nest, so bars do not add up)."""
    phases = sorted(summary["phases"].items(), key=lambda item: item[1]["total_s"])
    names = [name for name, _ in phases]
    totals = [float(stats["total_s"]) for _, stats in phases]
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.38 * max(len(names), 1)))
    bars = ax.barh(names, totals, color="tab:purple", alpha=0.8)
    for bar, (_, stats) in zip(bars, phases, strict=True):
        label = f" {stats['total_s']:.3f} s / {stats['count']} call{'s' if stats['count'] != 1 else ''}"
        ax.annotate(label, (bar.get_width(), bar.get_y() + bar.get_height() / 2), va="center", fontsize=7)
    ax.set_xlim(0, max(totals, default=1.0) * 1.3 or 1.0)
    ax.set(xlabel="inclusive time (s), summed over all batches of the step", title=f"{title}\ninclusive, non-additive phase timings")
    ax.grid(axis="x", alpha=0.3)
    save_png(fig, path)


def check_lifecycle_summary(summary: Any, path: str | Path) -> dict[str, Any]:
    """A cache_lifecycle_summary.json with phases {name: {total_s, count}}, or a clear error (its fix: summarize_profiling
    again, which reads the phases from the profiled steps' provenance records)."""
    phases = summary.get("phases") if isinstance(summary, dict) else None
    if not isinstance(phases, dict) or not phases:
        again = rebuild_command(Path(path).parent / SENTINEL_NAME, remove=True)
        raise DataError(f"{path}: field 'phases' must be a non-empty mapping of phase name to {{total_s, count}}. Fix: {again}")
    for name, stats in phases.items():
        if not isinstance(stats, dict) or not isinstance(stats.get("total_s"), (int, float)) or not isinstance(stats.get("count"), int):
            raise DataError(f"{path}: phases.{name} must hold a number 'total_s' and an integer 'count', got {stats!r}")
    return summary


def run(run_name: str, summary_path: str | Path, out_dir: str | Path) -> Path:
    """The chart of the profiling summary beside `summary_path` (checked against its sentinel)."""
    summary_path = Path(summary_path)
    with Step(RULE, out_dir, key={"run": run_name}, params={"run": run_name}) as step:
        step.consume("profiling_summary", summary_path.parent / SENTINEL_NAME, [summary_path.name])
        summary = check_lifecycle_summary(read_json(summary_path), summary_path)
        batches = summary.get("batch_count")
        title = f"{run_name}: cache lifecycle" + (f" ({batches} profiled batches)" if batches else "")
        cache_lifecycle(summary, step.out_dir / FIGURE, title)
        step.output(FIGURE)
    return step.sentinel
