"""Paired differences: two results scored on the same examples, and which examples each got right.

Test: the per-example correctness qualification records (rffm.model.metrics.CORRECT_KEY). Val: the selected epoch's
(of a sweep, the chosen member's) per-example correctness its validation recorded (VAL_CORRECT_KEY): an epoch's
metrics.json for a run (checked against its sentinel), the selection's history.json for a reference. A result trained
before either was recorded has none (None), and its differences carry no SE.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from rffm.errors import IntegrityError
from rffm.model.metrics import VAL_CORRECT_KEY, unpack_correct
from rffm.records.layout import EPOCHS, HISTORY_NAME, METRICS_NAME, SELECTION, SENTINEL_NAME
from rffm.records.sentinel import check_record, epoch_metrics, read_sentinel


def paired_se(mine: np.ndarray, theirs: np.ndarray) -> dict[str, Any]:
    """Difference in accuracy (mine - theirs) on the same n examples and its paired (McNemar) standard error,
    sqrt((b + c) - (b - c)^2 / n) / n, b: examples only mine got right, c: only theirs."""
    n = len(mine)
    b, c = int((mine & ~theirs).sum()), int((~mine & theirs).sum())
    se = math.sqrt(max(0.0, (b + c) - (b - c) ** 2 / n)) / n if n else float("nan")
    return {"difference": (b - c) / n if n else float("nan"), "se": se, "n": n, "discordant": [b, c]}


def val_correctness(run_dir: Path) -> np.ndarray | None:
    """Which val examples the run's selected epoch (and member) got right, row order; None where not recorded."""
    try:
        selection = read_sentinel(run_dir / SELECTION / SENTINEL_NAME)["selection"]
        epoch, member = selection["epoch"], selection.get("member")
        if selection.get("kind") == "end_to_end":
            history = json.loads((run_dir / SELECTION / HISTORY_NAME).read_text())["epochs"]
            metrics = next(m for m in history if m["epoch"] == epoch)
        else:
            metrics = epoch_record(run_dir / EPOCHS / str(epoch), member)
        return unpack_correct(metrics[VAL_CORRECT_KEY], int(metrics["val_count"]))
    except (IntegrityError, FileNotFoundError, StopIteration, KeyError, TypeError, ValueError):
        return None


def epoch_record(epoch_dir: Path, member: str | None) -> dict[str, Any]:
    """An epoch's full metrics (of a sweep's, the member's): its metrics.json, checked against its sentinel's digest
    (the sentinel keeps the figures only: rffm.model.metrics.sentinel_metrics)."""
    body = read_sentinel(epoch_dir / SENTINEL_NAME)
    if problem := check_record(epoch_dir / METRICS_NAME, body["outputs"][METRICS_NAME]):
        raise IntegrityError(problem)
    metrics = json.loads((epoch_dir / METRICS_NAME).read_text())
    if "members" not in body:
        return metrics
    return metrics["members"][member or epoch_metrics(body)["member"]]


def against_leader(correct: dict[str, np.ndarray | None], scores: dict[str, float]) -> dict[str, dict[str, Any] | None]:
    """Each result's paired val difference to the leader (the highest score) of those scored on as many examples:
    {run: {run: the leader, difference, se, n, discordant}} (None for the leader itself and a result without a record)."""
    leaders: dict[int, str] = {}
    for run, vector in correct.items():
        if vector is not None and run in scores:
            best = leaders.get(len(vector))
            if best is None or scores[run] > scores[best]:
                leaders[len(vector)] = run
    out: dict[str, dict[str, Any] | None] = {}
    for run, vector in correct.items():
        leader = leaders.get(len(vector)) if vector is not None else None
        out[run] = None if leader in (None, run) else {"run": leader, **paired_se(vector, correct[leader])}
    return out
