"""Writers of tiny files in the exact on-disk layouts of the real RF datasets (for tests and the benchmark smoke test).

RML2016: a protocol-0 pickle as Python 2's cPickle writes it (STRING opcodes holding the raw array bytes,
numpy.core.multiarray._reconstruct, dtype('f4', 0, 1)), loaded with encoding="latin1".
RML2018: HDF5 with X float32 [N, L, 2], Y int64 one-hot [N, 24], Z int64 [N, 1], modulation-major rows.
SigMF: .sigmf-meta/.sigmf-data pairs written with the sigmf package, cf32_le or ci16_le.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import sigmf
from sigmf import SigMFFile

from rffm.data import synthetic
from rffm.data.radioml import RML2018_CLASSES


def py2_repr(raw: bytes) -> bytes:
    """Python 2 repr() of a str, the argument of a protocol-0 STRING opcode."""
    quote = b'"' if b"'" in raw and b'"' not in raw else b"'"
    out = bytearray(quote)
    for byte in raw:
        char = bytes([byte])
        if char == b"\\" or char == quote:
            out += b"\\" + char
        elif char in (b"\t", b"\n", b"\r"):
            out += {b"\t": b"\\t", b"\n": b"\\n", b"\r": b"\\r"}[char]
        elif 32 <= byte < 127:
            out += char
        else:
            out += b"\\x%02x" % byte
    return bytes(out + quote)


def py2_int(value: int) -> bytes:
    return b"I%d\n" % value


def write_rml2016_pickle(path: Path, data: dict[tuple[str, int], np.ndarray]) -> Path:
    """The RML2016.10a dict {(modulation, snr): float32 [n, 2, L]} as Python 2's cPickle.dump(protocol 0) writes it."""
    out = bytearray(b"(dp0\n")
    for (modulation, snr), array in data.items():
        array = np.ascontiguousarray(array)
        out += b"(S" + py2_repr(modulation.encode()) + b"\n" + py2_int(snr) + b"t"
        out += b"cnumpy.core.multiarray\n_reconstruct\n(cnumpy\nndarray\n(I0\ntS'b'\ntR"
        out += b"(I1\n(" + b"".join(py2_int(n) for n in array.shape) + b"t"
        out += b"cnumpy\ndtype\n(S'" + array.dtype.str[1:].encode() + b"'\nI0\nI1\ntR"
        out += b"(I3\nS'" + array.dtype.str[:1].encode() + b"'\nNNNI-1\nI-1\nI0\ntb"
        out += b"I00\nS" + py2_repr(array.tobytes()) + b"\ntbs"
    path.write_bytes(bytes(out + b"."))
    return path


def rml2016_data(classes=("QAM16", "QPSK", "BPSK", "GFSK"), snrs=(0, 10), per_key: int = 16, length: int = 128, seed: int = 0):
    """Synthetic examples in the RML2016 dict layout, L1-scaled per example like the real files."""
    canonical = {"QAM16": "16QAM", "QAM64": "64QAM"}
    data = {}
    for modulation in classes:
        spec = synthetic.SyntheticSpec(
            classes=[canonical.get(modulation, modulation)], snr_db=list(snrs), examples_per_class_snr=per_key, length=length
        )
        iq, _, snr = synthetic.generate(spec, seed)
        for value in snrs:
            block = iq[snr == value]
            data[(modulation, int(value))] = (block / np.abs(block).sum(axis=(1, 2), keepdims=True)).astype(np.float32)
    return data


def write_rml2018_hdf5(path: Path, x: np.ndarray, classes: np.ndarray, snrs: np.ndarray, chunks=None, compression=None) -> Path:
    """GOLD_XYZ_OSC layout: X float32 [N, L, 2], Y int64 one-hot [N, 24] (corrected column order), Z int64 [N, 1]."""
    with h5py.File(path, "w") as handle:
        handle.create_dataset("X", data=x.astype(np.float32), chunks=chunks, compression=compression)
        handle.create_dataset("Y", data=np.eye(len(RML2018_CLASSES), dtype=np.int64)[classes])
        handle.create_dataset("Z", data=np.asarray(snrs, np.int64).reshape(-1, 1))
    return path


def rml2018_data(classes: list[str], snrs=(0, 10), per_key: int = 8, length: int = 1024, seed: int = 0):
    """Synthetic examples in RML2018 row order (modulation-major, then SNR): X [N, L, 2], class columns, SNRs."""
    xs, columns, values = [], [], []
    for name in sorted(classes, key=RML2018_CLASSES.index):
        # the synthetic generator lacks most 2018 classes: borrow a look-alike, the label is what matters here
        stand_in = name if name in synthetic.CLASSES else synthetic.CLASSES[RML2018_CLASSES.index(name) % len(synthetic.CLASSES)]
        spec = synthetic.SyntheticSpec(classes=[stand_in], snr_db=list(snrs), examples_per_class_snr=per_key, length=length)
        iq, _, snr = synthetic.generate(spec, seed + RML2018_CLASSES.index(name))
        xs.append(iq.transpose(0, 2, 1))
        columns += [RML2018_CLASSES.index(name)] * len(iq)
        values += snr.astype(int).tolist()
    return np.concatenate(xs), np.array(columns), np.array(values)


def write_sigmf(
    base: Path, samples: np.ndarray, annotations: list[tuple[int, int, dict]], datatype: str = "cf32_le", rate: float = 1e6
) -> Path:
    """A recording pair base.sigmf-meta/base.sigmf-data; annotations are (start, count, extra fields)."""
    data = base.with_suffix(".sigmf-data")
    if datatype == "cf32_le":
        samples.astype(np.complex64).tofile(data)
    elif datatype == "ci16_le":
        scaled = np.clip(np.round(np.stack([samples.real, samples.imag], 1) * 8192), -32768, 32767)
        scaled.astype("<i2").tofile(data)
    else:
        raise ValueError(datatype)
    meta = SigMFFile(
        data_file=str(data),
        global_info={
            sigmf.DATATYPE_KEY: datatype,
            sigmf.SAMPLE_RATE_KEY: rate,
            sigmf.VERSION_KEY: sigmf.__specification__,
            sigmf.EXTENSIONS_KEY: [{"name": "rffm", "version": "1.0.0", "optional": True}],  # declares rffm:snr_db
        },
    )
    meta.add_capture(0, metadata={sigmf.FREQUENCY_KEY: 915e6})
    for start, count, fields in annotations:
        meta.add_annotation(start, count, metadata=fields)
    meta.tofile(str(base.with_suffix(".sigmf-meta")))
    return base.with_suffix(".sigmf-meta")


def sigmf_recording(
    base: Path, labels: list[str], snrs=(0, 10), windows: int = 8, window: int = 128, datatype: str = "cf32_le", seed: int = 0
):
    """One recording: for each (label, SNR) a burst of `windows` windows, separated by unlabelled noise gaps."""
    canonical = {"bpsk": "BPSK", "QAM16": "16QAM", "qpsk": "QPSK"}
    rng = np.random.default_rng(seed)
    pieces, annotations, position = [], [], 0
    for number, label in enumerate(labels):
        for snr in snrs:
            spec = synthetic.SyntheticSpec(
                classes=[canonical.get(label, label)], snr_db=[snr], examples_per_class_snr=windows, length=window
            )
            iq, _, _ = synthetic.generate(spec, seed * 100 + number)
            burst = (iq[:, 0] + 1j * iq[:, 1]).reshape(-1) * 0.25
            gap = 0.01 * (rng.standard_normal(window // 2) + 1j * rng.standard_normal(window // 2))
            annotations.append((position, len(burst), {sigmf.LABEL_KEY: label, "rffm:snr_db": snr}))
            pieces += [burst, gap]
            position += len(burst) + len(gap)
    annotations.append((position - window // 2, window // 2, {sigmf.COMMENT_KEY: "unlabelled noise"}))
    return write_sigmf(base, np.concatenate(pieces), annotations, datatype)


def write_canonical_hdf5(path: Path, iq: np.ndarray, labels: np.ndarray, classes: list[str], snr_db: np.ndarray | None = None) -> Path:
    """A file already in the canonical layout (the hdf5 source)."""
    with h5py.File(path, "w") as handle:
        handle.create_dataset("iq", data=iq.astype(np.float32))
        handle.create_dataset("label", data=labels.astype(np.int64))
        if snr_db is not None:
            handle.create_dataset("snr_db", data=snr_db.astype(np.float32))
        handle.attrs["classes"] = np.array(classes, dtype=h5py.string_dtype())
    return path


def edit_json(path: Path, edit) -> None:
    """Change a JSON file (a .sigmf-meta) in place: edit(body) on its parsed body, written back."""
    body = json.loads(path.read_text())
    edit(body)
    path.write_text(json.dumps(body))
