"""`rffm bench staging`: streaming staging against the disk's raw sequential bandwidth, and its memory.

It writes two RML2018-layout files (X float32 [N, 1024, 2] contiguous, Y one-hot [N, 24], Z [N, 1]) of
`size` and size/4 bytes into a scratch directory, then, `repeats` times, interleaved so that all
measurements share the machine's moods:
  - raw read: the large file read sequentially in 8 MiB reads;
  - raw write: as many bytes written sequentially in 8 MiB writes plus fsync;
  - raw copy: the large file copied to a new file on the same disk with staging's block size,
    read-ahead and page-cache handling (two reads in flight, source pages dropped once read,
    write-back started as each block is written and written blocks dropped once on disk, fsync at
    the end) -- no parsing, no hashing: the floor for any step that reads every byte and writes it again;
  - staging: `rffm stage_dataset` in a child process on each file (end-to-end wall time including the
    interpreter's start, peak RSS from wait4).
Each figure is the fastest of the repeats (the machine is shared: slower runs measure the neighbours).
It prints staging throughput as a fraction of the raw read bandwidth and of the raw copy, and the
large/small peak-RSS ratio. Page cache: each file is fsynced and then evicted with
posix_fadvise(POSIX_FADV_DONTNEED) before every timed read, copy and staging (no root needed; mincore
reports how much of the file stayed resident). The last line is one JSON object. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np

from rffm.bench import work_folder
from rffm.config import entry_defaults
from rffm.data.radioml import RML2018_CLASSES
from rffm.data.sources import BLOCK_BYTES
from rffm.data.splits import SETTLE_BYTES
from rffm.data.staging import READS_IN_FLIGHT
from rffm.records.files import settle, start_writeback

LENGTH = 1024
ROW_BYTES = LENGTH * 2 * 4
STRATA = len(RML2018_CLASSES) * 26  # classes x SNRs, as in the real file
READ_BYTES = 8 << 20


def generate(path: Path, rows: int, seed: int) -> int:
    """An RML2018-layout file of `rows` noise examples (all distinct), modulation-major like the real one; its size."""
    per_stratum = rows // STRATA
    rows = per_stratum * STRATA
    with h5py.File(path, "w") as handle:
        x = handle.create_dataset("X", shape=(rows, LENGTH, 2), dtype=np.float32)  # contiguous, as h5py writes it by default
        rng = np.random.default_rng(seed)
        step = max(1, (64 << 20) // ROW_BYTES)
        for start in range(0, rows, step):
            x[start : start + step] = rng.standard_normal((min(step, rows - start), LENGTH, 2), dtype=np.float32)
        stratum = np.arange(rows) // per_stratum
        handle["Y"] = np.eye(len(RML2018_CLASSES), dtype=np.int64)[stratum // 26]
        handle["Z"] = (-20 + 2 * (stratum % 26)).astype(np.int64).reshape(-1, 1)
    return evict(path)


def evict(path: Path) -> int:
    """fsync a file and drop it from the page cache; return its size."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def resident_fraction(path: Path) -> float | None:
    """Share of the file's pages in the page cache (Linux mincore), None where unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        size = path.stat().st_size
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vector = (ctypes.c_ubyte * pages)()
        with open(path, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)  # mapping touches no page
            try:
                anchor = ctypes.c_char.from_buffer(mapped)
                failed = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vector)
                del anchor
            finally:
                mapped.close()
        return None if failed else round(sum(v & 1 for v in vector) / pages, 4)
    except (OSError, AttributeError, TypeError, ValueError):
        return None


def raw_read(path: Path) -> float:
    """Seconds to read the whole file sequentially from disk (evicted first)."""
    evict(path)
    buffer = bytearray(READ_BYTES)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(buffer):
            pass
    return time.perf_counter() - started


def raw_write(path: Path, size: int) -> float:
    """Seconds to write `size` bytes sequentially and fsync them (staging writes as much as it reads)."""
    block = np.random.default_rng(0).bytes(READ_BYTES)
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as handle:
        for _ in range(size // READ_BYTES):
            handle.write(block)
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def raw_copy(path: Path, target: Path) -> float:
    """Seconds to copy the file (evicted first) to `target` and fsync it, with staging's block size, read-ahead and page-cache handling."""
    evict(path)
    size = path.stat().st_size
    started = time.perf_counter()
    source, settled = os.open(path, os.O_RDONLY), 0
    try:
        with open(target, "wb", buffering=0) as sink, ThreadPoolExecutor(READS_IN_FLIGHT) as reader:
            reads = deque(reader.submit(os.pread, source, BLOCK_BYTES, offset) for offset in range(0, size, BLOCK_BYTES)[:READS_IN_FLIGHT])
            for offset in range(0, size, BLOCK_BYTES):
                block = reads.popleft().result()
                if offset + READS_IN_FLIGHT * BLOCK_BYTES < size:
                    reads.append(reader.submit(os.pread, source, BLOCK_BYTES, offset + READS_IN_FLIGHT * BLOCK_BYTES))
                os.posix_fadvise(source, offset, len(block), os.POSIX_FADV_DONTNEED)
                sink.write(block)
                start_writeback(sink.fileno(), offset, len(block))
                if offset - settled >= SETTLE_BYTES:
                    settle(sink.fileno(), settled, offset - settled)
                    settled = offset
            os.fsync(sink.fileno())
    finally:
        os.close(source)
    seconds = time.perf_counter() - started
    target.unlink()
    return seconds


def stage(source: Path, out_dir: Path, log: Path) -> tuple[float, float, int]:
    """Run `rffm stage_dataset` on a file in a child process: (wall seconds, CPU seconds, peak RSS bytes)."""
    spec = entry_defaults("datasets", {"name": "bench", "source": "radioml2018", "seed": 0, "radioml2018": {"path": str(source)}})
    shutil.rmtree(out_dir, ignore_errors=True)
    evict(source)
    with open(log, "a") as output:
        started = time.perf_counter()
        command = [sys.executable, "-m", "rffm", "stage_dataset", "--spec", json.dumps(spec), "--out-dir", str(out_dir)]
        child = subprocess.Popen(command, stdout=output, stderr=output)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    shutil.rmtree(out_dir, ignore_errors=True)
    if child.returncode:
        raise RuntimeError(f"rffm stage_dataset failed ({child.returncode}); see {log}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def rates(size: int, runs: list[float]) -> str:
    """'a, b, c MB/s (fastest F MB/s)' for timed runs over `size` bytes."""
    listed = ", ".join(f"{size / s / 1e6:.0f}" for s in runs)
    return f"{listed} MB/s (fastest {size / min(runs) / 1e6:.0f} MB/s)"


def run(work_dir: Path, size_bytes: int, repeats: int = 3, report=print) -> dict:
    """Generate, measure and stage; return the results.

    Longer than 60 lines on purpose: one measurement protocol read top to bottom, each figure next to what it timed."""
    # at least 5 rows per (class, SNR) in the small file, so each split gets every class
    large_rows = max(20 * STRATA, size_bytes // ROW_BYTES // (4 * STRATA) * (4 * STRATA))
    small_rows = large_rows // 4
    files = {"small": work_dir / "small.hdf5", "large": work_dir / "large.hdf5"}
    sizes = {}
    for name, rows in (("small", small_rows), ("large", large_rows)):
        started = time.perf_counter()
        sizes[name] = generate(files[name], rows, seed=len(name))
        report(f"generated {files[name]}: {rows} rows, {sizes[name] / 1e9:.3f} GB in {time.perf_counter() - started:.1f} s")
    resident = resident_fraction(files["large"])
    written = sizes["large"] // READ_BYTES * READ_BYTES
    reads, writes, copies = [], [], []
    staged: dict[str, list[tuple[float, float, int]]] = {"small": [], "large": []}
    for repeat in range(repeats):
        reads.append(raw_read(files["large"]))
        writes.append(raw_write(work_dir / "write-probe.bin", written))
        copies.append(raw_copy(files["large"], work_dir / "copy-probe.bin"))
        for name in ("small", "large"):
            staged[name].append(stage(files[name], work_dir / f"staged-{name}", work_dir / "stage.log"))
        report(f"repeat {repeat + 1}/{repeats}: staged large in {staged['large'][-1][0]:.2f} s, copied it in {copies[-1]:.2f} s")
    raw, raw_w, copy = sizes["large"] / min(reads), written / min(writes), sizes["large"] / min(copies)
    report(f"raw sequential read: {rates(sizes['large'], reads)}")
    report(f"raw sequential write + fsync: {rates(written, writes)}")
    report(f"raw copy on the same disk (read + write + fsync): {rates(sizes['large'], copies)}")
    results = {}
    for name in ("small", "large"):
        seconds, cpu, _ = min(staged[name])
        rss = max(run[2] for run in staged[name])
        results[name] = {
            "bytes": sizes[name],
            "seconds": round(seconds, 3),
            "runs_s": [round(run[0], 3) for run in staged[name]],
            "cpu_seconds": round(cpu, 3),
            "mb_per_s": round(sizes[name] / seconds / 1e6, 1),
            "peak_rss_mb": round(rss / 1e6, 1),
        }
        report(
            f"staged {name}: {sizes[name] / 1e9:.3f} GB, {rates(sizes[name], [run[0] for run in staged[name]])}; "
            f"fastest used {cpu:.1f} CPU s; peak RSS {rss / 1e6:.0f} MB"
        )
    throughput = results["large"]["mb_per_s"] * 1e6
    fraction, of_copy, ratio = throughput / raw, throughput / copy, results["large"]["peak_rss_mb"] / results["small"]["peak_rss_mb"]
    report(f"throughput / raw read bandwidth = {fraction:.2f} (target >= 0.5)")
    report(f"raw copy / raw read bandwidth = {copy / raw:.2f}: the most any step that writes what it reads can reach here")
    report(f"throughput / raw copy on the same disk = {of_copy:.2f} (1.0 = as fast as copying the bytes, the physical limit here)")
    report(f"peak RSS large/small (4x the data) = {ratio:.2f} (target <= 1.2)")
    cpu_per_gb = results["large"]["cpu_seconds"] / (sizes["large"] / 1e9)
    ceiling = sizes["large"] / (results["large"]["cpu_seconds"] / (os.cpu_count() or 1))
    report(f"staging CPU: {cpu_per_gb:.2f} s per GB; with all {os.cpu_count()} cores free it could not exceed {ceiling / 1e6:.0f} MB/s")
    return {
        "benchmark": "staging",
        "repeats": repeats,
        "raw_read_mb_per_s": round(raw / 1e6, 1),
        "raw_read_runs_s": [round(s, 3) for s in reads],
        "raw_write_mb_per_s": round(raw_w / 1e6, 1),
        "raw_write_runs_s": [round(s, 3) for s in writes],
        "raw_copy_mb_per_s": round(copy / 1e6, 1),
        "raw_copy_runs_s": [round(s, 3) for s in copies],
        "staging": results,
        "throughput_fraction": round(fraction, 3),
        "throughput_fraction_of_copy": round(of_copy, 3),
        "copy_fraction_of_read": round(copy / raw, 3),
        "rss_ratio": round(ratio, 3),
        "cpu_seconds_per_gb": round(cpu_per_gb, 2),
        "cpu_bound_ceiling_mb_per_s": round(ceiling / 1e6, 1),
        "targets": {"throughput_fraction": 0.5, "rss_ratio": 1.2},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "page_cache": "fsync + posix_fadvise(DONTNEED) before every timed read, copy and staging",
        "resident_after_evict": resident,
    }


def main(args: argparse.Namespace) -> int:
    """Entry point of `rffm bench staging`."""
    parent = Path(args.work_dir) if args.work_dir else Path.cwd()
    parent.mkdir(parents=True, exist_ok=True)
    with work_folder(".rffm-bench-staging-", parent, args.keep) as work_dir:
        result = run(work_dir, int(args.size_gb * 1e9), args.repeats, report=lambda line: print(line, flush=True))
    print(json.dumps(result, sort_keys=True))
    return 0
