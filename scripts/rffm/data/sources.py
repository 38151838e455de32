"""Dataset sources read as streams: the class vocabulary, shared readers, and the synthetic and hdf5 sources.

Every source is a class constructed from a dataset spec (the config block plus `name`) and a scratch
directory, with this contract (see staging.py, which drives it):

    classes      canonical class names; a row's label indexes this list
    length       IQ samples per example
    sample_rate  Hz (1.0 when the source does not say)
    description  JSON-able dict stored in each split's `source` attribute
    index()      (labels int64 [N], snr_db float32 [N], NaN when unknown) from metadata only, no IQ
    read(rows)   float32 [len(rows), 2, length] for sorted row numbers (a strided view is fine: staging
                 copies it once anyway); memory bounded by len(rows); called from two threads at once
    locate(row)  where a row lives in the source, for error messages
    close()

RadioML 2016/2018 live in radioml.py and SigMF recordings in sigmf.py.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from rffm.data import synthetic
from rffm.errors import DataError
from rffm.records.files import pread_into

# One vocabulary for every source. Names are matched case- and punctuation-insensitively, and the
# digits of PSK/QAM/APSK/ASK/PAM/FSK names may come first or last: QAM16, qam-16 and 16QAM are all
# 16QAM, 4PAM is PAM4. Anything else needs `class_map`. FM (RML2018) and WBFM (RML2016, synthetic)
# stay distinct, as do AM-DSB (with carrier, RML2016) and the RML2018 AM-DSB-WC/-SC variants.
VOCABULARY = [
    # RML2016.10a and the synthetic generator
    "BPSK", "QPSK", "8PSK", "16QAM", "64QAM", "PAM4", "GFSK", "CPFSK", "AM-DSB", "AM-SSB", "WBFM",
    # RML2018.01A adds
    "OOK", "4ASK", "8ASK", "16PSK", "32PSK", "16APSK", "32APSK", "64APSK", "128APSK", "32QAM", "128QAM", "256QAM",
    "AM-SSB-WC", "AM-SSB-SC", "AM-DSB-WC", "AM-DSB-SC", "FM", "GMSK", "OQPSK",
]  # fmt: skip
ALIASES = {"2PSK": "BPSK", "4PSK": "QPSK"}
FAMILY_NUMBER = re.compile(r"^(?:(\d+)(PSK|QAM|APSK|ASK|PAM|FSK)|(PSK|QAM|APSK|ASK|PAM|FSK)(\d+))$")
# The 11-class "normal" subset of O'Shea, Roy, Clancy (IEEE JSTSP 2018), in the paper's order.
PRESETS = {"rml2018-normal": ["OOK", "4ASK", "BPSK", "QPSK", "8PSK", "16QAM", "AM-SSB-SC", "AM-DSB-SC", "FM", "GMSK", "OQPSK"]}
DROP_READ_PAGES = hasattr(os, "posix_fadvise")  # Linux; macOS has no fadvise
BLOCK_BYTES = 16 << 20  # IQ bytes per read block: bounds memory, large enough for sequential reads


def class_key(name: str) -> str:
    """Case/punctuation-free key of a class name with family digits first (QAM16 -> 16QAM)."""
    key = re.sub(r"[^0-9A-Z]", "", str(name).upper())
    match = FAMILY_NUMBER.match(key)
    if match:
        digits, family = (match.group(1), match.group(2)) if match.group(1) else (match.group(4), match.group(3))
        key = f"{int(digits)}{family}"
    return ALIASES.get(key, key)


VOCABULARY_BY_KEY = {class_key(name): name for name in VOCABULARY}


def canonical_class(name: str, class_map: dict[str, str] | None = None) -> str | None:
    """The vocabulary name of a raw class name (after the user's class_map), or None when unknown."""
    class_map = class_map or {}
    if name in class_map:
        target = class_map[name]
        return VOCABULARY_BY_KEY.get(class_key(target), target)
    return VOCABULARY_BY_KEY.get(class_key(name))


def normalise_classes(raw: list[str], spec: dict[str, Any], where: Callable[[str], str]) -> tuple[list[str], np.ndarray]:
    """Canonical class list (first-seen order, merged aliases) and the raw-index -> class-index map."""
    classes: list[str] = []
    mapping = np.empty(len(raw), np.int64)
    for i, name in enumerate(raw):
        canonical = canonical_class(name, spec.get("class_map"))
        if canonical is None:
            raise DataError(
                f"{where(name)}: class {name!r} is not in the class vocabulary ({', '.join(VOCABULARY)}). "
                f"Fix: map it with datasets.{spec['name']}.class_map: {{{name!r}: <class name>}} "
                "(a vocabulary name, or any new name to keep it as its own class)."
            )
        if canonical not in classes:
            classes.append(canonical)
        mapping[i] = classes.index(canonical)
    return classes, mapping


def source_path(spec: dict[str, Any], block: str, key: str = "path") -> Path:
    """A configured input path, which must exist."""
    path = Path(spec[block][key])
    if not path.exists():
        raise DataError(f"{path}: no such file (datasets.{spec['name']}.{block}.{key}). Fix: correct the path or create the file.")
    return path


def block_rows(length: int) -> int:
    """Examples per read block for examples of `length` complex samples."""
    return max(1, BLOCK_BYTES // (2 * 4 * length))


def pread_rows(fd: int, offsets: np.ndarray, row_bytes: int, path: Path) -> np.ndarray:
    """Rows of `row_bytes` at sorted byte offsets, as uint8 [n, row_bytes]; nearby rows share one read.

    A read spans a gap only when the gap is at most one row, so it never reads more than twice what it
    returns. os.preadv releases the GIL and fills the array in place (a reader thread overlaps the rest).
    """
    out = np.empty((len(offsets), row_bytes), np.uint8)
    if not len(offsets):
        return out
    starts = np.concatenate([[0], np.flatnonzero(np.diff(offsets) > 2 * row_bytes) + 1, [len(offsets)]])
    for first, last in zip(starts[:-1], starts[1:], strict=True):
        begin, end = int(offsets[first]), int(offsets[last - 1]) + row_bytes
        if end - begin == (last - first) * row_bytes:
            pread_into(fd, out[first:last], begin, path)
            continue
        span = np.empty(end - begin, np.uint8)
        pread_into(fd, span, begin, path)
        for i, offset in enumerate(offsets[first:last] - begin, start=first):
            out[i] = span[offset : offset + row_bytes]
    return out


class RowReader:
    """Reads rows of one HDF5 dataset: raw pread when it is contiguous little-endian float32, else through h5py."""

    def __init__(self, path: Path, dataset: h5py.Dataset):
        self.path, self.dataset = path, dataset
        self.row_shape = dataset.shape[1:]
        self.row_bytes = int(np.prod(self.row_shape)) * 4
        plist = dataset.id.get_create_plist()
        raw = (
            plist.get_layout() == h5py.h5d.CONTIGUOUS
            and plist.get_nfilters() == 0
            and plist.get_external_count() == 0
            and dataset.dtype == np.dtype("<f4")
            and dataset.id.get_offset() is not None
        )
        self.base = dataset.id.get_offset() if raw else None
        self.fd = os.open(path, os.O_RDONLY) if raw else None

    def read(self, rows: np.ndarray) -> np.ndarray:
        """float32 rows in the dataset's own row shape."""
        if self.fd is not None:
            offsets = self.base + rows.astype(np.int64) * self.row_bytes
            raw = pread_rows(self.fd, offsets, self.row_bytes, self.path)
            if DROP_READ_PAGES and len(rows):  # staging reads each row once: leave the page cache to others
                os.posix_fadvise(self.fd, int(offsets.min()), int(offsets.max() - offsets.min()) + self.row_bytes, os.POSIX_FADV_DONTNEED)
            return raw.view("<f4").reshape((len(rows), *self.row_shape))
        out = np.empty((len(rows), *self.row_shape), np.float32)
        # h5py reads a slice much faster than a fancy index: read each run of consecutive rows
        breaks = np.concatenate([[0], np.flatnonzero(np.diff(rows) != 1) + 1, [len(rows)]])
        for first, last in zip(breaks[:-1], breaks[1:], strict=True):
            self.dataset.read_direct(out, np.s_[int(rows[first]) : int(rows[last - 1]) + 1], np.s_[first:last])
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def open_hdf5(spec: dict[str, Any], block: str) -> tuple[Path, h5py.File]:
    """The HDF5 file a source block names, opened read-only, with a clear error when it is missing or not HDF5."""
    path = source_path(spec, block)
    try:
        return path, h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc}). Fix: check the path and that the file is complete.") from None


@contextmanager
def closed_on_error(handle: h5py.File) -> Iterator[h5py.File]:
    """An open file, closed when what reads it refuses it (so that the file can be repaired and read again at once)."""
    try:
        yield handle
    except BaseException:
        handle.close()
        raise


def require_dataset(handle: h5py.File, path: Path, name: str, fix: str) -> h5py.Dataset:
    """A named dataset of an open HDF5 file, or a clear error."""
    if name not in handle or not isinstance(handle[name], h5py.Dataset):
        present = ", ".join(sorted(handle.keys())) or "nothing"
        raise DataError(f"{path}: dataset {name!r} is missing (the file holds: {present}). Fix: {fix}.")
    return handle[name]


def read_column(dataset: h5py.Dataset, rows_per_block: int = 1 << 16):
    """Yield (start, block) of a per-row dataset without loading it whole."""
    for start in range(0, dataset.shape[0], rows_per_block):
        yield start, dataset[start : start + rows_per_block]


class SyntheticSource:
    """The embedded generator, one (class, SNR) stratum at a time (same streams as synthetic.generate)."""

    max_block_rows = 1024  # generation is CPU-bound: small blocks keep the progress lines coming

    def __init__(self, spec: dict[str, Any], scratch: Path):
        options = spec.get("synthetic", {})
        grid = options.get("snr_db", {"min": -20, "max": 18, "step": 2})
        snrs = list(np.arange(grid["min"], grid["max"] + grid["step"] / 2, grid["step"]).round(6).tolist())
        self.gen = synthetic.SyntheticSpec(
            classes=list(options.get("classes", synthetic.RML2016_CLASSES)),
            snr_db=snrs,
            examples_per_class_snr=int(options.get("examples_per_class_snr", 100)),
            length=int(options.get("length", 128)),
            sps=tuple(map(int, sps)) if isinstance(sps := options.get("sps", 8), list) else int(sps),
            impairments=synthetic.Impairments(**options.get("impairments", {})),
        )
        self.seed = int(spec["seed"])
        self.classes = self.gen.classes
        self.length = self.gen.length
        self.sample_rate = 1.0
        self.description = {"kind": "synthetic", "generator": "rffm.synthetic", **options}
        self._cached: tuple[int, np.ndarray] | None = None

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        per = self.gen.examples_per_class_snr
        labels = np.repeat(np.arange(len(self.classes), dtype=np.int64), len(self.gen.snr_db) * per)
        snrs = np.tile(np.repeat(np.asarray(self.gen.snr_db, np.float32), per), len(self.classes))
        return labels, snrs

    def _stratum(self, stratum: int) -> np.ndarray:
        cached = self._cached  # read once: staging's reader threads may replace it meanwhile
        if cached is None or cached[0] != stratum:
            name = self.classes[stratum // len(self.gen.snr_db)]
            snr = float(self.gen.snr_db[stratum % len(self.gen.snr_db)])
            cached = self._cached = (stratum, synthetic.stratum(self.gen, self.seed, name, snr))
        return cached[1]

    def read(self, rows: np.ndarray) -> np.ndarray:
        per = self.gen.examples_per_class_snr
        return np.stack([self._stratum(int(row) // per)[int(row) % per] for row in rows]) if len(rows) else np.empty((0, 2, self.length))

    def locate(self, row: int) -> str:
        per, snrs = self.gen.examples_per_class_snr, self.gen.snr_db
        stratum = row // per
        return f"synthetic example {row} ({self.classes[stratum // len(snrs)]} at {snrs[stratum % len(snrs)]} dB)"

    def close(self) -> None:
        self._cached = None


def decode_attr(value: Any) -> Any:
    """An HDF5 attribute as Python: bytes decoded, JSON strings parsed, arrays as lists."""
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, np.ndarray):
        return [decode_attr(v) for v in value.tolist()]
    return value.item() if hasattr(value, "item") else value


class Hdf5Source:
    """A file already in the canonical layout: iq float32 [N, 2, L], label [N], optional snr_db [N], attr classes."""

    FIX = "write the canonical layout: datasets iq (float32 [N, 2, L]), label (integer [N]), optional snr_db (float [N]), attribute classes"

    def __init__(self, spec: dict[str, Any], scratch: Path):
        self.spec = spec
        self.path, self.handle = open_hdf5(spec, "hdf5")
        with closed_on_error(self.handle):  # a refusal's traceback would keep the file open
            iq = require_dataset(self.handle, self.path, "iq", self.FIX)
            label = require_dataset(self.handle, self.path, "label", self.FIX)
            if iq.ndim != 3 or iq.shape[1] != 2 or iq.dtype != np.float32:
                raise DataError(
                    f"{self.path}: dataset 'iq' is {iq.dtype} {list(iq.shape)}, expected float32 [N, 2, L] (I and Q on axis 1). "
                    "Fix: store iq as float32 with shape [N, 2, L] (transpose [N, L, 2] with iq.transpose(0, 2, 1))."
                )
            if label.shape != (iq.shape[0],) or label.dtype.kind not in "iu":
                raise DataError(
                    f"{self.path}: dataset 'label' is {label.dtype} {list(label.shape)}, "
                    f"expected integer [{iq.shape[0]}] (one per iq row). "
                    "Fix: store one integer class index per example."
                )
            self.snr = self.handle.get("snr_db")
            if self.snr is not None and (self.snr.shape != (iq.shape[0],) or self.snr.dtype.kind not in "fiu"):
                raise DataError(
                    f"{self.path}: dataset 'snr_db' is {self.snr.dtype} {list(self.snr.shape)}, expected numbers [{iq.shape[0]}]. "
                    "Fix: store one SNR in dB per example (NaN when unknown) or leave snr_db out."
                )
            raw = decode_attr(self.handle.attrs.get("classes", []))
            if not isinstance(raw, list) or not raw or not all(isinstance(c, str) for c in raw):
                raise DataError(
                    f"{self.path}: attribute 'classes' is missing or not a list of names ({raw!r}). "
                    "Fix: set attrs['classes'] to the ordered class names (a JSON list or an array of strings)."
                )
            self.classes, self.class_index = normalise_classes(raw, spec, lambda name: f"{self.path}: attribute 'classes'")
            self.reader = RowReader(self.path, iq)
            self.length = int(iq.shape[2])
            self.sample_rate = float(decode_attr(self.handle.attrs.get("sample_rate", 1.0)))
            self.description = {"kind": "hdf5", "file": self.path.name, "bytes": self.path.stat().st_size}
            self.raw_classes = raw

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        label = self.handle["label"]
        labels = np.empty(label.shape[0], np.int64)
        for start, block in read_column(label):
            bad = np.flatnonzero((block < 0) | (block >= len(self.raw_classes)))
            if len(bad):
                row = start + int(bad[0])
                raise DataError(
                    f"{self.path}: dataset 'label' row {row} is {int(block[bad[0]])}, outside 0..{len(self.raw_classes) - 1} "
                    f"(attribute 'classes' names {len(self.raw_classes)}). Fix: correct the labels or the classes attribute."
                )
            labels[start : start + len(block)] = self.class_index[block]
        snrs = np.full(len(labels), np.nan, np.float32)
        if self.snr is not None:
            for start, block in read_column(self.snr):
                snrs[start : start + len(block)] = block
        return labels, snrs

    def read(self, rows: np.ndarray) -> np.ndarray:
        return self.reader.read(rows)

    def locate(self, row: int) -> str:
        return f"{self.path}: iq[{row}]"

    def close(self) -> None:
        self.reader.close()
        self.handle.close()


def sigmf_recordings(spec: dict[str, Any]) -> list[Path]:
    """The `.sigmf-meta` file of every configured recording (a directory stands for all recordings in it)."""
    metas: list[Path] = []
    for entry in spec["sigmf"]["recordings"]:
        path = Path(entry)
        where = f"datasets.{spec['name']}.sigmf.recordings"
        if path.suffix == ".sigmf":
            raise DataError(
                f"{path}: SigMF archives are read whole into memory, which staging avoids ({where}). "
                f"Fix: extract it (tar -xf {path.name}) and list the .sigmf-meta file."
            )
        if path.is_dir():
            found = sorted(path.glob("*.sigmf-meta"))
            if not found:
                raise DataError(f"{path}: directory holds no .sigmf-meta files ({where}). Fix: list recordings or their directory.")
            metas.extend(found)
        elif path.suffix in (".sigmf-meta", ".sigmf-data"):
            metas.append(path.with_suffix(".sigmf-meta"))
        else:
            metas.append(path.with_name(path.name + ".sigmf-meta"))
    return metas


def input_files(spec: dict[str, Any]) -> list[str]:
    """The files a dataset is staged from (for the workflow's change tracking); none for synthetic."""
    block = spec.get(spec["source"], {}) if spec["source"] != "synthetic" else {}
    if spec["source"] == "sigmf":
        try:
            metas = sigmf_recordings(spec)
        except DataError:
            return [str(Path(entry)) for entry in block.get("recordings", [])]  # staging reports it
        return [str(p) for meta in metas for p in (meta, meta.with_suffix(".sigmf-data"))]
    return [block["path"]] if "path" in block else []
