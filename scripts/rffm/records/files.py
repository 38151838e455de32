"""Atomic file writes, canonical JSON and content hashing."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import io
import json
import os
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xxhash

from rffm.errors import DataError

CHUNK = 1 << 20
FAST_HASH_CHUNK = 8 << 20
SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start write-back of the range's dirty pages, do not wait
SYNC_FILE_RANGE_WAIT = 1 | 2 | 4  # ... and wait for write-back already under way, before and after
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if os.name == "posix" else None
_SYNC_FILE_RANGE = getattr(_LIBC, "sync_file_range", None)  # Linux only


def canonical_json(obj: Any) -> str:
    """Serialize to JSON with sorted keys and fixed separators (stable bytes for hashing)."""
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=True) + "\n"


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of a byte string."""
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: Any) -> str:
    """Hex sha256 of an object's canonical JSON."""
    return sha256_bytes(canonical_json(obj).encode())


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def xxh3_parts(path: str | Path, boundaries: Sequence[int] = (), known: dict[int, bytes] | None = None) -> str:
    """Hex xxh3-128 of the concatenated xxh3-128 digests of a file's parts, cut at the sorted byte `boundaries`.

    Every byte is covered, so one flipped byte anywhere changes it. `known` gives the raw digests of
    parts already hashed while they were written (by part number): those are not read again.
    xxh3 is non-cryptographic: it finds corruption, not tampering, at ~10x sha256's speed.
    """
    size = os.stat(path).st_size
    edges = [0, *boundaries, size]
    combined = xxhash.xxh3_128()
    buffer = bytearray(FAST_HASH_CHUNK)
    with open(path, "rb", buffering=0) as handle:
        for number, (start, stop) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
            if known and number in known:
                combined.update(known[number])
                continue
            part = xxhash.xxh3_128()
            handle.seek(start)
            left = max(0, stop - start)
            while left and (count := handle.readinto(memoryview(buffer)[: min(left, len(buffer))])):
                part.update(memoryview(buffer)[:count])
                left -= count
            combined.update(part.digest())
    return combined.hexdigest()


def pread_into(fd: int, buffer: Any, offset: int, path: str | Path) -> None:
    """Fill `buffer` from the file at `offset` (os.preadv: no GIL); a file that ends first is a clear error."""
    view = memoryview(buffer).cast("B")
    done = 0
    while done < len(view):
        count = os.preadv(fd, [view[done:]], offset + done)
        if count == 0:
            raise DataError(
                f"{path}: file ends at byte {offset + done}, before the data it declares. Fix: the file is truncated; copy it again."
            )
        done += count


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing a just-written range to disk without waiting (Linux; elsewhere a no-op).

    A later fsync then finds most pages clean: the disk works while the writer goes on.
    """
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, ctypes.c_int64(offset), ctypes.c_int64(length), SYNC_FILE_RANGE_WRITE)


def fsync_path(path: Path) -> None:
    """Make a file's written pages (or a directory's entries) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_unnamed(path: Path, data: bytes, mode: int) -> bool:
    """Create-only write through an unnamed file (O_TMPFILE) linked into place: a kill never leaves a
    temporary name behind. False when the filesystem cannot (then a named temporary is used)."""
    try:
        fd = os.open(path.parent, os.O_TMPFILE | os.O_WRONLY, mode)
    except (AttributeError, OSError):
        return False
    try:
        with os.fdopen(fd, "wb", closefd=False) as handle:
            handle.write(data)
        os.fsync(fd)
        os.link(f"/proc/self/fd/{fd}", path)  # FileExistsError when the name is taken
    except FileExistsError:
        raise
    except OSError:
        return False
    finally:
        os.close(fd)
    fsync_path(path.parent)
    return True


def atomic_write_bytes(path: str | Path, data: bytes, mode: int = 0o644, create_only: bool = False) -> None:
    """Write bytes to a temporary sibling, fsync, then rename over the target.

    With create_only the file is linked into place instead, and an existing target raises
    FileExistsError and is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if create_only:
        remove_dead_temporaries(path)
        if _link_unnamed(path, data, mode):
            return
        tmp = _owned_temporary(path)
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    else:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if create_only:
            os.link(tmp, path)
            Path(tmp).unlink()
        else:
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def _owned_temporary(path: Path) -> str:
    """A create-only write's temporary: `.<name>.<host>.<pid>.tmp`, so a later writer can tell a killed writer's leftover."""
    return str(path.parent / f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def remove_dead_temporaries(path: Path) -> None:
    """Remove the temporaries of `path` that create-only writers on this host left when they were killed (their pid is
    gone; or ours: this process writes one name at a time). Store folders (ledger, artifacts, memo) belong to no step,
    so no step's start clears them."""
    host = socket.gethostname()
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        owner, _, pid = tmp.name[len(path.name) + 2 : -len(".tmp")].rpartition(".")
        if owner == host and pid.isdigit() and (int(pid) == os.getpid() or not _running(int(pid))):
            tmp.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    """Whether a process of that pid runs. A killed process whose parent died stays a zombie until init reaps it, and
    an init that never reaps (a container's or CI runner's first process) keeps /proc/<pid> forever: a zombie is dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Atomically write an object as canonical JSON."""
    atomic_write_bytes(path, canonical_json(obj).encode())


def atomic_torch_save(path: str | Path, obj: Any, mode: int = 0o644) -> None:
    """torch.save through memory so the archive's bytes do not depend on the file name."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue(), mode=mode)


def read_json(path: str | Path) -> Any:
    """Load a JSON file."""
    with open(path) as handle:
        return json.load(handle)


def temporary_sibling(path: str | Path) -> Path:
    """A hidden temporary path next to `path`, for writers that need a file name (h5py)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def remove_temporaries(directory: str | Path) -> list[Path]:
    """Delete the temporary siblings (`.<name>.<random>.tmp`) a killed writer left in a directory."""
    directory = Path(directory)
    stale = sorted(directory.glob(".*.tmp")) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def commit_file(tmp: str | Path, path: str | Path) -> None:
    """fsync a finished temporary file and rename it over `path`."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    fsync_path(Path(path).parent)


def settle(fd: int, offset: int, length: int) -> None:
    """Wait until a written range is on disk and drop it from the page cache (Linux; elsewhere a no-op).

    A streaming writer that settles what it wrote a little earlier keeps the kernel's dirty and
    cached pages bounded too: a 20 GB staging does not push everything else out of memory.
    The file's metadata still needs the fsync of commit.
    """
    if _SYNC_FILE_RANGE is not None and length > 0:
        _SYNC_FILE_RANGE(fd, ctypes.c_int64(offset), ctypes.c_int64(length), SYNC_FILE_RANGE_WAIT)
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
