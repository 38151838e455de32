"""Building a hidden-state cache: the frozen backbone over train and val into preallocated memory maps.

Files are preallocated at their exact size (fallocate, so a full disk fails up front, not as SIGBUS
mid-write); the backbone runs in the caller in adaptive batches while a background writer assigns
finished batches into the map through a bounded queue (backpressure, bounded RAM), hashes them in file
order (xxh3-128 of every byte, with no second read) and periodically drops written pages from this
process's page tables. The split boundary waits for outstanding writes. The directory is sealed last.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import xxhash

from rffm.data.cache_format import preallocate, release_pages, split_count, to_bf16_bits
from rffm.data.cache_plan import cache_meta
from rffm.model import encoder as encoders
from rffm.records.files import atomic_write_bytes, atomic_write_json
from rffm.records.layout import BACKBONE_NAME, CACHE_META, CACHED_SPLITS, SENTINEL_NAME, hidden_file, split_file
from rffm.records.seal import seal
from rffm.records.sentinel import file_record, parts_record
from rffm.runtime import batching
from rffm.runtime.profiling import BatchTracer, PhaseTimes
from rffm.runtime.progress import Progress

QUEUE_DEPTH = 4
RELEASE_BYTES = 32 << 20  # writer: drop written pages from RSS after this many bytes


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
        self.digest = xxhash.xxh3_128()  # of every byte of the file, in file order (batches arrive in order)
        self._next_row = 0
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
                    if start != self._next_row:
                        raise RuntimeError(f"cache writer: rows from {start} arrived, expected {self._next_row}")
                    with self.phases.phase("memmap_assign"):
                        self.assign(start, bits)
                    with self.phases.phase("hash"):
                        self.digest.update(np.ascontiguousarray(bits))
                    self._next_row = start + len(bits)
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
    model: encoders.Encoder,
    source: Path,
    target: np.memmap,
    controller: batching.AdaptiveBatch,
    phases: PhaseTimes,
    tracer: BatchTracer,
    progress: Progress,
    device: torch.device,
) -> tuple[dict[str, int], bytes]:
    """Backbone over one split into the map; returns the adaptive-batch stats and the file's xxh3-128 digest."""
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
                hidden = encoders.as_row(model.features(inputs))
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
    return stats, writer.digest.digest()


def build(
    dataset_dir: Path,
    backbone_dir: Path,
    directory: Path,
    recipe_digest: str,
    record: dict[str, Any],
    *,
    batch_size: int,
    batch_profile: str | Path | None,
    device: torch.device,
    phases: PhaseTimes,
    trace_path: Path | None = None,
    profile_batches: int = 0,
) -> dict[str, Any]:
    """Run the frozen backbone over train and val into `directory` and seal it with its cache sentinel; the build's stats."""
    model = encoders.load(record["backbone"], backbone_dir / BACKBONE_NAME, record["encoder"]["spec"], record["encoder"]["where"], device)
    classes, shapes = record["cache"]["classes"], record["cache"]["shapes"]
    counts = {split: split_count(dataset_dir / split_file(split)) for split in CACHED_SPLITS}
    length = record["cache"]["input_length"]
    profile = batching.BatchProfile(batch_profile)
    key = batching.profile_key(model.identity, (2, length), "float32", batching.device_context(device))
    controller = batching.AdaptiveBatch(maximum=batch_size)
    seeded = profile.seed(key, controller)
    tracer = BatchTracer(trace_path, profile_batches, phases)
    progress = Progress("build_cache", total=sum(counts.values()), unit="example")
    outputs: dict[str, Any] = {}
    stats = {}
    for split in CACHED_SPLITS:
        path = directory / hidden_file(split)
        with phases.phase("preallocation"):
            target = preallocate(path, (counts[split], *shapes[split][1:]))
        stats[split], digest = cache_split(model, dataset_dir / split_file(split), target, controller, phases, tracer, progress, device)
        with phases.phase("fsync"):
            del target
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        outputs[hidden_file(split)] = parts_record(path, [], known={0: digest})
        with h5py.File(dataset_dir / split_file(split), "r") as handle:
            np.save(directory / f"{split}.labels.npy", handle["label"][()])
            np.save(directory / f"{split}.snr.npy", handle["snr_db"][()])
        for name in (f"{split}.labels.npy", f"{split}.snr.npy"):
            outputs[name] = file_record(directory / name)
    tracer.close()
    progress.close()
    if controller.largest_good:
        profile.remember(key, controller, controller.largest_good, {"input_shape": [2, length], **batching.device_context(device)})
    # taps: (name, tokens, dim) per tap: the head splits flat rows [F] by them
    meta = cache_meta(
        model.fingerprint, classes, {split: [counts[split], *shapes[split][1:]] for split in CACHED_SPLITS}, record["cache"]["taps"]
    )
    atomic_write_json(directory / CACHE_META, meta)
    outputs[CACHE_META] = file_record(directory / CACHE_META)
    atomic_write_bytes(directory / SENTINEL_NAME, seal({"stage": "build_cache", "recipe": recipe_digest, "outputs": outputs}))
    return {"batch_size_max": batch_size, "batch_stats": stats, "profile_seeded": seeded, "meta": meta}
