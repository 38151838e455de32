"""The canonical dataset format: one HDF5 file per split (IQ, labels, SNR, content ids)."""

from __future__ import annotations

import binascii
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
    # each row of a C-contiguous array is one contiguous buffer: hash it in place (no copy), hex all at once
    digests = b"".join([hashlib.sha256(example.data).digest()[:16] for example in iq])
    return np.frombuffer(binascii.hexlify(digests), dtype="S32").copy()


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


class SplitWriter:
    """Streams one split into a temporary sibling file: IQ chunk by chunk, the per-row columns at the end.

    Rows arrive in order; IQ is written in whole chunks, in order, so the file's bytes equal what
    write_split produces for the same arrays. Nothing appears at `path` until commit().
    """

    def __init__(self, path: str | Path, count: int, length: int):
        self.path, self.count, self.written, self.committed = Path(path), count, 0, False
        self.chunk = max(1, min(ROWS_PER_CHUNK, count))
        self.tmp = temporary_sibling(self.path)
        self.handle = h5py.File(self.tmp, "w", libver=("v110", "v110"), track_order=True)
        self.iq = self.handle.create_dataset(
            "iq", shape=(count, 2, length), dtype=np.float32, chunks=(self.chunk, 2, length), track_times=False
        )
        self.pending: list[np.ndarray] = []
        self.pending_rows = 0

    def append(self, iq: np.ndarray) -> None:
        """Queue rows; write every whole chunk now."""
        if len(iq):
            self.pending.append(iq)
            self.pending_rows += len(iq)
        if self.pending_rows >= self.chunk or (self.pending_rows and self.written + self.pending_rows == self.count):
            block = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
            whole = len(block) if self.written + len(block) == self.count else len(block) // self.chunk * self.chunk
            self.iq[self.written : self.written + whole] = block[:whole]
            self.written += whole
            self.pending = [block[whole:]] if whole < len(block) else []
            self.pending_rows = len(block) - whole

    def finish(self, labels: np.ndarray, snr_db: np.ndarray, ids: np.ndarray, attrs: dict[str, Any]) -> None:
        """Write the per-row columns and attributes and close the file (still temporary)."""
        if self.written != self.count:
            raise RuntimeError(f"{self.path}: {self.written} of {self.count} rows written")
        # flush IQ before the next dataset allocates space, so the layout matches write_split's
        self.iq.id.flush()
        chunk = (self.chunk,)
        self.handle.create_dataset("label", data=labels.astype(np.int64), chunks=chunk, track_times=False)
        self.handle.create_dataset("snr_db", data=snr_db.astype(np.float32), chunks=chunk, track_times=False)
        self.handle.create_dataset("content_id", data=ids.astype("S32"), chunks=chunk, track_times=False)
        self.handle.attrs["format_version"] = FORMAT_VERSION
        for key, value in sorted(attrs.items()):
            self.handle.attrs[key] = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value
        self.handle.close()

    def commit(self) -> None:
        """Rename the finished file into place."""
        commit_file(self.tmp, self.path)
        self.committed = True

    def discard(self) -> None:
        """Close and delete the temporary file (safe to call twice)."""
        try:
            self.handle.close()
        finally:
            self.tmp.unlink(missing_ok=True)


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
