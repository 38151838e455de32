"""`rffm predict MODEL INPUT`: classify IQ windows with an exported classifier; no rffm model code is involved.

MODEL is an export folder (runs/<run>/export) or its model.pt2: the program and its signature (classes,
input length) come from the .pt2 alone, loaded with torch.export.load. INPUT is one of:
- a SigMF recording (.sigmf-meta or .sigmf-data): cut into windows of the model's length every `stride`
  samples; a window wholly inside an annotation with a `core:label` carries that label;
- an HDF5 split in rffm's canonical layout (iq [N, 2, L], label, attrs classes): a staged test split is
  refused unless `allow_test` (the test split's reads belong to qualification, counted in the ledger);
- a RadioML file: the RML2018.01A HDF5 (X, Y, Z) or an RML2016.10a/b pickle (read by rffm.data.radioml).
Windows go through the program in batches; each row gets the top-k classes with softmax probabilities,
and labelled inputs an accuracy. Rows are written as CSV or JSON.
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from rffm.errors import DataError
from rffm.records.layout import EXPORT_PROGRAM, PROGRAM_SIGNATURE
from rffm.runtime.progress import Progress

UNLABELLED = -1


@dataclass
class Windows:
    """IQ windows to classify: how to read a range of them, their labels (model class index or -1) and where each lies."""

    count: int
    read: Any  # (start, stop) -> float32 [n, 2, L]
    labels: np.ndarray
    where: Any  # index -> text
    source: str
    closers: list = field(default_factory=list)


def load_model(model: str | Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The exported program (as a callable module) and its signature, from a .pt2 or the folder holding model.pt2."""
    path = Path(model)
    path = path / EXPORT_PROGRAM if path.is_dir() else path
    if not path.is_file():
        raise DataError(f"{path}: no such exported model. Fix: point at results/runs/<run>/export (or its model.pt2) after `make run`.")
    extra = {PROGRAM_SIGNATURE: ""}
    try:
        program = torch.export.load(path, extra_files=extra)
        signature = json.loads(extra[PROGRAM_SIGNATURE])
    except Exception as error:  # a damaged or foreign archive: one line
        kind = type(error).__name__
        raise DataError(f"{path}: not an rffm exported classifier ({kind}). Fix: point at the model.pt2 that export writes.") from None
    return program.module(), signature


def class_indices(names: list[str], classes: list[str]) -> np.ndarray:
    """Each input class name's index among the model's classes (-1 when the model has no such class)."""
    return np.array([classes.index(name) if name in classes else UNLABELLED for name in names], np.int64)


def hdf5_windows(path: Path, length: int, classes: list[str], allow_test: bool) -> Windows:
    """A canonical split (iq/label/attrs) or an RML2018 file (X/Y/Z)."""
    handle = h5py.File(path, "r")
    if "X" in handle and "Y" in handle:
        handle.close()
        return source_windows(path, "radioml2018", length, classes)
    if "iq" not in handle:
        handle.close()
        raise DataError(
            f"{path}: HDF5 without 'iq' (canonical) or 'X'/'Y' (RML2018). Fix: pass a staged split, an RML2018 file or a SigMF recording."
        )
    split = handle.attrs.get("split")
    split = split.decode() if isinstance(split, bytes) else split
    if split == "test" and not allow_test:
        handle.close()
        raise DataError(
            f"{path}: a staged test split; its reads belong to qualification (once per artifact, counted in the ledger). "
            "Fix: predict on the val split or other data, or pass --i-know-this-is-test to read it anyway."
        )
    iq = handle["iq"]
    if iq.ndim != 3 or iq.shape[1] != 2 or iq.shape[2] != length:
        handle.close()
        raise DataError(f"{path}: 'iq' is {list(iq.shape)}, the model reads [N, 2, {length}]. Fix: stage the data with length {length}.")
    labels = np.full(iq.shape[0], UNLABELLED, np.int64)
    if "label" in handle and "classes" in handle.attrs:
        names = handle.attrs["classes"]
        names = json.loads(names) if isinstance(names, str) else [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        labels = class_indices(names, classes)[handle["label"][()]]
    return Windows(iq.shape[0], lambda a, b: iq[a:b], labels, lambda i: f"row {i}", str(path), [handle])


def source_windows(path: Path, kind: str, length: int, classes: list[str]) -> Windows:
    """An RML2016 pickle or RML2018 HDF5 through rffm's own readers (their checks, their class vocabulary)."""
    from rffm.data.radioml import Rml2016Source, Rml2018Source

    scratch = tempfile.TemporaryDirectory()
    reader = (Rml2018Source if kind == "radioml2018" else Rml2016Source)({"name": "predict", kind: {"path": str(path)}}, Path(scratch.name))
    if reader.length != length:
        reader.close()
        raise DataError(
            f"{path}: examples of {reader.length} samples, the model reads {length}. Fix: use a model exported for length {reader.length}."
        )
    raw, _ = reader.index()
    labels = class_indices(reader.classes, classes)[raw]
    return Windows(len(raw), lambda a, b: reader.read(np.arange(a, b)), labels, reader.locate, str(path), [reader, scratch])


def sigmf_windows(path: Path, length: int, classes: list[str], stride: int) -> Windows:
    """Windows of a SigMF recording every `stride` samples; labels from the annotation wholly containing a window."""
    import sigmf

    meta = path.with_suffix(".sigmf-meta")
    if not path.exists() and path == meta:  # as for any other input: the file named is not there
        raise DataError(f"{path}: no such input file. Fix: pass a SigMF recording, an HDF5 split or a RadioML file.")
    if not meta.is_file():
        raise DataError(f"{meta}: no such file, the metadata of {path.name}. Fix: pass the .sigmf-meta of a pair.")
    if not meta.with_suffix(".sigmf-data").is_file():
        data = meta.with_suffix(".sigmf-data")
        raise DataError(f"{data}: the data file of {meta.name} is missing. Fix: put the .sigmf-data file beside its .sigmf-meta.")
    try:
        recording = sigmf.sigmffile.fromfile(str(meta))
    except Exception as error:
        problem = f"{type(error).__name__}: {error}"
        raise DataError(f"{meta}: not a readable SigMF recording ({problem}). Fix: pass the .sigmf-meta of a pair.") from None
    total = int(recording.sample_count)
    starts = np.arange(0, max(0, total - length) + 1, stride, dtype=np.int64) if total >= length else np.empty(0, np.int64)
    if not len(starts):
        raise DataError(f"{meta}: {total} samples, fewer than one window of {length}. Fix: pass a longer recording.")
    labels = np.full(len(starts), UNLABELLED, np.int64)
    for note in recording.get_annotations():
        label = note.get(sigmf.LABEL_KEY)
        first = int(note.get(sigmf.SAMPLE_START_KEY, 0))
        count = int(note.get(sigmf.SAMPLE_COUNT_KEY, total - first))
        if label is None:
            continue
        inside = (starts >= first) & (starts + length <= first + count)
        labels[inside] = class_indices([canonical(str(label))], classes)[0]

    def read(a: int, b: int) -> np.ndarray:
        first, stop = int(starts[a]), int(starts[b - 1]) + length
        span = recording.read_samples(first, stop - first)
        windows = np.lib.stride_tricks.sliding_window_view(span, length)[starts[a:b] - first]
        return np.stack([windows.real, windows.imag], axis=1).astype(np.float32)

    return Windows(len(starts), read, labels, lambda i: f"sample {int(starts[i])}", str(meta))


def canonical(name: str) -> str:
    """A SigMF label in the class vocabulary staging uses (QAM16 -> 16QAM), or as it is."""
    from rffm.data.sources import canonical_class

    return canonical_class(name) or name


def open_windows(path: str | Path, length: int, classes: list[str], stride: int | None = None, allow_test: bool = False) -> Windows:
    """The windows of any supported input, by what the file is."""
    path = Path(path)
    if path.suffix in (".sigmf-meta", ".sigmf-data"):
        return sigmf_windows(path, length, classes, stride or length)
    if not path.is_file():
        raise DataError(f"{path}: no such input file. Fix: pass a SigMF recording, an HDF5 split or a RadioML file.")
    if h5py.is_hdf5(path):
        return hdf5_windows(path, length, classes, allow_test)
    return source_windows(path, "radioml2016", length, classes)


def predict(
    model: str | Path,
    source: str | Path,
    *,
    top_k: int = 3,
    batch_size: int = 256,
    stride: int | None = None,
    allow_test: bool = False,
) -> dict[str, Any]:
    """Classify every window of `source`: {model, input, classes, rows: [{index, where, label, top: [[class, p], ...]}], accuracy}."""
    program, signature = load_model(model)
    classes, length = signature["classes"], int(signature["input"]["length"])
    windows = open_windows(source, length, classes, stride, allow_test)
    top_k = max(1, min(top_k, len(classes)))
    rows, correct, labelled = [], 0, 0
    progress = Progress("predict", total=windows.count, unit="window")
    try:
        with torch.no_grad():
            for start in range(0, windows.count, batch_size):
                stop = min(start + batch_size, windows.count)
                probabilities = torch.softmax(program(torch.from_numpy(np.ascontiguousarray(windows.read(start, stop)))), dim=1)
                values, indices = probabilities.topk(top_k, dim=1)
                for offset, (p, k) in enumerate(zip(values.tolist(), indices.tolist(), strict=True)):
                    index, label = start + offset, int(windows.labels[start + offset])
                    rows.append(
                        {
                            "index": index,
                            "where": windows.where(index),
                            "label": classes[label] if label != UNLABELLED else None,
                            "top": [[classes[c], round(v, 6)] for c, v in zip(k, p, strict=True)],
                        }
                    )
                    if label != UNLABELLED:
                        labelled += 1
                        correct += int(k[0] == label)
                progress.update(stop - start)
    finally:
        progress.close()
        for closer in windows.closers:
            (closer.cleanup if hasattr(closer, "cleanup") else closer.close)()
    return {
        "model": str(model),
        "input": windows.source,
        "classes": classes,
        "windows": windows.count,
        "labelled": labelled,
        "accuracy": correct / labelled if labelled else None,
        "rows": rows,
    }


def render(result: dict[str, Any], fmt: str) -> str:
    """The rows as CSV (index, where, label, class_1, probability_1, ...) or the whole result as JSON."""
    if fmt == "json":
        return json.dumps(result, indent=1) + "\n"
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    k = len(result["rows"][0]["top"]) if result["rows"] else 0
    writer.writerow(["index", "where", "label", *[f"{n}_{i}" for i in range(1, k + 1) for n in ("class", "probability")]])
    for row in result["rows"]:
        writer.writerow([row["index"], row["where"], row["label"] or "", *[v for pair in row["top"] for v in pair]])
    return out.getvalue()


def summary(result: dict[str, Any]) -> str:
    """One line: how many windows, and the accuracy over the labelled ones."""
    text = f"{result['input']}: {result['windows']} window(s) classified"
    if result["accuracy"] is not None:
        text += f"; accuracy {result['accuracy']:.6f} on {result['labelled']} labelled window(s)"
    return text
