"""The hidden-state cache format: frozen-backbone outputs for train and val, BF16 in memory-mapped files.

Build: files are preallocated at their exact size (fallocate, so a full disk fails up front, not
as SIGBUS mid-write); the backbone runs in the caller in adaptive batches while a background
writer assigns finished batches into the map through a bounded queue (backpressure, bounded RAM)
and periodically drops written pages from this process's page tables (the data stays in the page
cache and the file). The split boundary waits for outstanding writes; the sentinel is written
after the last write has landed and the files are fsynced.

Read: whole batches are gathered from the map with sorted row indices, restored to FP32, and one
batch is prefetched ahead by a background thread (into pinned memory with non-blocking copies on
CUDA). Epochs never reopen signal records and never construct the backbone.
"""

from __future__ import annotations

import mmap
import os
import queue
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from rffm.errors import ConfigError, IntegrityError
from rffm.model import backbone
from rffm.records.files import read_json
from rffm.records.layout import CACHED_SPLITS, SENTINEL_NAME, cache_files, hidden_file
from rffm.records.sentinel import require_intact
from rffm.runtime import batching
from rffm.runtime.profiling import BatchTracer, PhaseTimes
from rffm.runtime.progress import Progress

QUEUE_DEPTH = 4
RELEASE_BYTES = 32 << 20  # writer: drop written pages from RSS after this many bytes
# Reader: a fault on a file mapping maps the whole page-cache folio around it (measured here:
# ~500 KiB per scattered 2 KiB row on ext4 with large folios), so mapped pages are dropped after
# every gathered batch of a file larger than this; smaller caches stay mapped.
RELEASE_READS_ABOVE = 32 << 20


def to_bf16_bits(hidden: torch.Tensor) -> np.ndarray:
    """FP32 tensor -> raw BF16 bits as uint16 (numpy has no bfloat16)."""
    return hidden.to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> torch.Tensor:
    """Raw BF16 bits -> FP32 tensor."""
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16).float()


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def check_disk_budget(directory: Path, needed: int, headroom: float) -> None:
    """Refuse to start unless the scratch filesystem has headroom x the cache size free."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < headroom * needed:
        raise ConfigError(
            f"not enough free space for the hidden-state cache in {directory}: need {headroom}x "
            f"{needed} bytes ({human_bytes(needed)}) = {int(headroom * needed)} bytes ({human_bytes(headroom * needed)}), "
            f"free {free} bytes ({human_bytes(free)}). Fix: free space, point `scratch` (or "
            "--hidden-state-cache-directory) at a larger local disk, or lower `cache.disk_headroom` "
            "(0 disables the check) if you know the cache fits."
        )


def split_count(path: Path) -> int:
    """Rows in a canonical split file."""
    with h5py.File(path, "r") as handle:
        return int(handle["label"].shape[0])


def preallocate(path: Path, shape: tuple[int, ...]) -> np.memmap:
    """Create the file at its exact final size with its blocks reserved, and map it for writing."""
    size = int(np.prod(shape)) * 2
    with open(path, "wb") as handle:
        if size:
            os.posix_fallocate(handle.fileno(), 0, size)
    return np.memmap(path, dtype=np.uint16, mode="r+", shape=shape) if size else np.zeros(shape, np.uint16)


def release_pages(array: np.ndarray) -> None:
    """Drop a mapping's resident pages from this process (the page cache keeps them)."""
    mapping = getattr(array, "_mmap", None)
    if mapping is not None:
        mapping.madvise(mmap.MADV_DONTNEED)


class BackgroundWriter:
    """Assigns (row, bits) batches into a memory map on a background thread, through a bounded queue."""

    def __init__(self, target: np.memmap, phases: PhaseTimes, depth: int = QUEUE_DEPTH):
        self.target, self.phases, self.depth = target, phases, depth
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.in_flight = 0  # batches submitted and not yet assigned (bounded by depth + 1)
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._since_release = 0
        self.thread = threading.Thread(target=self._run, name="cache-writer", daemon=True)
        self.thread.start()

    def submit(self, start: int, bits: np.ndarray) -> None:
        """Queue one batch; blocks (backpressure) while the queue is full."""
        self._raise()
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        with self.phases.phase("backpressure_wait"):
            self.queue.put((start, bits))

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                if self.error is None:
                    start, bits = item
                    with self.phases.phase("memmap_assign"):
                        self.assign(start, bits)
                    self._since_release += bits.nbytes
                    if self._since_release >= RELEASE_BYTES:
                        with self.phases.phase("writeback"):
                            self.target.flush()  # write back now, in the background, not all at the final fsync
                        release_pages(self.target)
                        self._since_release = 0
            except BaseException as error:  # reported to the caller at its next submit/drain
                self.error = error
            finally:
                if item is not None:
                    with self._lock:
                        self.in_flight -= 1
                self.queue.task_done()

    def assign(self, start: int, bits: np.ndarray) -> None:
        """Copy one batch into the map (a separate method so tests can slow it down)."""
        self.target[start : start + len(bits)] = bits

    def drain(self) -> None:
        """Wait until every submitted batch has landed."""
        with self.phases.phase("writer_drain_wait"):
            self.queue.join()
        self._raise()

    def close(self) -> None:
        """Drain, stop the thread, and flush the map to the file."""
        self.drain()
        self.queue.put(None)
        self.thread.join()
        if isinstance(self.target, np.memmap):
            self.target.flush()
            release_pages(self.target)

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error


def cache_split(
    model: backbone.IQPatchTransformer,
    source: Path,
    target: np.memmap,
    controller: batching.AdaptiveBatch,
    phases: PhaseTimes,
    tracer: BatchTracer,
    progress: Progress,
    device: torch.device,
) -> dict[str, int]:
    """Backbone over one split into the map; returns the adaptive-batch stats."""
    writer = BackgroundWriter(target, phases)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    with h5py.File(source, "r") as handle:
        iq = handle["iq"]

        def step(start: int, stop: int) -> None:
            with phases.phase("source_read"):
                batch = iq[start:stop]
            with phases.phase("input_prep"):
                inputs = torch.from_numpy(batch).to(device, non_blocking=True)
            with phases.phase("backbone"), torch.no_grad(), autocast:
                hidden = model(inputs)
            with phases.phase("staging"):
                bits = to_bf16_bits(hidden)  # on CUDA this waits for the device-to-host copy
            with phases.phase("cache_store"):
                writer.submit(start, bits)
            tracer.step()
            progress.update(stop - start)

        before = dict(controller.stats)
        try:
            stats = batching.run_adaptive(len(iq), controller, step)
        finally:
            writer.close()
    stats = {key: value - before[key] for key, value in stats.items()}
    stats["max_in_flight"] = writer.max_in_flight
    return stats


class CacheSplit:
    """Read side of one cached split: batched gathers of FP32 hidden states."""

    def __init__(self, cache_dir: Path, split: str, meta: dict[str, Any]):
        self.shape = tuple(meta["shapes"][split])
        self.hidden = np.memmap(cache_dir / hidden_file(split), dtype=np.uint16, mode="r", shape=self.shape)
        self.labels = np.load(cache_dir / f"{split}.labels.npy")
        self.snr_db = np.load(cache_dir / f"{split}.snr.npy")
        self.row_bytes = int(np.prod(self.shape[1:])) * 2
        self.release_each_batch = self.shape[0] * self.row_bytes > RELEASE_READS_ABOVE

    def __len__(self) -> int:
        return self.shape[0]

    def gather(self, rows: np.ndarray, phases: PhaseTimes | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """FP32 hidden states and labels for the given rows (read in sorted order)."""
        rows = np.sort(rows)
        started = time.perf_counter()
        bits = self.hidden[rows]
        if phases is not None:
            phases.add("memmap_read", time.perf_counter() - started)
        if self.release_each_batch:
            release_pages(self.hidden)
        return from_bf16_bits(bits), torch.from_numpy(self.labels[rows])


def prefetched(
    split: CacheSplit, batches: list[np.ndarray], device: torch.device, phases: PhaseTimes
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield batches on `device`, gathering the next one on a background thread meanwhile."""
    pin = device.type == "cuda"
    ready: queue.Queue = queue.Queue(maxsize=1)

    def produce() -> None:
        try:
            for rows in batches:
                hidden, labels = split.gather(rows, phases)
                if pin:
                    hidden, labels = hidden.pin_memory(), labels.pin_memory()
                ready.put((hidden, labels))
        except BaseException as error:
            ready.put(error)
            return
        ready.put(None)

    worker = threading.Thread(target=produce, name="cache-prefetch", daemon=True)
    worker.start()
    while True:
        with phases.phase("prefetch_wait"):
            item = ready.get()
        if item is None:
            break
        if isinstance(item, BaseException):
            raise item
        hidden, labels = item
        if pin:
            with phases.phase("copy_wait"):
                hidden, labels = hidden.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        yield hidden, labels
    worker.join()


def open_cache(cache_dir: str | Path, consumer: str) -> tuple[dict[str, CacheSplit], dict[str, Any]]:
    """Check a cache against its sentinel and open its splits for reading."""
    cache_dir = Path(cache_dir)
    sentinel = require_intact(cache_dir / SENTINEL_NAME, cache_files(), consumer)
    meta = read_json(cache_dir / "meta.json")
    if meta["backbone_fingerprint"] != sentinel["backbone_fingerprint"]:
        raise IntegrityError(f"{cache_dir}/meta.json: backbone fingerprint disagrees with the sentinel")
    return {split: CacheSplit(cache_dir, split, meta) for split in CACHED_SPLITS}, meta
