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

import torch

from rffm.records.files import atomic_write_json, read_json

SUMMARY_NAME = "cache_lifecycle_summary.json"


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
        label = torch.profiler.record_function(name) if self.tracing else nullcontext()
        started = time.perf_counter()
        with label:
            try:
                yield
            finally:
                self.add(name, time.perf_counter() - started)

    def as_dict(self, prefix: str = "") -> dict[str, dict[str, float]]:
        with self._lock:
            return {prefix + name: {"total_s": round(total, 6), "count": self.counts[name]} for name, total in sorted(self.totals.items())}


class BatchTracer:
    """Records a Chrome trace of the first `batch_count` batches of a loop (no-op when 0)."""

    def __init__(self, path: str | Path | None, batch_count: int, phases: PhaseTimes):
        self.path, self.remaining, self.phases = (Path(path) if path else None), batch_count, phases
        self.profiler = None
        if self.path is not None and batch_count > 0:
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


def summarize(
    run: str, cache_provenance: str | Path, epoch_provenances: list[str | Path], profile_dir: str | Path, out: str | Path
) -> Path:
    """cache_lifecycle_summary.json of a run from the phase timings its steps recorded in provenance."""
    parts = {"build_cache": read_json(cache_provenance)}
    for path in epoch_provenances:
        record = read_json(path)
        parts[f"train_epoch_{record['epoch']}"] = record
    phases: dict[str, Any] = {}
    for name, record in parts.items():
        prefix = "cache_build." if name == "build_cache" else f"epoch{record['epoch']}."
        phases.update({prefix + phase: value for phase, value in record.get("phases", {}).items()})
    summary = {
        "schema_version": 1,
        "run": run,
        "note": "inclusive, non-additive phase timings; waits are the critical-path signals",
        "phases": phases,
        "parts": {
            name: {k: record.get(k) for k in ("host", "device", "duration_s", "batch_stats") if k in record}
            for name, record in parts.items()
        },
        "traces": sorted(p.name for p in Path(profile_dir).glob("*.trace.json")),
    }
    atomic_write_json(out, summary)
    return Path(out)
