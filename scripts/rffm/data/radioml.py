"""RadioML sources: the RML2016.10a/10b pickle and the RML2018.01A HDF5 (layouts in config/README.md, "Bring your own data").

RML2016: a Python-2 pickle of a dict {(modulation, snr_db): float32 [n, 2, 128]}, read with latin1 strings.
A pickle cannot be read by key, so it is unpickled once with every array spilled to an anonymous
temporary file as it is decoded (memory bound: one array); rows are then read back from that file.
Rows are ordered by sorted modulation name (the usual RML2016 label order), then SNR ascending.

RML2018: GOLD_XYZ_OSC.0001_1024.hdf5 with X float32 [N, 1024, 2] (last axis I, Q), Y one-hot [N, 24]
and Z SNR dB [N, 1]. Class index = one-hot column, in the corrected order below, NOT the order of
the classes.txt shipped with the dataset (which is wrong; see radioML/dataset#25).
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rffm.data.sources import (
    RowReader,
    closed_on_error,
    normalise_classes,
    open_hdf5,
    pread_rows,
    read_column,
    require_dataset,
    source_path,
)
from rffm.errors import DataError

RML2016_SNRS = set(range(-20, 20, 2))
RML2018_CLASSES = [
    "OOK", "4ASK", "8ASK", "BPSK", "QPSK", "8PSK", "16PSK", "32PSK", "16APSK", "32APSK", "64APSK", "128APSK",
    "16QAM", "32QAM", "64QAM", "128QAM", "256QAM", "AM-SSB-WC", "AM-SSB-SC", "AM-DSB-WC", "AM-DSB-SC", "FM", "GMSK", "OQPSK",
]  # fmt: skip
RML2018_SNRS = set(range(-20, 32, 2))
# What a numpy-array pickle may refer to; anything else is refused (unpickling runs code).
PICKLE_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
    ("codecs", "encode"),
}


class SpilledArray:
    """Stand-in for an unpickled ndarray whose bytes went to the spool file."""

    def __init__(self, spool):
        self.spool = spool
        self.shape: tuple[int, ...] = ()
        self.dtype = np.dtype("f4")
        self.offset = 0

    def __setstate__(self, state: tuple) -> None:
        # ndarray pickle state: (version, shape, dtype, is_fortran, raw bytes); Python-2 pickles give a latin1 str
        _, shape, dtype, fortran, raw = state if len(state) == 5 else (1, *state)
        self.set(tuple(shape), np.dtype(dtype), bool(fortran), raw.encode("latin1") if isinstance(raw, str) else raw)

    def set(self, shape: tuple[int, ...], dtype: np.dtype, fortran: bool, raw: Any) -> None:
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raise pickle.UnpicklingError(f"array data is {type(raw).__name__}, not raw bytes (an object array?)")
        if fortran:  # rows must be contiguous in the spool
            raw = np.ascontiguousarray(np.frombuffer(raw, dtype).reshape(shape, order="F")).tobytes()
        self.shape, self.dtype = shape, dtype
        self.offset = self.spool.seek(0, os.SEEK_END)
        self.spool.write(raw)


class SpillingUnpickler(pickle.Unpickler):
    """Unpickles an RML2016 dict, writing each array's bytes to `spool` instead of memory."""

    def __init__(self, file, spool):
        super().__init__(file, encoding="latin1")
        self.spool = spool

    def find_class(self, module: str, name: str):
        if module.startswith("numpy") and name == "_reconstruct":
            return lambda subtype, shape, dtype: SpilledArray(self.spool)
        if module.startswith("numpy") and name == "_frombuffer":  # protocol-5 pickles

            def frombuffer(buffer, dtype, shape, order):
                array = SpilledArray(self.spool)
                array.set(tuple(shape), np.dtype(dtype), order == "F", memoryview(buffer).cast("B"))
                return array

            return frombuffer
        if (module, name) in PICKLE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which an RML2016 pickle never does")


class Rml2016Source:
    """RML2016.10a (`RML2016.10a_dict.pkl`) or 10b (`RML2016.10b.dat`)."""

    def __init__(self, spec: dict[str, Any], scratch: Path):
        self.spec = spec
        self.path = source_path(spec, "radioml2016")
        # anonymous temporary file beside the outputs: gone when closed, even after a crash
        self.spool = tempfile.TemporaryFile(dir=scratch)
        try:
            with open(self.path, "rb") as handle:
                data = SpillingUnpickler(handle, self.spool).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError, KeyError) as exc:
            self.spool.close()
            raise DataError(
                f"{self.path}: not an RML2016 pickle ({type(exc).__name__}: {exc}). "
                "Fix: point radioml2016.path at RML2016.10a_dict.pkl or RML2016.10b.dat as extracted from DeepSig's archive."
            ) from None
        self.spool.flush()
        self.keys = self._check(data)
        self.arrays = [data[key] for key in self.keys]
        raw = sorted({modulation for modulation, _ in self.keys})
        self.classes, mapping = normalise_classes(raw, spec, lambda name: f"{self.path}: key ({name!r}, snr)")
        self.key_labels = np.array([mapping[raw.index(modulation)] for modulation, _ in self.keys], np.int64)
        self.length = self.arrays[0].shape[2]
        self.row_bytes = 2 * self.length * 4
        counts = np.array([a.shape[0] for a in self.arrays], np.int64)
        self.key_starts = np.concatenate([[0], np.cumsum(counts)])
        self.sample_rate = 1.0
        self.description = {"kind": "radioml2016", "file": self.path.name, "bytes": self.path.stat().st_size, "class_order": "sorted keys"}

    def _check(self, data: Any) -> list[tuple[str, int]]:
        """Keys sorted by (modulation, SNR), after checking every key and array."""
        fix = "the file must be the RML2016 dict {(modulation: str, snr_db: int): float32 [n, 2, L]}"
        if not isinstance(data, dict) or not data:
            raise DataError(f"{self.path}: the pickle holds {type(data).__name__}, not a non-empty dict. Fix: {fix}.")
        lengths = set()
        for key, array in data.items():
            if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], (int, np.integer))):
                raise DataError(f"{self.path}: dict key {key!r} is not a (modulation, snr_db) pair of str and int. Fix: {fix}.")
            if int(key[1]) not in RML2016_SNRS:
                raise DataError(
                    f"{self.path}: key {key!r}: SNR {int(key[1])} dB is outside the RML2016 grid -20, -18, ..., 18. "
                    "Fix: this is not an RML2016.10a/b file; convert it to the canonical layout and use source: hdf5."
                )
            if not isinstance(array, SpilledArray):
                raise DataError(f"{self.path}: key {key!r} holds {type(array).__name__}, not a numpy array. Fix: {fix}.")
            if array.dtype != np.dtype("<f4") or len(array.shape) != 3 or array.shape[1] != 2 or 0 in array.shape:
                raise DataError(
                    f"{self.path}: key {key!r}: array is {array.dtype} {list(array.shape)}, expected float32 [n, 2, L] "
                    f"(I and Q on axis 1). Fix: {fix}."
                )
            lengths.add(array.shape[2])
        if len(lengths) > 1:
            raise DataError(f"{self.path}: arrays have different lengths {sorted(lengths)}. Fix: {fix} with one L for every key.")
        return sorted(((modulation, int(snr)) for modulation, snr in data), key=lambda k: (k[0], k[1]))

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        counts = np.diff(self.key_starts)
        return np.repeat(self.key_labels, counts), np.repeat(np.array([snr for _, snr in self.keys], np.float32), counts)

    def read(self, rows: np.ndarray) -> np.ndarray:
        key = np.searchsorted(self.key_starts, rows, side="right") - 1
        offsets = np.array([a.offset for a in self.arrays], np.int64)[key] + (rows - self.key_starts[key]) * self.row_bytes
        order = np.argsort(offsets, kind="stable")
        out = np.empty((len(rows), self.row_bytes), np.uint8)
        out[order] = pread_rows(self.spool.fileno(), offsets[order], self.row_bytes, self.path)
        return out.view("<f4").reshape(len(rows), 2, self.length)

    def locate(self, row: int) -> str:
        key = int(np.searchsorted(self.key_starts, row, side="right") - 1)
        return f"{self.path}: key {self.keys[key]!r} row {row - int(self.key_starts[key])}"

    def close(self) -> None:
        self.spool.close()


class Rml2018Source:
    """RadioML 2018.01A (`GOLD_XYZ_OSC.0001_1024.hdf5`), or a file in its exact layout."""

    FIX = "point radioml2018.path at GOLD_XYZ_OSC.0001_1024.hdf5 (X float32 [N, 1024, 2], Y one-hot [N, 24], Z SNR dB [N, 1])"

    def __init__(self, spec: dict[str, Any], scratch: Path):
        self.spec = spec
        self.path, self.handle = open_hdf5(spec, "radioml2018")
        with closed_on_error(self.handle):  # a refusal's traceback would keep the file open
            x, y, z = (require_dataset(self.handle, self.path, name, self.FIX) for name in ("X", "Y", "Z"))
            if x.ndim != 3 or x.shape[2] != 2 or x.dtype != np.float32:
                hint = " (this looks like the canonical [N, 2, L] layout: use source: hdf5)" if x.ndim == 3 and x.shape[1] == 2 else ""
                raise DataError(
                    f"{self.path}: dataset 'X' is {x.dtype} {list(x.shape)}, expected float32 [N, L, 2]{hint}. Fix: {self.FIX}."
                )
            count = x.shape[0]
            if y.shape != (count, len(RML2018_CLASSES)) or y.dtype.kind not in "iuf":
                raise DataError(
                    f"{self.path}: dataset 'Y' is {y.dtype} {list(y.shape)}, expected one-hot numbers [{count}, {len(RML2018_CLASSES)}] "
                    f"(one row per X row, one column per class). Fix: {self.FIX}."
                )
            if z.shape not in ((count, 1), (count,)) or z.dtype.kind not in "iuf":
                raise DataError(f"{self.path}: dataset 'Z' is {z.dtype} {list(z.shape)}, expected SNR dB [{count}, 1]. Fix: {self.FIX}.")
            self.classes, self.class_index = normalise_classes(RML2018_CLASSES, spec, lambda name: f"{self.path}: Y column")
            self.reader = RowReader(self.path, x)
            self.length = int(x.shape[1])
            self.sample_rate = 1.0
            self.description = {
                "kind": "radioml2018",
                "file": self.path.name,
                "bytes": self.path.stat().st_size,
                "class_order": "corrected",
            }

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        y, z = self.handle["Y"], self.handle["Z"]
        labels = np.empty(y.shape[0], np.int64)
        for start, block in read_column(y):
            onehot = ((block == 1).sum(axis=1) == 1) & ((block == 0).sum(axis=1) == block.shape[1] - 1)
            if not onehot.all():
                bad = np.flatnonzero(~onehot)
                raise DataError(
                    f"{self.path}: dataset 'Y': {len(bad)} row(s) in rows {start}..{start + len(block) - 1} are not one-hot "
                    f"(first: row {start + int(bad[0])} = {block[bad[0]].tolist()}). "
                    "Fix: each Y row needs exactly one 1 (the class column) and zeros elsewhere."
                )
            labels[start : start + len(block)] = self.class_index[block.argmax(axis=1)]
        snrs = np.empty(z.shape[0], np.float32)
        for start, block in read_column(z):
            values = block.reshape(-1)
            off_grid = ~np.isin(values, sorted(RML2018_SNRS))
            if off_grid.any():
                bad = np.flatnonzero(off_grid)
                raise DataError(
                    f"{self.path}: dataset 'Z': row {start + int(bad[0])} has SNR {values[bad[0]]} dB, outside the RML2018 grid "
                    f"-20, -18, ..., 30 ({len(bad)} such row(s) in rows {start}..{start + len(values) - 1}). "
                    "Fix: Z must hold the SNR in dB of each row; for other data use source: hdf5."
                )
            snrs[start : start + len(values)] = values
        return labels, snrs

    def read(self, rows: np.ndarray) -> np.ndarray:
        return self.reader.read(rows).transpose(0, 2, 1)  # a view: copy_iq's split gather makes it contiguous

    def locate(self, row: int) -> str:
        return f"{self.path}: X[{row}]"

    def close(self) -> None:
        self.reader.close()
        self.handle.close()
