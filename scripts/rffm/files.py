"""Atomic file writes, canonical JSON and content hashing."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


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


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes, mode: int = 0o644, create_only: bool = False) -> None:
    """Write bytes to a temporary sibling, fsync, then rename over the target.

    With create_only the file is linked into place instead, and an existing target raises
    FileExistsError and is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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
    _fsync_dir(path.parent)


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


def commit_file(tmp: str | Path, path: str | Path) -> None:
    """fsync a finished temporary file and rename it over `path`."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    _fsync_dir(Path(path).parent)
