"""SigMF recordings as a source: every annotation with a `core:label` is cut into fixed windows.

A recording is a `name.sigmf-meta` (JSON) + `name.sigmf-data` (raw interleaved samples) pair, read with
the `sigmf` package. Windows of `window` samples start every `stride` samples from the annotation's
`core:sample_start` and lie wholly inside `core:sample_count`; annotations without a label, and the tail
shorter than a window, are skipped. Complex datatypes only (cf32_le, ci16_le, ...); fixed-point samples
are scaled to [-1, 1) by the package. The SNR of a window is the annotation's `snr_key` value (dB), or
NaN. Overlapping annotations each give their own windows.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import sigmf
from jsonschema.exceptions import ValidationError  # what sigmf's validate() raises for a field against its schema
from sigmf.error import SigMFError

from rffm.data.sources import VOCABULARY, normalise_classes, sigmf_recordings
from rffm.errors import DataError

COMPLEX_DATATYPE = re.compile(r"^c(f64|f32|i32|i16|i8|u32|u16|u8)(_le|_be)?$")


class SigmfSource:
    """One or more SigMF recordings, windowed by their labelled annotations."""

    def __init__(self, spec: dict[str, Any], scratch: Path):
        options = spec["sigmf"]
        self.spec, self.window = spec, int(options["window"])
        self.stride = int(options.get("stride", self.window))
        self.snr_key = options.get("snr_key", "rffm:snr_db")
        self.metas = sigmf_recordings(spec)
        self.recordings = []
        rates, rec, start, annotation, raw, snr = set(), [], [], [], [], []
        for number, meta in enumerate(self.metas):
            recording = self._open(meta, bool(options.get("verify_checksum", True)))
            self.recordings.append(recording)
            rate = recording.get_global_field(sigmf.SAMPLE_RATE_KEY)
            if rate is not None:
                rates.add(float(rate))
            for i, note in enumerate(recording.get_annotations()):
                if note.get(sigmf.LABEL_KEY) is None:
                    continue
                starts, label, value = self._windows(meta, recording, i, note)
                rec += [number] * len(starts)
                start += starts.tolist()
                annotation += [i] * len(starts)
                raw += [label] * len(starts)
                snr += [value] * len(starts)
        if not rec:
            raise DataError(
                f"{', '.join(map(str, self.metas))}: no labelled window of {self.window} samples (field core:label, "
                f"core:sample_count). Fix: annotate signals with core:label and core:sample_count >= window, or lower "
                f"datasets.{spec['name']}.sigmf.window."
            )
        if len(rates) > 1:
            raise DataError(
                f"{', '.join(map(str, self.metas))}: recordings disagree on core:sample_rate ({sorted(rates)}). "
                "Fix: stage recordings of one sample rate per dataset (or resample them)."
            )
        names = sorted(set(raw))
        classes, mapping = normalise_classes(names, spec, lambda name: f"{self._first_with(raw, name, rec, annotation)}: core:label")
        # vocabulary order, then new names (from class_map) alphabetically: independent of recording order
        order = sorted(range(len(classes)), key=lambda c: (VOCABULARY.index(classes[c]) if classes[c] in VOCABULARY else 999, classes[c]))
        self.classes = [classes[c] for c in order]
        rank = np.argsort(order)
        self.labels = rank[mapping[np.searchsorted(names, raw)]].astype(np.int64)
        self.snrs = np.asarray(snr, np.float32)
        self.window_recording = np.asarray(rec, np.int64)
        self.window_start = np.asarray(start, np.int64)
        self.window_annotation = np.asarray(annotation, np.int64)
        self.length = self.window
        self.sample_rate = rates.pop() if rates else 1.0
        self.description = {
            "kind": "sigmf",
            "recordings": [{"file": meta.name, "data_bytes": meta.with_suffix(".sigmf-data").stat().st_size} for meta in self.metas],
            "window": self.window,
            "stride": self.stride,
            "snr_key": self.snr_key,
        }

    def _windows(self, meta: Path, recording, i: int, note: dict[str, Any]) -> tuple[np.ndarray, str, float]:
        """A labelled annotation's windows: (their first samples, its label, its SNR in dB)."""
        first, count = self._extent(meta, recording, i, note)
        starts = first + self.stride * np.arange(max(0, (count - self.window) // self.stride + 1))
        value = note.get(self.snr_key, np.nan)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise DataError(
                f"{meta}: annotation {i} field {self.snr_key!r} is {value!r}, not a number. "
                f"Fix: store the SNR in dB as a number, or set datasets.{self.spec['name']}.sigmf.snr_key to the right key."
            )
        return starts, str(note[sigmf.LABEL_KEY]), float(value)

    def _first_with(self, raw: list[str], name: str, rec: list[int], annotation: list[int]) -> str:
        i = raw.index(name)
        return f"{self.metas[rec[i]]}: annotation {annotation[i]}"

    def _open(self, meta: Path, verify: bool):
        """Open one recording, checking what the sigmf package only warns about."""
        fix = "write the recording with the sigmf package (SigMFFile.tofile) or fix the field"
        if not meta.exists():
            raise DataError(f"{meta}: no such SigMF metadata file (datasets.{self.spec['name']}.sigmf.recordings). Fix: correct the path.")
        try:
            with open(meta) as handle:
                global_info = json.load(handle).get("global", {})
        except (ValueError, AttributeError) as exc:
            raise DataError(f"{meta}: not SigMF metadata JSON ({exc}). Fix: {fix}.") from None
        datatype = global_info.get(sigmf.DATATYPE_KEY)
        if not isinstance(datatype, str) or not COMPLEX_DATATYPE.match(datatype):
            raise DataError(
                f"{meta}: global core:datatype is {datatype!r}; staging needs complex IQ samples "
                "(cf32_le, ci16_le, ci8, cu8, ...). "
                "Fix: convert the recording to complex samples (e.g. cf32_le) and set core:datatype."
            )
        if global_info.get(sigmf.NUM_CHANNELS_KEY, 1) != 1:
            raise DataError(
                f"{meta}: global core:num_channels is {global_info[sigmf.NUM_CHANNELS_KEY]}. "
                "Fix: split the channels into one recording each."
            )
        data = meta.with_suffix(".sigmf-data")
        if not data.exists():
            raise DataError(f"{data}: the data file of {meta.name} is missing. Fix: put the .sigmf-data file beside its .sigmf-meta.")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # what it warns about is checked below, as errors
                recording = sigmf.fromfile(str(meta), skip_checksum=True)
                recording.validate()
        except (SigMFError, ValueError, KeyError, ValidationError) as exc:
            detail = f"{exc.json_path}: {exc.message}" if isinstance(exc, ValidationError) else str(exc).splitlines()[0]
            raise DataError(f"{meta}: not a valid SigMF recording ({type(exc).__name__}: {detail}). Fix: {fix}.") from None
        header = sum(capture.get(sigmf.HEADER_BYTES_KEY, 0) for capture in recording.get_captures())
        payload = data.stat().st_size - header - recording.get_global_field(sigmf.TRAILING_BYTES_KEY, 0)
        size = recording.get_sample_size()
        if payload % size:
            raise DataError(
                f"{data}: {payload} data bytes is not a whole number of {datatype} samples "
                f"({size} bytes each; {payload % size} left over). "
                f"Fix: the file is truncated or core:datatype in {meta.name} is wrong; correct one of them."
            )
        if verify:
            try:
                recording.calculate_hash()
            except SigMFError:
                raise DataError(
                    f"{data}: sha512 does not match global core:sha512 in {meta.name}. Fix: the data file changed or is "
                    f"damaged; restore it (or, if the change is intended, set datasets.{self.spec['name']}.sigmf.verify_checksum: false)."
                ) from None
        return recording

    def _extent(self, meta: Path, recording, i: int, note: dict) -> tuple[int, int]:
        first, count = note.get(sigmf.SAMPLE_START_KEY), note.get(sigmf.SAMPLE_COUNT_KEY)
        if count is None:
            raise DataError(
                f"{meta}: annotation {i} ({note.get(sigmf.LABEL_KEY)!r}) has no core:sample_count. "
                "Fix: give every labelled annotation its length."
            )
        if first + count > recording.sample_count:
            raise DataError(
                f"{meta}: annotation {i} covers samples {first}..{first + count - 1} (core:sample_start, core:sample_count), but the "
                f"data file holds {recording.sample_count} samples. Fix: correct the annotation or restore the full data file."
            )
        return int(first), int(count)

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        return self.labels, self.snrs

    def read(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), 2, self.window), np.float32)
        recordings, starts = self.window_recording[rows], self.window_start[rows]
        for number in np.unique(recordings):
            picked = np.flatnonzero(recordings == number)
            first, last = int(starts[picked].min()), int(starts[picked].max()) + self.window
            recording = self.recordings[number]
            if last - first <= 2 * len(picked) * self.window:  # one read when it is mostly windows
                span = recording.read_samples(first, last - first)
                windows = np.lib.stride_tricks.sliding_window_view(span, self.window)[starts[picked] - first]
            else:
                windows = np.stack([recording.read_samples(int(s), self.window) for s in starts[picked]])
            out[picked, 0], out[picked, 1] = windows.real, windows.imag
        return out

    def locate(self, row: int) -> str:
        meta = self.metas[self.window_recording[row]]
        return f"{meta}: annotation {self.window_annotation[row]}, window at sample {self.window_start[row]}"

    def close(self) -> None:
        self.recordings = []
