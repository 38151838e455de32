"""Adaptive batch sizes for backbone passes: back off on out-of-memory, grow on success, remember.

The controller halves the batch and retries the same rows after an out-of-memory error, grows
it by 25% after 3 consecutive full-size successes (never past the configured maximum or the
smallest size known to fail), and after 32 successes below a failing size probes above it
again, doubling that wait after each failed probe. What a pass learned is kept in a
batch-profile JSON keyed by backbone fingerprint, input shape, dtype, device class and memory
budget, and seeds later passes. Seeds are advisory: they never exceed the configured maximum,
expire after a TTL, and never change outputs (every backbone pass is batch-invariant).
"""

from __future__ import annotations

import fcntl
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rffm.records.files import atomic_write_json, read_json, sha256_json

GROW_AFTER = 3
GROW_FACTOR = 1.25
PROBE_AFTER = 32
MAX_FAILED_PROBES = 4
PROFILE_TTL_S = 7 * 24 * 3600
INJECT_ENV = "RFFM_INJECT_OOM_ABOVE"


def is_out_of_memory(error: BaseException) -> bool:
    """True for CUDA and CPU allocator out-of-memory errors."""
    return isinstance(error, torch.OutOfMemoryError) or (isinstance(error, RuntimeError) and "out of memory" in str(error).lower())


def injected_limit() -> int | None:
    """Rows above which passes raise an out-of-memory error (testing hook, RFFM_INJECT_OOM_ABOVE)."""
    value = os.environ.get(INJECT_ENV)
    return int(value) if value else None


def check_injected(rows: int) -> None:
    """Raise a real torch.OutOfMemoryError when the injection hook says this batch is too big."""
    limit = injected_limit()
    if limit is not None and rows > limit:
        raise torch.OutOfMemoryError(f"out of memory: tried a batch of {rows} rows (injected above {limit} by {INJECT_ENV})")


@dataclass
class AdaptiveBatch:
    """Batch-size state of one pass."""

    maximum: int
    minimum: int = 1
    current: int = 0
    oom_bound: int | None = None  # smallest size that failed (exclusive upper bound)
    successes: int = 0  # consecutive full-size successes since the last change
    since_bound: int = 0  # full successes since the bound was set or last probed
    probe_after: int = PROBE_AFTER
    failed_probes: int = 0
    probing: bool = False
    before_probe: int = 0
    largest_good: int = 0  # largest full-size batch that went through in this pass
    stats: dict[str, int] = field(default_factory=lambda: {"ooms": 0, "probes": 0, "successes": 0, "grows": 0})

    def __post_init__(self) -> None:
        if self.maximum < self.minimum:
            raise ValueError(f"batch maximum {self.maximum} is below the minimum {self.minimum}")
        self.current = min(self.maximum, max(self.minimum, self.current or self.maximum))

    def seed(self, good: int | None, bound: int | None, failed_probes: int = 0) -> None:
        """Start from remembered experience, clipped to the configured bounds.

        The remembered good size is also treated as a ceiling until a recovery probe says
        otherwise (sizes between it and the failing one are unknown), and the probe backoff
        continues where the earlier pass left it.
        """
        if good is not None:
            self.current = min(self.maximum, max(self.minimum, good))
            if good < self.maximum:
                bound = min(bound, good + 1) if bound is not None else good + 1
        if bound is not None and bound <= self.maximum:
            self.oom_bound = max(self.minimum + 1, bound)
            self.current = min(self.current, self.oom_bound - 1)
        self.failed_probes = failed_probes
        self.probe_after = PROBE_AFTER * 2**failed_probes

    def size_for(self, remaining: int) -> int:
        """Rows to attempt next."""
        return max(1, min(self.current, remaining))

    def record_success(self, size: int, full: bool) -> None:
        """A batch of `size` rows went through; only full-size batches move the window."""
        self.stats["successes"] += 1
        if not full:
            return
        self.largest_good = max(self.largest_good, size)
        if self.probing:
            self.probing = False
            if self.oom_bound is not None and size >= self.oom_bound:
                self.oom_bound, self.failed_probes, self.probe_after = None, 0, PROBE_AFTER
        self.successes += 1
        self.since_bound += 1
        ceiling = self.maximum if self.oom_bound is None else self.oom_bound - 1
        if self.oom_bound is not None and self.since_bound >= self.probe_after and self.failed_probes < MAX_FAILED_PROBES:
            self.before_probe = self.current
            self._set(min(self.maximum, max(self.current + 1, math.ceil(self.current * GROW_FACTOR), self.oom_bound)))
            self.probing, self.since_bound = True, 0
            self.stats["probes"] += 1
        elif self.successes >= GROW_AFTER and self.current < ceiling:
            self._set(min(ceiling, max(self.current + 1, math.ceil(self.current * GROW_FACTOR))))
            self.stats["grows"] += 1

    def record_oom(self, size: int) -> None:
        """`size` rows did not fit: remember the bound and halve."""
        self.stats["ooms"] += 1
        if size <= self.minimum:
            raise torch.OutOfMemoryError(f"out of memory even at the minimum batch of {self.minimum} rows")
        self.oom_bound = size if self.oom_bound is None else min(self.oom_bound, size)
        self.since_bound = 0
        if self.probing:  # a failed recovery probe: back to the last good size, wait twice as long
            self.probing = False
            self.failed_probes += 1
            self.probe_after *= 2
            self._set(min(self.before_probe, self.oom_bound - 1))
            return
        self._set(max(self.minimum, size // 2))

    def _set(self, size: int) -> None:
        self.current = size
        self.successes = 0


def run_adaptive(total: int, controller: AdaptiveBatch, step: Callable[[int, int], None]) -> dict[str, int]:
    """Call step(start, stop) over [0, total) in adaptive batches, retrying rows that ran out of memory."""
    start = 0
    while start < total:
        size = controller.size_for(total - start)
        try:
            check_injected(size)
            step(start, start + size)
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error):
                raise
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            controller.record_oom(size)
            continue
        controller.record_success(size, full=size == controller.current)
        start += size
    return dict(controller.stats)


def device_context(device: torch.device | str) -> dict[str, Any]:
    """Device class and memory budget that make a remembered batch size valid."""
    device = torch.device(device)
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        return {"device_class": properties.name, "memory_budget_bytes": int(properties.total_memory)}
    return {"device_class": "cpu", "memory_budget_bytes": int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))}


def profile_key(fingerprint: str, input_shape: tuple[int, ...], dtype: str, context: dict[str, Any]) -> str:
    """Exact-match key of a batch-profile entry."""
    return sha256_json({"fingerprint": fingerprint, "input_shape": list(input_shape), "dtype": dtype, **context})


class BatchProfile:
    """The batch-profile JSON: advisory sizes learned by earlier passes, shared through a file."""

    def __init__(self, path: str | Path | None, ttl_s: float = PROFILE_TTL_S):
        self.path = Path(path) if path else None
        self.ttl_s = ttl_s

    def _load(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {"schema_version": 1, "entries": {}}
        try:
            return read_json(self.path)
        except ValueError:
            return {"schema_version": 1, "entries": {}}  # advisory: a damaged profile is ignored

    def lookup(self, key: str, now: float | None = None) -> dict[str, Any] | None:
        """The live entry for a key, or None if missing or expired."""
        entry = self._load()["entries"].get(key)
        now = time.time() if now is None else now
        if entry is None or now - entry["updated_unix"] > self.ttl_s:
            return None
        return entry

    def seed(self, key: str, controller: AdaptiveBatch) -> bool:
        """Seed a controller from a live entry; return whether one was used."""
        entry = self.lookup(key)
        if entry is None:
            return False
        controller.seed(entry.get("good"), entry.get("oom_bound"), entry.get("failed_probes", 0))
        return True

    def remember(self, key: str, controller: AdaptiveBatch, good: int, describe: dict[str, Any]) -> None:
        """Record a pass's largest successful size and smallest failing size (atomic, locked)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            profile = self._load()
            profile["entries"][key] = {
                "good": good,
                "oom_bound": controller.oom_bound,
                "failed_probes": controller.failed_probes,
                "updated_unix": time.time(),
                **describe,
            }
            atomic_write_json(self.path, profile)
