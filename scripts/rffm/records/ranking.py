"""The selection rule's order, one definition for choosing an epoch (training/selection.py) and for naming a sweep
epoch's best member (records/sentinel.py): a candidate's score under a metric and mode, higher is better."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def scorer(metric: str, mode: str) -> Callable[[dict[str, Any]], float]:
    """metrics -> score: the metric itself for mode max, its negative for min."""
    sign = 1 if mode == "max" else -1
    return lambda metrics: sign * metrics[metric]
