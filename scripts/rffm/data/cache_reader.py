"""Reading a hidden-state cache: every byte checked against its sentinel when opened, then whole batches gathered
from the map with sorted row indices, restored to FP32, one batch prefetched ahead by a background thread (into
pinned memory with non-blocking copies on CUDA). Epochs never reopen signal records and never construct the backbone.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rffm.data.cache_format import SENTINEL_LABEL, cache_problems, from_bf16_bits, release_pages
from rffm.errors import IntegrityError
from rffm.records.files import read_json
from rffm.records.layout import CACHE_META, CACHED_SPLITS, SENTINEL_NAME, hidden_file
from rffm.records.seal import unseal
from rffm.runtime.profiling import PhaseTimes

if TYPE_CHECKING:
    import torch

# Reader: a fault on a file mapping maps the whole page-cache folio around it (measured here:
# ~500 KiB per scattered 2 KiB row on ext4 with large folios), so mapped pages are dropped after
# every gathered batch of a file larger than this; smaller caches stay mapped.
RELEASE_READS_ABOVE = 32 << 20


class CacheSplit:
    """Read side of one cached split: batched gathers of FP32 hidden states."""

    def __init__(self, cache_dir: Path, split: str, meta: dict[str, Any]):
        self.shape = tuple(meta["shapes"][split])
        self.hidden = np.memmap(cache_dir / hidden_file(split), dtype=np.uint16, mode="r", shape=self.shape)
        self.labels = np.load(cache_dir / f"{split}.labels.npy")
        self.snr_db = np.load(cache_dir / f"{split}.snr.npy")
        self.row_bytes = int(np.prod(self.shape[1:])) * 2
        self.release_each_batch = self.shape[0] * self.row_bytes > RELEASE_READS_ABOVE
        self.bytes_copied = 0  # bytes gathered out of the map so far (provenance details only: rffm bench sweep reads it)

    def __len__(self) -> int:
        return self.shape[0]

    def gather(self, rows: np.ndarray, phases: PhaseTimes | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """FP32 hidden states and labels for the given rows (read in sorted order)."""
        import torch  # here: checking a cache (open_cache, for rffm verify) needs no torch

        rows = np.sort(rows)
        started = time.perf_counter()
        bits = self.hidden[rows]
        self.bytes_copied += bits.nbytes
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


def open_cache(directory: Path, recipe_digest: str, consumer: str) -> tuple[dict[str, CacheSplit], dict[str, Any]]:
    """Check every byte of a cache against its sentinel (and its recipe) and open its splits for reading."""
    sentinel = directory / SENTINEL_NAME
    if not sentinel.exists():
        raise IntegrityError(f"{consumer} refuses to start: {sentinel} is missing: {directory} holds no cache. Fix: rerun snakemake.")
    try:
        body = unseal(sentinel, sentinel.read_bytes(), SENTINEL_LABEL)
    except IntegrityError as error:
        raise IntegrityError(f"{consumer} refuses to start: {error}") from None  # deleting it has the cache built again
    if body.get("recipe") != recipe_digest:
        raise IntegrityError(
            f"{consumer} refuses to start: {sentinel}: a cache of another recipe (another dataset, backbone or build code). "
            "Fix: rerun snakemake; the epoch that needs it builds it again."
        )
    problems = cache_problems(directory, body)
    if problems:
        raise IntegrityError(
            f"{consumer} refuses to start: {problems[0]} (the hidden-state cache was changed after it was built). "
            f"Fix: delete {directory}; the next run builds it again."
        )
    meta = read_json(directory / CACHE_META)
    return {split: CacheSplit(directory, split, meta) for split in CACHED_SPLITS}, meta
