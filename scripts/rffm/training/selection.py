"""The selection rule: which epoch a run keeps, by its validation metric (ties go to the earliest epoch)."""

from __future__ import annotations

from typing import Any

from rffm.errors import ConfigError

RULE_TEXT = "best value of the metric; ties go to the earliest epoch"


def choose(metrics_by_epoch: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any]:
    """The best epoch by metric and mode; ties go to the earliest epoch."""
    if not metrics_by_epoch:
        raise ConfigError("selection needs at least one epoch")
    if metric not in metrics_by_epoch[0]:
        raise ConfigError(f"runs.*.selection.metric: {metric!r} is not an epoch metric; choose one of {sorted(metrics_by_epoch[0])}")
    sign = 1 if mode == "max" else -1
    return max(sorted(metrics_by_epoch, key=lambda m: m["epoch"]), key=lambda m: (sign * m[metric], -m["epoch"]))


def best(metrics_by_epoch: list[dict[str, Any]], selection: dict[str, str]) -> dict[str, Any] | None:
    """The best of the epochs that carry the run's selection metric (None when none does yet)."""
    scored = [m for m in metrics_by_epoch if selection["metric"] in m]
    return choose(scored, selection["metric"], selection["mode"]) if scored else None
