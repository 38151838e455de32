"""train_epoch: one epoch of every member of a run's sweep on cached hidden states, resuming exactly.

A run without `sweep` is one member and its epoch folder is a plain epoch (checkpoint.pt,
metrics.json). A sweep of K > 1 members (rffm.training.sweep) trains them together from one pass
over the cache: each batch is gathered and restored to FP32 once and fed to every head in grid
order; each member keeps its own init, dropout stream (the torch RNG state is switched per member),
optimizer and schedule. Each member is also a step of its own (its identity is the one the same
member would have as a plain run): its memo entry is restored when it exists, so a grid that gains
a value trains only the new members, and the epoch's checkpoint.pt bundles every member's files.
The loop is rffm.training.epoch.train_heads, the members' bookkeeping rffm.training.members; this step
consumes, restores or trains, and records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm.records import memo
from rffm.records.layout import CHECKPOINT_NAME, EPOCH_FILES, SENTINEL_NAME
from rffm.records.step import Step
from rffm.records.store import open_store
from rffm.runtime import tensorboard
from rffm.training import sweep
from rffm.training.members import Epoch, NodeCache, step_params, train_plain, train_sweep

RULE = "train_epoch"


def run(
    spec: dict[str, Any],
    cache_record_dir: str | Path,
    epoch: int,
    previous_dir: str | Path | None,
    out_dir: str | Path,
    *,
    scratch: str | Path,
    cache_options: dict[str, Any],
    device: str = "cpu",
    threads: int | None = None,
    store: str | Path | None = None,
    memo_store: str | Path | None = None,
    profile_batches: int = 0,
) -> Path:
    """Train epoch `epoch` (1-based) of every member and write checkpoint.pt, metrics.json and the sentinel.

    An epoch (or a member's epoch) in the memo (rffm.records.memo, under `memo_store`, default the results store)
    with this identity is restored instead of trained; a trained one is saved there. The hidden-state cache is
    read from this node's scratch, built first if missing.
    """
    bundle = sweep.is_bundle(spec)
    if not bundle:  # a one-value sweep is its plain run
        spec = sweep.member_spec(spec, sweep.members(spec)[0])
    results = open_store(store) if store else None
    memo_store = open_store(memo_store) if memo_store else results  # the memo's store: the one given, else the results store
    this = Epoch(spec, epoch, Path(previous_dir) if previous_dir else None, NodeCache(Path(cache_record_dir), scratch, cache_options))
    with Step(RULE, out_dir, key={"run": spec["run"], "epoch": epoch}, params=step_params(spec), threads=threads) as step:
        step.details["epoch"] = epoch
        this.cache.record = step.consume("cache", this.cache.record_dir / SENTINEL_NAME)
        if epoch > 1:
            step.consume("previous_epoch", this.previous_dir / SENTINEL_NAME, [CHECKPOINT_NAME])
        restored = memo_store is not None and memo.restore(memo_store, step, EPOCH_FILES)
        if restored:
            trained = []
        elif bundle:
            trained = train_sweep(this, step, memo_store, device, results, profile_batches)
        else:
            trained = train_plain(this, step, device, results, profile_batches)
    if not restored and memo_store is not None:
        memo.save(memo_store, step, EPOCH_FILES)
    for member in trained:  # optional side output, after the epoch is complete
        tensorboard.log_epoch(f"{spec['run']}/{member.name}" if bundle else spec["run"], member.metrics)
    return step.sentinel


def check_planned_members(spec: dict[str, Any], planned: str) -> None:
    """Stop when the plan named other members than this code computes from the spec (a planner of other code)."""
    sweep.check_planned(spec, planned, "runs")
