"""The canonical dataset format: one HDF5 file per split (IQ, labels, SNR, content ids)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from rffm.errors import DataError
from rffm.files import commit_file, temporary_sibling

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
ROWS_PER_CHUNK = 256


def content_ids(iq: np.ndarray) -> np.ndarray:
    """128-bit hex digest of each example's float32 IQ bytes, as fixed-width bytes."""
    iq = np.ascontiguousarray(iq, dtype=np.float32)
    return np.array([hashlib.sha256(example.tobytes()).hexdigest()[:32].encode() for example in iq], dtype="S32")


def write_split(path: str | Path, iq: np.ndarray, labels: np.ndarray, snr_db: np.ndarray, attrs: dict[str, Any]) -> None:
    """Write one split atomically; the bytes depend only on the arrays and attributes."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        with h5py.File(tmp, "w", libver=("v110", "v110"), track_order=True) as handle:
            count = len(labels)
            chunk = (max(1, min(ROWS_PER_CHUNK, count)),)
            handle.create_dataset("iq", data=iq.astype(np.float32), chunks=chunk + iq.shape[1:], track_times=False)
            handle.create_dataset("label", data=labels.astype(np.int64), chunks=chunk, track_times=False)
            handle.create_dataset("snr_db", data=snr_db.astype(np.float32), chunks=chunk, track_times=False)
            handle.create_dataset("content_id", data=content_ids(iq), chunks=chunk, track_times=False)
            handle.attrs["format_version"] = FORMAT_VERSION
            for key, value in sorted(attrs.items()):
                handle.attrs[key] = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value
        commit_file(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def split_attrs(path: str | Path) -> dict[str, Any]:
    """File attributes of a split, JSON values decoded."""
    with h5py.File(path, "r") as handle:
        out = {}
        for key, value in handle.attrs.items():
            if isinstance(value, (str, bytes)):
                text = value.decode() if isinstance(value, bytes) else value
                try:
                    out[key] = json.loads(text)
                except ValueError:
                    out[key] = text
            else:
                out[key] = value.item() if hasattr(value, "item") else value
        out["count"] = int(handle["label"].shape[0])
        return out


def read_split(path: str | Path) -> dict[str, np.ndarray]:
    """Load a split's arrays (IQ, labels, SNR, content ids) into memory."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as handle:
            return {name: handle[name][()] for name in ("iq", "label", "snr_db", "content_id")}
    except (OSError, KeyError) as exc:
        raise DataError(f"{path}: not a readable canonical split ({exc}). Fix: rerun stage_dataset.") from None


def iter_iq_batches(path: str | Path, batch_size: int):
    """Yield (start, iq batch) in file order without loading the whole split."""
    with h5py.File(path, "r") as handle:
        dataset = handle["iq"]
        for start in range(0, dataset.shape[0], batch_size):
            yield start, dataset[start : start + batch_size]
