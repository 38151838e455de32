"""Dataset staging: a configured source -> canonical, stratified, leakage-checked HDF5 splits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rffm import provenance, synthetic
from rffm.dataset import SPLITS, content_ids, write_split
from rffm.errors import ConfigError, DataError
from rffm.progress import Progress
from rffm.sentinel import file_record, write_sentinel

DEFAULT_FRACTIONS = {"train": 0.6, "val": 0.2, "test": 0.2}


def synthetic_spec(options: dict[str, Any]) -> synthetic.SyntheticSpec:
    """Build the generator spec from a dataset's `synthetic:` block."""
    grid = options.get("snr_db", {"min": -20, "max": 18, "step": 2})
    snrs = list(np.arange(grid["min"], grid["max"] + grid["step"] / 2, grid["step"]).round(6).tolist())
    return synthetic.SyntheticSpec(
        classes=list(options.get("classes", synthetic.CLASSES)),
        snr_db=snrs,
        examples_per_class_snr=int(options.get("examples_per_class_snr", 100)),
        length=int(options.get("length", 128)),
        sps=int(options.get("sps", 8)),
        impairments=synthetic.Impairments(**options.get("impairments", {})),
    )


def load_synthetic(spec: dict[str, Any]) -> dict[str, Any]:
    """Generate the embedded synthetic source."""
    gen = synthetic_spec(spec.get("synthetic", {}))
    total = len(gen.classes) * len(gen.snr_db) * gen.examples_per_class_snr
    progress = Progress(f"stage_dataset {spec['name']}", total=total, unit="example")
    iq, labels, snr = synthetic.generate(gen, int(spec["seed"]), progress=progress.update)
    progress.close()
    return {
        "iq": iq,
        "label": labels,
        "snr_db": snr,
        "classes": gen.classes,
        "sample_rate": float(spec.get("sample_rate", 1.0)),
        "source": {"kind": "synthetic", "generator": "rffm.synthetic", **spec.get("synthetic", {})},
    }


SOURCES = {"synthetic": load_synthetic}


def stratified_split(labels: np.ndarray, snr_db: np.ndarray, fractions: dict[str, float], seed: int) -> dict[str, np.ndarray]:
    """Sorted row indices per split, stratified by (class, SNR) and deterministic from the seed."""
    rng = np.random.default_rng([seed, 1])
    strata = np.stack([labels.astype(np.float64), np.nan_to_num(snr_db.astype(np.float64), nan=-1e9)], axis=1)
    keys, inverse = np.unique(strata, axis=0, return_inverse=True)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    for stratum in range(len(keys)):
        rows = rng.permutation(np.flatnonzero(inverse.ravel() == stratum))
        n_test = int(round(len(rows) * fractions["test"]))
        n_val = int(round(len(rows) * fractions["val"]))
        parts["test"].append(rows[:n_test])
        parts["val"].append(rows[n_test : n_test + n_val])
        parts["train"].append(rows[n_test + n_val :])
    return {name: np.sort(np.concatenate(parts[name])).astype(np.int64) for name in SPLITS}


def check_fractions(fractions: dict[str, float]) -> dict[str, float]:
    """Validate split fractions: all three present, positive, summing to 1."""
    fractions = {**DEFAULT_FRACTIONS, **fractions}
    if any(fractions[name] <= 0 for name in SPLITS) or abs(sum(fractions[name] for name in SPLITS) - 1) > 1e-6:
        raise ConfigError(f"datasets.*.splits must give train, val and test fractions > 0 that sum to 1; got {fractions}")
    return fractions


def check_splits(name: str, classes: list[str], labels: np.ndarray, index: dict[str, np.ndarray], ids: np.ndarray) -> None:
    """Every class in every split, and no IQ content shared between splits."""
    for split, rows in index.items():
        missing = sorted(set(range(len(classes))) - set(np.unique(labels[rows]).tolist()))
        if missing:
            raise DataError(
                f"dataset {name!r}: split {split!r} has no examples of {[classes[i] for i in missing]}; "
                f"the source is too small for the requested split fractions. Fix: add examples or change datasets.{name}.splits."
            )
    seen: dict[bytes, str] = {}
    for split, rows in index.items():
        for content in ids[rows]:
            other = seen.setdefault(bytes(content), split)
            if other != split:
                raise DataError(
                    f"dataset {name!r}: content id {content.decode()} occurs in both {other!r} and {split!r} "
                    "(duplicate IQ across splits is leakage). Fix: deduplicate the source."
                )


def stage(spec: dict[str, Any], out_dir: str | Path) -> Path:
    """Stage one configured dataset into out_dir/{train,val,test}.h5 plus sentinel."""
    out_dir = Path(out_dir)
    started = provenance.start()
    source = spec.get("source")
    if source not in SOURCES:
        raise ConfigError(f"datasets.{spec['name']}.source: unknown source {source!r}; known: {', '.join(SOURCES)}")
    data = SOURCES[source](spec)
    fractions = check_fractions(spec.get("splits", {}))
    index = stratified_split(data["label"], data["snr_db"], fractions, int(spec["seed"]))
    ids = content_ids(data["iq"])
    check_splits(spec["name"], data["classes"], data["label"], index, ids)
    outputs = {}
    for split in SPLITS:
        rows = index[split]
        attrs = {
            "classes": data["classes"],
            "sample_rate": data["sample_rate"],
            "source": data["source"],
            "split": split,
            "split_seed": int(spec["seed"]),
            "dataset": spec["name"],
        }
        write_split(out_dir / f"{split}.h5", data["iq"][rows], data["label"][rows], data["snr_db"][rows], attrs)
        outputs[f"{split}.h5"] = file_record(out_dir / f"{split}.h5")
    extra = {
        "dataset": {
            "name": spec["name"],
            "source": source,
            "classes": data["classes"],
            "counts": {split: int(len(index[split])) for split in SPLITS},
        }
    }
    provenance.finish(out_dir / "provenance.json", "stage_dataset", started)
    return write_sentinel(out_dir, "stage_dataset", {"dataset": spec["name"]}, outputs, {}, spec, "staging", extra)
