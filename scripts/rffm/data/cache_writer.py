"""Building a hidden-state cache: the frozen backbone over train and val into preallocated memory maps.

Files are preallocated at their exact size (fallocate, so a full disk fails up front, not as SIGBUS
mid-write); the backbone runs in the caller in adaptive batches while a background writer assigns
finished batches into the map through a bounded queue (backpressure, bounded RAM), hashes them in file
order (xxh3-128 of every byte, with no second read) and periodically drops written pages from this
process's page tables. The split boundary waits for outstanding writes. The directory is sealed last.

On a node with several devices (`devices`: ["cuda:0", "cuda:1", ...]; on CPU "cpu" stand-ins) the build is
data-parallel: one spawned worker process per device computes a disjoint contiguous row range of each split
(cut at multiples of the batch size, so that each worker's batches are the one-process build's) into the same
preallocated files, whose rows are fixed-size, so the ranges are disjoint byte ranges. The parent hashes each
finished range in file order (xxh3 is not mergeable across ranges: one extra read of the hidden files, from the
page cache, overlapping the workers' next split), then writes labels, meta.json and the sentinel exactly as the
one-process build does: the same bytes. A worker that dies (a kill, the out-of-memory killer) or fails stops the
build with one line before anything is sealed; the caller's temporary directory is then dropped (cache_local).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import xxhash

from rffm.data.cache_format import preallocate, release_pages, split_count, to_bf16_bits
from rffm.data.cache_plan import cache_meta
from rffm.errors import RffmError
from rffm.model import encoder as encoders
from rffm.records.files import atomic_write_bytes, atomic_write_json, fsync_path
from rffm.records.layout import BACKBONE_NAME, CACHE_META, CACHED_SPLITS, SENTINEL_NAME, hidden_file, split_file
from rffm.records.seal import seal
from rffm.records.sentinel import file_record, parts_record
from rffm.runtime import batching
from rffm.runtime.profiling import BatchTracer, PhaseTimes
from rffm.runtime.progress import Progress

QUEUE_DEPTH = 4
RELEASE_BYTES = 32 << 20  # writer: drop written pages from RSS after this many bytes
HASH_CHUNK = 8 << 20  # parent of a multi-device build: bytes read at a time while hashing finished ranges
KILL_ENV = "RFFM_INJECT_WORKER_KILL"  # testing hook, "<worker>:<rows>": that worker SIGKILLs itself after that many rows


class CacheBuildError(RffmError):
    """A worker of a multi-device cache build died or failed; nothing of the build was sealed."""


class BackgroundWriter:
    """Assigns (row, bits) batches into a memory map on a background thread, through a bounded queue."""

    def __init__(self, target: np.memmap, phases: PhaseTimes, depth: int = QUEUE_DEPTH, hashing: bool = True):
        self.target, self.phases, self.depth = target, phases, depth
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.in_flight = 0  # batches submitted and not yet assigned (bounded by depth + 1)
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._since_release = 0
        self.digest = xxhash.xxh3_128()  # of every byte of the file, in file order (batches arrive in order)
        self.hashing = hashing  # off in the workers of a multi-device build: their parent hashes the whole file
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
                    if self.hashing:
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
    rows: tuple[int, int] | None = None,
) -> tuple[dict[str, int], bytes]:
    """Backbone over one split (or its `rows` [first, stop) only) into the map; returns the adaptive-batch stats and the
    xxh3-128 digest of the bytes written (the whole file's when all rows are)."""
    first, stop_row = rows if rows is not None else (0, len(target))
    writer = BackgroundWriter(target[first:stop_row] if rows is not None else target, phases, hashing=rows is None)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    with h5py.File(source, "r") as handle:
        iq = handle["iq"]

        def step(start: int, stop: int) -> None:
            with phases.phase("source_read"):
                batch = iq[first + start : first + stop]
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
            stats = batching.run_adaptive(stop_row - first, controller, step)
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
    devices: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run the frozen backbone over train and val into `directory` and seal it with its cache sentinel; the build's stats.

    Two or more `devices` make the build data-parallel, one worker process per device (build_parallel), with the same
    bytes; one device (or none: `device`) is the one-process build."""
    if devices is not None and len(devices) > 1:
        options = {"batch_size": batch_size, "batch_profile": batch_profile, "trace_path": trace_path, "profile_batches": profile_batches}
        return build_parallel(dataset_dir, backbone_dir, directory, recipe_digest, record, devices=devices, phases=phases, **options)
    if devices:
        device = torch.device(devices[0])
    model = encoders.load(record["backbone"], backbone_dir / BACKBONE_NAME, record["encoder"]["spec"], record["encoder"]["where"], device)
    shapes = record["cache"]["shapes"]
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
            fsync_path(path)
        split_outputs(dataset_dir, directory, split, digest, outputs)
    tracer.close()
    progress.close()
    if controller.largest_good:
        profile.remember(key, controller, controller.largest_good, {"input_shape": [2, length], **batching.device_context(device)})
    meta = seal_cache(directory, recipe_digest, record, model.fingerprint, counts, outputs)
    return {"batch_size_max": batch_size, "batch_stats": stats, "profile_seeded": seeded, "meta": meta}


def split_outputs(dataset_dir: Path, directory: Path, split: str, digest: bytes, outputs: dict[str, Any]) -> None:
    """Record a split's hidden file (from its xxh3-128 digest) and write and record its labels and SNRs."""
    outputs[hidden_file(split)] = parts_record(directory / hidden_file(split), [], known={0: digest})
    with h5py.File(dataset_dir / split_file(split), "r") as handle:
        np.save(directory / f"{split}.labels.npy", handle["label"][()])
        np.save(directory / f"{split}.snr.npy", handle["snr_db"][()])
    for name in (f"{split}.labels.npy", f"{split}.snr.npy"):
        outputs[name] = file_record(directory / name)


def seal_cache(
    directory: Path, recipe_digest: str, record: dict[str, Any], fingerprint: str, counts: dict[str, int], outputs: dict[str, Any]
) -> dict[str, Any]:
    """Write meta.json and, last, the sealed sentinel that marks the directory a complete cache; the meta."""
    shapes = record["cache"]["shapes"]
    # the tap layout (the record's `taps`: name, tokens, dim per tap): the head splits flat rows [F] by it
    meta = cache_meta(
        fingerprint,
        record["cache"]["classes"],
        {split: [counts[split], *shapes[split][1:]] for split in CACHED_SPLITS},
        record["cache"]["taps"],
    )
    atomic_write_json(directory / CACHE_META, meta)
    outputs[CACHE_META] = file_record(directory / CACHE_META)
    atomic_write_bytes(directory / SENTINEL_NAME, seal({"stage": "build_cache", "recipe": recipe_digest, "outputs": outputs}))
    return meta


# ---- the multi-device build ----


def worker_rows(count: int, workers: int, align: int) -> list[tuple[int, int]]:
    """Disjoint contiguous [first, stop) row ranges of a split, one per worker, in order, cut at multiples of `align`."""
    chunk = -(-count // workers)
    chunk = -(-chunk // align) * align
    return [(min(index * chunk, count), min((index + 1) * chunk, count)) for index in range(workers)]


def preallocate_all(directory: Path, record: dict[str, Any], counts: dict[str, int], phases: PhaseTimes) -> tuple[dict, dict]:
    """Every split's hidden file at its full size, for the workers to map: ({split: row shape}, {split: path})."""
    rows = {split: (counts[split], *record["cache"]["shapes"][split][1:]) for split in CACHED_SPLITS}
    paths = {split: directory / hidden_file(split) for split in CACHED_SPLITS}
    for split in CACHED_SPLITS:
        with phases.phase("preallocation"):
            target = preallocate(paths[split], rows[split])
        del target  # the workers map the file themselves
    return rows, paths


def start_workers(devices: Sequence[str], threads: int, job: dict[str, Any]) -> list[tuple[Any, Connection]]:
    """One spawned worker per device, each with the pipe it reports on (a CPU worker keeps `threads`: the same sums)."""
    context = multiprocessing.get_context("spawn")
    workers = []
    for index, name in enumerate(devices):
        receiver, sender = context.Pipe(duplex=False)
        worker_threads = threads if torch.device(name).type == "cpu" else max(1, threads // len(devices))
        process = context.Process(
            target=work, args=(index, name, worker_threads, sender, job), name=f"rffm-cache-worker-{index}", daemon=True
        )
        process.start()
        sender.close()
        workers.append((process, receiver))
    return workers


def build_parallel(
    dataset_dir: Path,
    backbone_dir: Path,
    directory: Path,
    recipe_digest: str,
    record: dict[str, Any],
    *,
    devices: Sequence[str],
    batch_size: int,
    batch_profile: str | Path | None,
    phases: PhaseTimes,
    trace_path: Path | None = None,
    profile_batches: int = 0,
) -> dict[str, Any]:
    """build() over several devices: one spawned worker per device, each its row range of every split; the same files."""
    counts = {split: split_count(dataset_dir / split_file(split)) for split in CACHED_SPLITS}
    rows, paths = preallocate_all(directory, record, counts, phases)
    threads = torch.get_num_threads()  # a CPU worker keeps the one-process build's threads (its sums, its bits)
    job = {
        "dataset_dir": dataset_dir,
        "backbone_dir": backbone_dir,
        "record": record,
        "paths": paths,
        "rows": rows,
        "ranges": {split: worker_rows(counts[split], len(devices), batch_size) for split in CACHED_SPLITS},
        "batch_size": batch_size,
        "batch_profile": batch_profile,
        "trace_path": trace_path,
        "profile_batches": profile_batches,
    }
    workers: list[tuple[Any, Connection]] = []
    progress = Progress("build_cache", total=sum(counts.values()), unit="example")
    try:
        workers += start_workers(devices, threads, job)
        supervisor = Supervisor(directory, devices, workers, job, phases, progress)
        reports = supervisor.run()
    finally:
        progress.close()
        for process, receiver in workers:
            if process.is_alive():
                process.kill()
            process.join()
            receiver.close()
    outputs: dict[str, Any] = {}
    for split in CACHED_SPLITS:
        with phases.phase("fsync"):
            fsync_path(paths[split])
        split_outputs(dataset_dir, directory, split, supervisor.digests[split].digest(), outputs)
    for report in reports:
        phases.merge(report["phases"])
    meta = seal_cache(directory, recipe_digest, record, supervisor.fingerprint, counts, outputs)
    return {
        "batch_size_max": batch_size,
        "batch_stats": supervisor.batch_stats(),
        "profile_seeded": reports[0]["seeded"],
        "meta": meta,
        "devices": list(devices),
    }


class Supervisor:
    """The parent's side of a multi-device build: relays progress, hashes finished ranges in file order, and stops at the
    first worker that fails or dies."""

    def __init__(
        self, directory: Path, devices: Sequence[str], workers: list[tuple[Any, Connection]], job: dict[str, Any], phases, progress
    ):
        self.directory, self.devices, self.workers, self.job, self.phases, self.progress = (
            directory,
            devices,
            workers,
            job,
            phases,
            progress,
        )
        self.digests = {split: xxhash.xxh3_128() for split in CACHED_SPLITS}
        self.finished: dict[str, dict[int, dict[str, int]]] = {split: {} for split in CACHED_SPLITS}  # worker -> its batch stats
        self.hashed = dict.fromkeys(CACHED_SPLITS, 0)  # ranges hashed so far, in worker order
        self.identities: dict[int, tuple[str, str]] = {}
        self.fingerprint = ""

    def run(self) -> list[dict[str, Any]]:
        """Wait for every worker's report; the reports in worker order."""
        reports: dict[int, dict[str, Any]] = {}
        while len(reports) < len(self.workers):
            waiting = [index for index in range(len(self.workers)) if index not in reports]
            wait([self.workers[i][1] for i in waiting] + [self.workers[i][0].sentinel for i in waiting], timeout=1.0)
            for index in waiting:
                report = self.read(index)
                if report is not None:
                    reports[index] = report
            self.hash_finished()
        if any(self.hashed[split] < len(self.workers) for split in CACHED_SPLITS) or len(set(self.identities.values())) != 1:
            raise CacheBuildError(
                f"{self.directory}: the cache build workers did not all report every split of one backbone. Fix: rerun snakemake."
            )
        self.fingerprint = self.identities[0][0]
        return [reports[index] for index in range(len(self.workers))]

    def read(self, index: int) -> dict[str, Any] | None:
        """Take a worker's pending messages; its final report once it has sent it."""
        process, receiver = self.workers[index]
        while True:
            try:
                if not receiver.poll():
                    if process.exitcode is None:
                        return None
                    if receiver.poll():  # it wrote before it exited
                        continue
                    raise CacheBuildError(self.died(index))  # gone without its report
                message = receiver.recv()
            except (EOFError, OSError):  # its end closed: it exited or died; its exit says which
                process.join(timeout=10)
                raise CacheBuildError(self.died(index)) from None
            kind = message[0]
            if kind == "rows":
                self.progress.update(message[1])
            elif kind == "ready":
                self.identities[index] = (message[1], message[2])
            elif kind == "split":
                self.finished[message[1]][index] = message[2]
            elif kind == "error":
                raise self.failed(index, message[1], message[2])
            elif kind == "done":
                return message[1]

    def hash_finished(self) -> None:
        """Hash, in file order, every range whose worker has finished it (xxh3 of the whole file, range after range)."""
        for split in CACHED_SPLITS:
            path, row_bytes = self.job["paths"][split], 2 * int(np.prod(self.job["rows"][split][1:]))
            while self.hashed[split] < len(self.workers) and self.hashed[split] in self.finished[split]:
                first, stop = self.job["ranges"][split][self.hashed[split]]
                with self.phases.phase("hash"), open(path, "rb", buffering=0) as handle:
                    handle.seek(first * row_bytes)
                    left = (stop - first) * row_bytes
                    while left:
                        chunk = handle.read(min(left, HASH_CHUNK))
                        if not chunk:
                            raise CacheBuildError(f"{path}: ended {left} bytes early while hashing. Fix: rerun snakemake.")
                        self.digests[split].update(chunk)
                        left -= len(chunk)
                self.hashed[split] += 1

    def where(self, index: int) -> str:
        """The worker, its device and the rows it had not finished."""
        busy = next((split for split in CACHED_SPLITS if index not in self.finished[split]), None)
        rows = f", rows {self.job['ranges'][busy][index][0]}..{self.job['ranges'][busy][index][1]} of {busy}" if busy else ""
        return f"cache build worker {index} ({self.devices[index]}{rows})"

    def died(self, index: int) -> str:
        code = self.workers[index][0].exitcode
        how = "did not exit" if code is None else f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return (
            f"{self.directory}: {self.where(index)} died ({how}) before it finished; nothing of this build was sealed. "
            "Fix: rerun snakemake (the cache is built again from the start); if a worker dies again, look for the "
            "out-of-memory killer in the node's log (dmesg) or list fewer devices."
        )

    def failed(self, index: int, error: BaseException | None, text: str) -> BaseException:
        """A worker's own error, raised here: an rffm error as it is (its message says the fix), any other with its traceback."""
        if error is None:
            return CacheBuildError(f"{self.directory}: {self.where(index)} failed: {text.strip().splitlines()[-1]}. Fix: rerun snakemake.")
        if not isinstance(error, RffmError):
            error.add_note(f"in {self.where(index)}:\n{text}")
        return error

    def batch_stats(self) -> dict[str, dict[str, int]]:
        """The workers' adaptive-batch stats of each split, summed (max_in_flight: the largest)."""
        merged: dict[str, dict[str, int]] = {}
        for split, reports in self.finished.items():
            merged[split] = {}
            for stats in reports.values():
                for name, value in stats.items():
                    merged[split][name] = (
                        max(merged[split].get(name, 0), value) if name == "max_in_flight" else merged[split].get(name, 0) + value
                    )
        return merged


class Relay:
    """A worker's stand-in for Progress: sends finished rows to the parent; stops the worker when its parent is gone."""

    def __init__(self, sender: Connection, parent: int, kill_after: int | None):
        self.sender, self.parent, self.kill_after, self.rows = sender, parent, kill_after, 0

    def update(self, count: int = 1, **postfix: str) -> None:
        if os.getppid() != self.parent:  # orphaned: nobody is left to seal these rows
            os._exit(1)
        self.rows += count
        self.sender.send(("rows", count))
        if self.kill_after is not None and self.rows >= self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)


def injected_kill(index: int) -> int | None:
    """Rows after which this worker kills itself (testing hook, RFFM_INJECT_WORKER_KILL=<worker>:<rows>)."""
    worker, _, rows = os.environ.get(KILL_ENV, "").partition(":")
    return int(rows) if worker and int(worker) == index else None


def work(index: int, device_name: str, threads: int, sender: Connection, job: dict[str, Any]) -> None:
    """One worker of a multi-device build (a spawned process): its rows of every split into the shared files."""
    from rffm.runtime.device import resolve, setup

    parent = os.getppid()
    try:
        setup(threads)
        device = torch.device(resolve(device_name))  # a GPU this process cannot see: one line, not a CUDA traceback
        if device.type == "cuda":
            torch.cuda.set_device(device)
        record = job["record"]
        model = encoders.load(
            record["backbone"], job["backbone_dir"] / BACKBONE_NAME, record["encoder"]["spec"], record["encoder"]["where"], device
        )
        sender.send(("ready", model.fingerprint, model.identity))
        length = record["cache"]["input_length"]
        profile = batching.BatchProfile(job["batch_profile"])
        key = batching.profile_key(model.identity, (2, length), "float32", batching.device_context(device))
        controller = batching.AdaptiveBatch(maximum=job["batch_size"])
        seeded = profile.seed(key, controller)
        phases = PhaseTimes()
        tracer = BatchTracer(job["trace_path"] if index == 0 else None, job["profile_batches"], phases)
        relay = Relay(sender, parent, injected_kill(index))
        for split in CACHED_SPLITS:
            first, stop = job["ranges"][split][index]
            stats: dict[str, int] = {}
            if stop > first:
                target = np.memmap(job["paths"][split], dtype=np.uint16, mode="r+", shape=job["rows"][split])
                source = job["dataset_dir"] / split_file(split)
                stats, _ = cache_split(model, source, target, controller, phases, tracer, relay, device, rows=(first, stop))
                del target
            sender.send(("split", split, stats))
        tracer.close()
        if controller.largest_good:
            profile.remember(key, controller, controller.largest_good, {"input_shape": [2, length], **batching.device_context(device)})
        sender.send(("done", {"phases": phases.as_dict(), "seeded": seeded}))
    except BaseException as error:
        text = traceback.format_exc()
        try:
            sender.send(("error", error, text))
        except Exception:  # an error that does not pickle: its text only
            sender.send(("error", None, text))
    finally:
        sender.close()
