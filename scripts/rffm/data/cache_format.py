"""The hidden-state cache's files: BF16 rows in preallocated memory-mapped files (one per cached split), labels and
SNR as .npy, meta.json (shapes, tap layout, classes), and a sealed sentinel naming the recipe they were built from and
every file's bytes. The size of a cache is computed here (and by cache_plan while planning)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from rffm.errors import IntegrityError
from rffm.records.files import sha256_json
from rffm.records.layout import SENTINEL_NAME, cache_files
from rffm.records.seal import unseal
from rffm.records.sentinel import check_record

if TYPE_CHECKING:
    import torch

SENTINEL_LABEL = "hidden-state cache sentinel"  # names the sealed sentinel in an integrity error


def to_bf16_bits(hidden: torch.Tensor) -> np.ndarray:
    """FP32 tensor -> raw BF16 bits as uint16 (numpy has no bfloat16)."""
    import torch  # here, not at the top: reading a cache's records (rffm status, verify) needs no torch

    return hidden.to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> torch.Tensor:
    """Raw BF16 bits -> FP32 tensor."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16).float()


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


def recipe(record: dict[str, Any]) -> str:
    """What a cache is built from, as one digest: the upstream sentinels, the build code and the encoder a build_cache record names."""
    inputs = {role: ref["sha256"] for role, ref in record["inputs"].items()}
    return sha256_json({"inputs": inputs, "code": record["code_sha256"], "encoder": record.get("encoder", {}).get("fingerprint")})


def built_recipe(local_dir: Path) -> str | None:
    """The recipe a cache directory was built from, None when no sealed cache is there."""
    try:
        return unseal(local_dir / SENTINEL_NAME, (local_dir / SENTINEL_NAME).read_bytes(), SENTINEL_LABEL).get("recipe")
    except (FileNotFoundError, IntegrityError):
        return None


def cache_problems(local_dir: Path, body: dict[str, Any]) -> list[str]:
    """Files of a cache that do not match its sentinel (every byte is read)."""
    records = body.get("outputs") if isinstance(body.get("outputs"), dict) else {}
    problems = []
    for name in cache_files():
        record = records.get(name)
        recorded = isinstance(record, dict) and "bytes" in record
        problem = check_record(local_dir / name, record) if recorded else f"{local_dir / name}: not recorded"
        if problem:
            problems.append(problem)
    return problems
