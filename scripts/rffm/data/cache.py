"""The hidden-state cache: frozen-backbone outputs for train and val, BF16 in memory-mapped files.

The cache is a node-local memo, never a workflow file: `<scratch>/<dataset>__<backbone>/` holds the
files and a sealed memo sentinel naming the recipe it was built from (the digests of the dataset and
backbone sentinels and of the build code, recorded in results by build_cache). Whoever needs it and
does not find it (build_cache, or an epoch on a fresh node or VM) builds it into a temporary
directory and renames it into place, so a half-built cache is never seen; a cache of another recipe
is replaced. Readers check every byte against the memo sentinel before an epoch reads it.

Build: files are preallocated at their exact size (fallocate, so a full disk fails up front, not
as SIGBUS mid-write); the backbone runs in the caller in adaptive batches while a background
writer assigns finished batches into the map through a bounded queue (backpressure, bounded RAM),
hashes them in file order (xxh3-128 of every byte, with no second read) and periodically drops
written pages from this process's page tables. The split boundary waits for outstanding writes.

Read: whole batches are gathered from the map with sorted row indices, restored to FP32, and one
batch is prefetched ahead by a background thread (into pinned memory with non-blocking copies on
CUDA). Epochs never reopen signal records and never construct the backbone.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import queue
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import xxhash

from rffm.data.cache_plan import human_bytes, row_cache_bytes
from rffm.errors import ConfigError, IntegrityError
from rffm.model import encoder as encoders
from rffm.records.files import atomic_write_bytes, atomic_write_json, read_json, sha256_file, sha256_json
from rffm.records.layout import CACHED_SPLITS, SENTINEL_NAME, cache_files, hidden_file, split_file
from rffm.records.seal import seal, unseal
from rffm.records.sentinel import check_record, file_record, parts_record, require_intact
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


def cache_bytes(counts: dict[str, int], tokens: int, dim: int, block: int = 4096, layers: int = 1) -> int:
    """Disk space every file of a cache takes (`layers` hidden states per token), each rounded up to whole filesystem blocks."""
    return row_cache_bytes(counts, layers * tokens * dim, block)


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


# ---- the memo: build, materialize, open ----


def recipe(record: dict[str, Any]) -> str:
    """What a cache is built from, as one digest: the upstream sentinels, the build code and the encoder a build_cache record names."""
    inputs = {role: ref["sha256"] for role, ref in record["inputs"].items()}
    return sha256_json({"inputs": inputs, "code": record["code_sha256"], "encoder": record.get("encoder", {}).get("fingerprint")})


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
    """Run the frozen backbone over train and val into `directory` and seal it with its memo sentinel; the build's stats."""
    model = encoders.load(record["backbone"], backbone_dir / "backbone.pt", record["encoder"]["spec"], record["encoder"]["where"], device)
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
    meta = {
        "backbone_fingerprint": model.fingerprint,
        "classes": classes,
        "dtype": "bfloat16",
        "shapes": {split: [counts[split], *shapes[split][1:]] for split in CACHED_SPLITS},
        "taps": record["cache"]["taps"],  # (name, tokens, dim) per tap: the head splits flat rows [F] by them
    }
    atomic_write_json(directory / "meta.json", meta)
    outputs["meta.json"] = file_record(directory / "meta.json")
    atomic_write_bytes(directory / SENTINEL_NAME, seal({"stage": "build_cache", "recipe": recipe_digest, "outputs": outputs}))
    return {"batch_size_max": batch_size, "batch_stats": stats, "profile_seeded": seeded, "meta": meta}


def memo_recipe(memo_dir: Path) -> str | None:
    """The recipe a memo directory was built from, None when there is no (sealed) memo there."""
    try:
        return unseal(memo_dir / SENTINEL_NAME, (memo_dir / SENTINEL_NAME).read_bytes(), "cache memo sentinel").get("recipe")
    except (FileNotFoundError, IntegrityError):
        return None


def materialize(memo_dir: Path, recipe_digest: str, build_into) -> dict[str, Any] | None:
    """Make sure `memo_dir` holds the cache of this recipe: build it (via `build_into(directory)`) when it is
    missing or of another recipe; the build's stats, None when a ready cache was found."""
    memo_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(memo_dir.parent / f".{memo_dir.name}.lock", "a") as lock:
        try:  # one builder per node at a time; the rename below keeps concurrent builders on other nodes safe
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            pass
        if memo_recipe(memo_dir) == recipe_digest:
            return None
        building = memo_dir.parent / f".{memo_dir.name}.{socket.gethostname()}.{os.getpid()}.building"
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir()
        try:
            stats = build_into(building)
            if memo_dir.exists():  # another recipe's cache (or a damaged one): replaced
                shutil.rmtree(memo_dir)
            os.rename(building, memo_dir)
        except OSError:
            if memo_recipe(memo_dir) != recipe_digest:
                raise
            stats = None  # another node renamed the same recipe into place first
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return stats


def memo_dir(scratch: str | Path, key: dict[str, str]) -> Path:
    """Where the cache of a (dataset, backbone) lives on a node."""
    return Path(scratch) / f"{key['dataset']}__{key['backbone']}"


def ensure(
    record: dict[str, Any],
    record_dir: Path,
    scratch: str | Path,
    options: dict[str, Any],
    phases: PhaseTimes,
    trace_path: Path | None = None,
    profile_batches: int = 0,
) -> tuple[Path, dict[str, Any] | None]:
    """The memo directory of a cache record on this node, built first when it is missing; (directory, build stats or None)."""
    directory = memo_dir(scratch, record["key"])
    dataset_dir = (record_dir / record["inputs"]["dataset"]["path"]).parent
    backbone_dir = (record_dir / record["inputs"]["backbone"]["path"]).parent
    shapes = record["cache"]["shapes"]
    if options["disk_headroom"] > 0 and memo_recipe(directory) != recipe(record):
        counts = {split: shapes[split][0] for split in CACHED_SPLITS}
        needed = row_cache_bytes(counts, int(np.prod(shapes["train"][1:])))  # rows [T, D], [k, T, D] or [F]
        check_disk_budget(directory.parent, needed, options["disk_headroom"])

    def build_into(target: Path) -> dict[str, Any]:
        for role, files in (("dataset", [split_file(s) for s in CACHED_SPLITS]), ("backbone", ["backbone.pt"])):
            sentinel = record_dir / record["inputs"][role]["path"]
            require_intact(sentinel, files, "build_cache")
            if sha256_file(sentinel) != record["inputs"][role]["sha256"]:
                raise IntegrityError(f"{sentinel}: not the {role} the cache record {record_dir} names. Fix: rerun snakemake.")
        return build(
            dataset_dir,
            backbone_dir,
            target,
            recipe(record),
            record,
            batch_size=options["batch_size"],
            batch_profile=options.get("batch_profile"),
            device=torch.device(options.get("device", "cpu")),
            phases=phases,
            trace_path=trace_path,
            profile_batches=profile_batches,
        )

    return directory, materialize(directory, recipe(record), build_into)


def open_memo(directory: Path, recipe_digest: str, consumer: str) -> tuple[dict[str, CacheSplit], dict[str, Any]]:
    """Check every byte of a memo against its sentinel (and its recipe) and open its splits for reading."""
    sentinel = directory / SENTINEL_NAME
    if not sentinel.exists():
        raise IntegrityError(f"{consumer} refuses to start: {sentinel} is missing: {directory} holds no cache. Fix: rerun snakemake.")
    try:
        body = unseal(sentinel, sentinel.read_bytes(), "cache memo sentinel")
    except IntegrityError as error:
        raise IntegrityError(f"{consumer} refuses to start: {error}") from None  # deleting it has the cache built again
    if body.get("recipe") != recipe_digest:
        raise IntegrityError(
            f"{consumer} refuses to start: {sentinel}: a cache of another recipe (another dataset, backbone or build code). "
            "Fix: rerun snakemake; the epoch that needs it builds it again."
        )
    problems = memo_problems(directory, body)
    if problems:
        raise IntegrityError(
            f"{consumer} refuses to start: {problems[0]} (the hidden-state cache was changed after it was built). "
            f"Fix: delete {directory}; the next run builds it again."
        )
    meta = read_json(directory / "meta.json")
    return {split: CacheSplit(directory, split, meta) for split in CACHED_SPLITS}, meta


def memo_problems(memo_dir: Path, body: dict[str, Any]) -> list[str]:
    """Files of a memo that do not match its sentinel (every byte is read)."""
    records = body.get("outputs") if isinstance(body.get("outputs"), dict) else {}
    problems = []
    for name in cache_files():
        record = records.get(name)
        recorded = isinstance(record, dict) and "bytes" in record
        problem = check_record(memo_dir / name, record) if recorded else f"{memo_dir / name}: not recorded"
        if problem:
            problems.append(problem)
    return problems
