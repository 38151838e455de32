"""Phase timings (always, cheap) and optional torch.profiler Chrome traces for N batches.

Phase totals are inclusive and non-additive: a writer thread's phases overlap the caller's, and
outer phases contain inner ones. Use waits (backpressure, prefetch, copy) as critical-path
signals; do not sum phases into an expected runtime.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from rffm.records.layout import CACHE_LIFECYCLE_SUMMARY

SUMMARY_NAME = CACHE_LIFECYCLE_SUMMARY
PART_KEYS = ("host", "device", "duration_s", "batch_stats")


class PhaseTimes:
    """Thread-safe inclusive time totals per named phase."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.tracing = False

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.totals[name] += seconds
            self.counts[name] += 1

    @contextmanager
    def phase(self, name: str):
        """Time a block (and label it in the trace while tracing)."""
        label = nullcontext()
        if self.tracing:
            import torch  # imported where a trace is taken: summarize_profiling reads timings, never a tensor

            label = torch.profiler.record_function(name)
        started = time.perf_counter()
        with label:
            try:
                yield
            finally:
                self.add(name, time.perf_counter() - started)

    def merge(self, other: dict[str, dict[str, float]]) -> None:
        """Add the totals and counts of another process's as_dict()."""
        with self._lock:
            for name, phase in other.items():
                self.totals[name] += phase["total_s"]
                self.counts[name] += phase["count"]

    def as_dict(self, prefix: str = "") -> dict[str, dict[str, float]]:
        with self._lock:
            return {prefix + name: {"total_s": round(total, 6), "count": self.counts[name]} for name, total in sorted(self.totals.items())}


class BatchTracer:
    """Records a Chrome trace of the first `batch_count` batches of a loop (no-op when 0)."""

    def __init__(self, path: str | Path | None, batch_count: int, phases: PhaseTimes):
        self.path, self.remaining, self.phases = (Path(path) if path else None), batch_count, phases
        self.profiler = None
        if self.path is not None and batch_count > 0:
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities, record_shapes=False)
            self.profiler.__enter__()
            phases.tracing = True

    def step(self) -> None:
        """Mark the end of one batch; stop and export after the last traced one."""
        if self.profiler is None:
            return
        self.remaining -= 1
        if self.remaining <= 0:
            self.close()

    def close(self) -> None:
        if self.profiler is None:
            return
        self.profiler.__exit__(None, None, None)
        self.phases.tracing = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.profiler.export_chrome_trace(str(self.path))
        self.profiler = None


def summarize(run: str, parts: dict[str, dict[str, Any]], traces: list[str]) -> dict[str, Any]:
    """cache_lifecycle_summary of a run from the phase timings its steps recorded (their provenance records)."""
    phases: dict[str, Any] = {}
    for name, record in parts.items():  # build_cache, epoch1, epoch2, ...
        prefix = "cache_build." if name == "build_cache" else f"{name}."
        timings = record.get("phases") or (record.get("computed_by") or {}).get("phases", {})  # a restored epoch: as computed
        phases.update({prefix + phase: value for phase, value in timings.items()})
    return {
        "schema_version": 1,
        "run": run,
        "note": "inclusive, non-additive phase timings; waits are the critical-path signals",
        "phases": phases,
        "parts": {name: {k: v for k, v in record.items() if k in PART_KEYS} for name, record in parts.items()},
        "traces": sorted(traces),
    }
