"""Dataset staging: a configured source streamed into canonical, stratified, leakage-checked HDF5 splits.

The order of work bounds memory by a block of IQ, whatever the source's size:
  1. open the source and read its index (labels and SNRs only, no IQ);
  2. select rows (class subset, SNR range, cap per (class, SNR)) and split them, stratified by
     (class, SNR) and deterministic from the seed;
  3. one pass over the selected rows in source order, block by block (the next block is read in a
     background thread): check finite, normalise, hash, append to the split's temporary file;
  4. check duplicates across splits (error, or drop the later copies), write the per-row columns and
     attributes, rename the three files into place, then write provenance and the sentinel.
Any failure deletes the temporary files, so a failed staging leaves no sentinel and no split.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rffm.data.radioml import Rml2016Source, Rml2018Source
from rffm.data.sources import PRESETS, Hdf5Source, SyntheticSource, block_rows, canonical_class
from rffm.data.splits import SplitWriter, content_digests, hex_ids
from rffm.errors import ConfigError, DataError
from rffm.records.layout import SPLITS
from rffm.records.sentinel import parts_record
from rffm.runtime.progress import Progress


def sigmf_source(spec: dict[str, Any], scratch: Path):
    """The SigMF source, imported on use: the sigmf package (jsonschema) adds ~40 ms to every staging."""
    from rffm.data.sigmf import SigmfSource

    return SigmfSource(spec, scratch)


SOURCES = {
    "synthetic": SyntheticSource,
    "radioml2016": Rml2016Source,
    "radioml2018": Rml2018Source,
    "sigmf": sigmf_source,
    "hdf5": Hdf5Source,
}
NORMALIZATIONS = ("none", "rms", "peak")
READS_IN_FLIGHT = 2
WRITES_IN_FLIGHT = 2


def check_fractions(fractions: dict[str, float]) -> dict[str, float]:
    """Validate split fractions: all three present, positive, summing to 1."""
    if any(fractions[name] <= 0 for name in SPLITS) or abs(sum(fractions[name] for name in SPLITS) - 1) > 1e-6:
        raise ConfigError(f"datasets.*.splits must give train, val and test fractions > 0 that sum to 1; got {fractions}")
    return fractions


def where(source) -> str:
    """The file(s) a source reads, for messages."""
    if hasattr(source, "metas"):
        return ", ".join(map(str, source.metas))
    return str(getattr(source, "path", "the synthetic source"))


def select(spec: dict[str, Any], source, labels: np.ndarray, snrs: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Selected source rows (sorted), their labels in the selected class order, and that class list."""
    options, name = spec.get("select", {}), spec["name"]
    wanted = options.get("classes")
    if wanted is None:
        order = list(range(len(source.classes)))
    else:
        order = []
        for requested in PRESETS[wanted] if isinstance(wanted, str) else wanted:
            canonical = canonical_class(requested, spec.get("class_map"))
            if canonical not in source.classes:
                raise ConfigError(
                    f"datasets.{name}.select.classes: {requested!r} is not a class of {where(source)} "
                    f"(its classes: {', '.join(source.classes)}). Fix: select classes the source has."
                )
            order.append(source.classes.index(canonical))
    remap = np.full(len(source.classes), -1, np.int64)
    remap[order] = np.arange(len(order))
    mapped = remap[labels]
    keep = mapped >= 0
    snr_range = options.get("snr_db", {})
    if "min" in snr_range:
        keep &= snrs >= snr_range["min"]  # NaN (unknown SNR) fails both comparisons: dropped when a range is set
    if "max" in snr_range:
        keep &= snrs <= snr_range["max"]
    rows = np.flatnonzero(keep)
    if "max_per_class_snr" in options:
        rows = cap_per_stratum(rows, mapped[rows], snrs[rows], int(options["max_per_class_snr"]), int(spec["seed"]))
    classes = [source.classes[i] for i in order]
    counts = np.bincount(mapped[rows], minlength=len(classes))
    empty = [classes[i] for i in np.flatnonzero(counts == 0)]
    if empty:
        within = f" with SNR in [{snr_range.get('min', '-inf')}, {snr_range.get('max', 'inf')}] dB" if snr_range else ""
        raise DataError(
            f"{where(source)}: class(es) {', '.join(empty)} have no examples{within}. "
            f"Fix: leave them out with datasets.{name}.select.classes, or widen datasets.{name}.select.snr_db."
        )
    return rows, mapped[rows], classes


def cap_per_stratum(rows: np.ndarray, labels: np.ndarray, snrs: np.ndarray, cap: int, seed: int) -> np.ndarray:
    """At most `cap` rows per (class, SNR), a seeded random choice, returned sorted."""
    _, stratum = np.unique(
        np.stack([labels.astype(np.float64), np.nan_to_num(snrs.astype(np.float64), nan=-1e9)], 1), axis=0, return_inverse=True
    )
    stratum = stratum.ravel()
    order = np.lexsort((np.random.default_rng([seed, 2]).random(len(rows)), stratum))
    first = np.searchsorted(stratum[order], stratum[order], side="left")
    return np.sort(rows[order[np.arange(len(order)) - first < cap]])


def stratified_split(labels: np.ndarray, snr_db: np.ndarray, fractions: dict[str, float], seed: int) -> dict[str, np.ndarray]:
    """Sorted row indices per split, stratified by (class, SNR) and deterministic from the seed."""
    rng = np.random.default_rng([seed, 1])
    snr_values, snr_rank = np.unique(np.nan_to_num(snr_db.astype(np.float64), nan=-1e9), return_inverse=True)
    # one integer per (class, SNR), ordered like the pairs: a 1-D unique is far cheaper than np.unique(axis=0)
    keys, inverse = np.unique(labels.astype(np.int64) * len(snr_values) + snr_rank.ravel(), return_inverse=True)
    inverse = inverse.ravel()
    # rows of each stratum in ascending order (a stable sort), one permutation per stratum in key order
    by_stratum = np.argsort(inverse, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=len(keys)))])
    parts: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    for stratum in range(len(keys)):
        rows = rng.permutation(by_stratum[bounds[stratum] : bounds[stratum + 1]])
        n_test = int(round(len(rows) * fractions["test"]))
        n_val = int(round(len(rows) * fractions["val"]))
        parts["test"].append(rows[:n_test])
        parts["val"].append(rows[n_test : n_test + n_val])
        parts["train"].append(rows[n_test + n_val :])
    return {name: np.sort(np.concatenate(parts[name])).astype(np.int64) for name in SPLITS}


def check_split_classes(name: str, classes: list[str], labels: np.ndarray, index: dict[str, np.ndarray], origin: str) -> None:
    """Every class in every split."""
    for split, rows in index.items():
        missing = sorted(set(range(len(classes))) - set(np.unique(labels[rows]).tolist()))
        if missing:
            raise DataError(
                f"{origin}: dataset {name!r}: split {split!r} has no examples of {[classes[i] for i in missing]}; "
                f"the source is too small for the requested split fractions. Fix: add examples or change datasets.{name}.splits."
            )


def normalise(iq: np.ndarray, how: str) -> np.ndarray:
    """Per-example scaling: none, rms (mean |z|^2 = 1, like the synthetic source) or peak (max |z| = 1)."""
    if how == "none":
        return iq
    power = iq.astype(np.float64) ** 2
    if how == "rms":
        scale = np.sqrt(power.sum(axis=1).mean(axis=1))
    else:
        scale = np.sqrt(power.sum(axis=1).max(axis=1))
    return (iq / np.maximum(scale, 1e-30)[:, None, None]).astype(np.float32)  # all-zero examples stay zero


def finite_rows(iq: np.ndarray) -> np.ndarray:
    """Which examples have only finite samples."""
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(iq.sum(axis=(1, 2)))  # NaN/Inf anywhere makes the sum non-finite
    if not finite.all():  # ... and so can an overflow: check those rows element by element
        finite[~finite] = np.isfinite(iq[~finite]).all(axis=(1, 2))
    return finite


def copy_iq(source, rows: np.ndarray, split_of: np.ndarray, writers: list[SplitWriter], how: str, progress: Progress) -> np.ndarray:
    """Stream the selected rows into the split writers; return each row's content digest (uint64 [n, 2]).

    Three stages overlap: two reader threads fetch blocks k+1 and k+2 (preadv, no GIL; two requests
    keep the disk busy while it also absorbs the writes), this thread gathers
    block k into its splits (one copy, which also makes a source's strided view contiguous), checks,
    normalises and hashes it, and a writer thread appends block k-1 to the split files (pwrite, no
    GIL). At most WRITES_IN_FLIGHT blocks wait to be written, so memory stays a few blocks whatever
    the source's size.
    """
    ids = np.empty((len(rows), 2), np.uint64)
    step = min(block_rows(source.length), getattr(source, "max_block_rows", len(rows) or 1))
    bad_count, first_bad = 0, None
    in_flight: deque = deque()
    with ThreadPoolExecutor(READS_IN_FLIGHT) as reader, ThreadPoolExecutor(1) as writer:
        starts = range(0, len(rows), step)
        reads = deque(reader.submit(source.read, rows[ahead : ahead + step]) for ahead in starts[:READS_IN_FLIGHT])
        for start in starts:
            iq = reads.popleft().result()
            ahead = start + READS_IN_FLIGHT * step
            if ahead < len(rows):
                reads.append(reader.submit(source.read, rows[ahead : ahead + step]))
            assigned = split_of[start : start + len(iq)]
            positions = [start + np.flatnonzero(assigned == number) for number in range(len(writers))]
            parts = [np.ascontiguousarray(iq[where - start], np.float32) for where in positions]
            for part, where in zip(parts, positions, strict=True):
                finite = finite_rows(part)
                if not finite.all() or bad_count:  # the staging will fail: only count, so the message can give the total
                    bad = where[~finite]
                    if len(bad) and (first_bad is None or rows[bad[0]] < first_bad):
                        first_bad = int(rows[bad[0]])
                    bad_count += len(bad)
            if bad_count:
                progress.update(len(iq))
                continue
            parts = [normalise(part, how) for part in parts]
            for part, where in zip(parts, positions, strict=True):
                ids[where] = content_digests(part)
            in_flight.append(writer.submit(lambda parts=parts: [w.append(part) for w, part in zip(writers, parts, strict=True)]))
            while len(in_flight) > WRITES_IN_FLIGHT:
                in_flight.popleft().result()
            progress.update(len(iq))
        while in_flight:
            in_flight.popleft().result()
    if bad_count:
        raise DataError(
            f"{source.locate(first_bad)}: NaN or Inf samples in {bad_count} selected example(s) (this is the first). "
            "Fix: repair or remove those examples in the source (or leave them out with the select options)."
        )
    return ids


def duplicates(ids: np.ndarray, split_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every repeated content digest (uint64 [n, 2]): (position of its first copy, position of the repeat), repeats in order."""
    order = np.lexsort((ids[:, 1], ids[:, 0]))  # stable: the first copy of each content comes first
    ordered = ids[order]
    first_of_group = np.concatenate([[True], (ordered[1:] != ordered[:-1]).any(axis=1)]) if len(ids) else np.zeros(0, bool)
    group_first = order[first_of_group][np.cumsum(first_of_group) - 1]
    repeats = ~first_of_group
    pairs = np.stack([group_first[repeats], order[repeats]], 1)
    return pairs[np.argsort(pairs[:, 1], kind="stable")].T if len(pairs) else (np.zeros(0, np.int64), np.zeros(0, np.int64))


def compact(writer: SplitWriter, keep: np.ndarray, length: int) -> SplitWriter:
    """A new writer holding only the kept rows of `writer` (copied block by block); the old one is discarded."""
    kept = np.flatnonzero(keep)
    fresh = SplitWriter(writer.path, len(kept), length)
    try:
        step = block_rows(length)
        for start in range(0, len(kept), step):
            block = kept[start : start + step]  # dense: read the covering range, then pick
            fresh.append(writer.read(int(block[0]), int(block[-1]) + 1)[block - block[0]])
    except BaseException:
        fresh.discard()
        raise
    writer.discard()
    return fresh


def seal(writer: SplitWriter) -> dict[str, Any]:
    """Hash a finished split (the IQ block was hashed as it was written: only the rest is read), then commit it; its record."""
    record = parts_record(writer.tmp, *writer.parts())
    writer.commit()
    return record


def source_description(spec: dict[str, Any], source) -> dict[str, Any]:
    """The `source` attribute: what the source says about itself plus any selection options used."""
    description = dict(source.description)
    for key in ("select", "class_map", "normalize", "duplicates"):
        if key in spec:
            description[key] = spec[key]
    return description


def check_duplicates(spec: dict[str, Any], source, rows: np.ndarray, ids: np.ndarray, split_of: np.ndarray) -> tuple[np.ndarray, dict]:
    """Rows to keep and a summary; identical IQ in two splits is an error unless `duplicates: drop`."""
    first, repeat = duplicates(ids, split_of)
    across = split_of[first] != split_of[repeat]
    mode = spec.get("duplicates", "error")
    if mode == "error" and across.any():
        k = int(np.flatnonzero(across)[0])
        raise DataError(
            f"{source.locate(int(rows[repeat[k]]))} ({SPLITS[split_of[repeat[k]]]}) has the same IQ as "
            f"{source.locate(int(rows[first[k]]))} ({SPLITS[split_of[first[k]]]}): {int(across.sum())} example(s) "
            f"duplicate content across splits (content id {hex_ids(ids[repeat[k]])[0].decode()}), which is leakage. "
            f"Fix: deduplicate the source, or set datasets.{spec['name']}.duplicates: drop to keep only the first copy of each."
        )
    keep = np.ones(len(rows), bool)
    if mode == "drop":
        keep[repeat] = False  # every copy after the first, in source order
    summary = {"mode": mode, "across_splits": int(across.sum()), "within_split": int((~across).sum()), "dropped": int((~keep).sum())}
    return keep, summary


def plan(spec: dict[str, Any], source, fractions: dict[str, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], dict, int]:
    """From labels and SNRs only: selected rows, their labels and SNRs, the classes, the split, the source's size."""
    all_labels, all_snrs = source.index()
    rows, labels, classes = select(spec, source, all_labels, all_snrs)
    index = stratified_split(labels, all_snrs[rows], fractions, int(spec["seed"]))
    check_split_classes(spec["name"], classes, labels, index, where(source))
    return rows, labels, all_snrs[rows], classes, index, len(all_labels)
