"""The canonical dataset format: one HDF5 file per split (IQ, labels, SNR, content ids)."""

from __future__ import annotations

import binascii
import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash

from rffm.errors import DataError
from rffm.records.files import commit_file, pread_into, settle, start_writeback, temporary_sibling
from rffm.records.layout import SPLITS  # noqa: F401  (readers of split files use it)

FORMAT_VERSION = 2  # 2: contiguous IQ, xxh3-128 content ids
ROWS_PER_CHUNK = 256
SETTLE_BYTES = 32 << 20  # a split writer keeps at most about this much IQ dirty or cached


def content_digests(iq: np.ndarray) -> np.ndarray:
    """xxh3-128 of each example's float32 IQ bytes, as uint64 [n, 2] (16 bytes a row: staging keeps one per example)."""
    iq = np.ascontiguousarray(iq, dtype=np.float32)
    # each row of a C-contiguous array is one contiguous buffer: hash it in place (no copy)
    return np.frombuffer(b"".join([xxhash.xxh3_128_digest(example.data) for example in iq]), np.uint64).reshape(-1, 2).copy()


def hex_ids(digests: np.ndarray) -> np.ndarray:
    """Content ids as stored in a split: each digest's 32 hex digits, as fixed-width bytes."""
    return np.frombuffer(binascii.hexlify(np.ascontiguousarray(digests, np.uint64).tobytes()), dtype="S32").copy()


def content_ids(iq: np.ndarray) -> np.ndarray:
    """128-bit hex content id (xxh3-128) of each example's float32 IQ bytes, as fixed-width bytes."""
    return hex_ids(content_digests(iq))


def write_split(path: str | Path, iq: np.ndarray, labels: np.ndarray, snr_db: np.ndarray, attrs: dict[str, Any]) -> None:
    """Write one split atomically; the bytes depend only on the arrays and attributes."""
    writer = SplitWriter(path, len(labels), iq.shape[-1])
    try:
        writer.append(np.asarray(iq, np.float32))
        writer.finish(labels, snr_db, content_ids(iq), attrs)
        writer.commit()
    except BaseException:
        writer.discard()
        raise


class SplitWriter:
    """Streams one split into a temporary sibling file: IQ rows in order, the per-row columns at the end.

    The IQ dataset is contiguous and allocated when the file is created (no fill), so its rows have
    fixed byte offsets: append() writes them with os.pwrite (no GIL, no HDF5 buffering), starts
    their write-back to disk at once and drops what earlier appends wrote from the page cache once it
    is on disk (so commit()'s fsync finds little left to do and a huge split does not flood memory),
    and hashes them, so the file's digest never reads the IQ back. The file's bytes
    depend only on the arrays and attributes, never on how the rows were split into appends.
    Nothing appears at `path` until commit().
    """

    def __init__(self, path: str | Path, count: int, length: int):
        self.path, self.count, self.written, self.committed = Path(path), count, 0, False
        self.row_bytes = 2 * length * 4
        self.tmp = temporary_sibling(self.path)
        self.handle = h5py.File(self.tmp, "w", libver=("v110", "v110"), track_order=True)
        layout = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        layout.set_layout(h5py.h5d.CONTIGUOUS)
        layout.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        layout.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # every byte is written by append()
        iq = self.handle.create_dataset("iq", shape=(count, 2, length), dtype="<f4", dcpl=layout, track_times=False)
        self.offset = iq.id.get_offset() if count else None
        self.fd = os.open(self.tmp, os.O_RDWR)
        self.iq_digest = xxhash.xxh3_128()  # of the IQ block, as written: sealing need not read it back
        self.settled = self.offset or 0  # IQ bytes before this are on disk and out of the page cache

    def append(self, iq: np.ndarray) -> None:
        """Write the next rows (float32 [n, 2, length]) at their place in the file."""
        if not len(iq):
            return
        if self.written + len(iq) > self.count:
            raise RuntimeError(f"{self.path}: {self.written + len(iq)} rows appended to a split of {self.count}")
        block = memoryview(np.ascontiguousarray(iq, "<f4")).cast("B")
        start = self.offset + self.written * self.row_bytes
        done = 0
        while done < len(block):
            done += os.pwrite(self.fd, block[done:], start + done)
        start_writeback(self.fd, start, len(block))
        self.iq_digest.update(block)
        self.written += len(iq)
        if start - self.settled >= SETTLE_BYTES:  # what earlier appends wrote is on disk by now, or nearly
            settle(self.fd, self.settled, start - self.settled)
            self.settled = start

    def read(self, first: int, stop: int) -> np.ndarray:
        """Rows [first, stop) as written so far."""
        out = np.empty((stop - first, self.row_bytes), np.uint8)
        pread_into(self.fd, out, self.offset + first * self.row_bytes, self.tmp)
        return out.view("<f4").reshape(stop - first, 2, -1)

    def finish(self, labels: np.ndarray, snr_db: np.ndarray, ids: np.ndarray, attrs: dict[str, Any]) -> None:
        """Write the per-row columns and attributes and close the file (still temporary)."""
        if self.written != self.count:
            raise RuntimeError(f"{self.path}: {self.written} of {self.count} rows written")
        chunk = (max(1, min(ROWS_PER_CHUNK, self.count)),)
        self.handle.create_dataset("label", data=labels.astype(np.int64), chunks=chunk, track_times=False)
        self.handle.create_dataset("snr_db", data=snr_db.astype(np.float32), chunks=chunk, track_times=False)
        self.handle.create_dataset("content_id", data=ids.astype("S32"), chunks=chunk, track_times=False)
        self.handle.attrs["format_version"] = FORMAT_VERSION
        for key, value in sorted(attrs.items()):
            self.handle.attrs[key] = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value
        self.handle.close()
        self._close_fd()

    def parts(self) -> tuple[list[int], dict[int, bytes]]:
        """The file's byte boundaries around the IQ block and that block's digest (part 1), for sentinel.parts_record."""
        if self.offset is None:
            return [], {}
        return [self.offset, self.offset + self.count * self.row_bytes], {1: self.iq_digest.digest()}

    def commit(self) -> None:
        """Rename the finished file into place (after fsync)."""
        commit_file(self.tmp, self.path)
        self.committed = True

    def discard(self) -> None:
        """Close and delete the temporary file (safe to call twice)."""
        try:
            self._close_fd()
            self.handle.close()
        finally:
            self.tmp.unlink(missing_ok=True)

    def _close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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


def map_iq(path: str | Path) -> np.ndarray:
    """A split's IQ as a read-only memory map, float32 [n, 2, length]: the OS pages rows in as they are used."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as handle:
            iq = handle["iq"]
            offset, shape, dtype = iq.id.get_offset(), iq.shape, iq.dtype
            plain = iq.chunks is None and iq.compression is None
    except (OSError, KeyError) as exc:
        raise DataError(f"{path}: not a readable canonical split ({exc}). Fix: rerun stage_dataset.") from None
    if not shape[0]:
        return np.empty(shape, np.float32)
    if offset is None or not plain or dtype != np.dtype("<f4"):
        raise DataError(
            f"{path}: its IQ is not one contiguous little-endian float32 block (an older split format). Fix: rerun stage_dataset."
        )
    return np.memmap(path, dtype="<f4", mode="r", offset=offset, shape=shape)


def read_split(path: str | Path) -> dict[str, np.ndarray]:
    """Load a split's arrays (IQ, labels, SNR, content ids) into memory."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as handle:
            return {name: handle[name][()] for name in ("iq", "label", "snr_db", "content_id")}
    except (OSError, KeyError) as exc:
        raise DataError(f"{path}: not a readable canonical split ({exc}). Fix: rerun stage_dataset.") from None
