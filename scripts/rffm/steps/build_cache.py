"""build_cache: the frozen backbone once over train and val, kept as a node-local cache; its record in results.

The record (results/caches/<dataset>__<backbone>/sentinel.json) names the recipe — the dataset and
backbone sentinels, this code, and the encoder (input adapter, taps, keep option: rffm.model.encoder)
— and what the cache holds (classes, row shapes, tap layout); epochs link to it.
The cache itself lives under `scratch` on the node that trains (rffm.data.cache_local): the workflow never
tracks, uploads or deletes it, and an epoch that does not find it builds it the same way.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import h5py
import torch

from rffm.data.cache_local import ensure
from rffm.errors import ConfigError
from rffm.model import encoder as encoders
from rffm.records.layout import BACKBONE_NAME, CACHED_SPLITS, SENTINEL_NAME, split_file
from rffm.records.step import Step
from rffm.records.store import given_store, publish_trace
from rffm.runtime.profiling import PhaseTimes

RULE = "build_cache"
TRACE = "cache_build.trace.json"


def describe(
    weights: dict[str, Any], dataset: dict[str, Any], dataset_dir: Path, backbone_dir: Path, encoder: dict[str, Any]
) -> dict[str, Any]:
    """The record's facts: the backbone, the encoder and what the cache holds (row shapes from one probe batch on the CPU)."""
    backbone = weights["backbone"]
    where = f"backbones.{weights['key']['backbone']}"
    with h5py.File(dataset_dir / split_file("train"), "r") as handle:
        length = int(handle["iq"].shape[-1])
    adapter = encoder["adapter"]
    problem = encoders.length_problem(where, adapter, adapter.get("length"), length, dataset["key"]["dataset"])
    if problem:
        raise ConfigError(problem)
    model = encoders.load(backbone, backbone_dir / BACKBONE_NAME, encoder, where)
    shapes = model.tap_shapes(length)
    names = model.tap_names(len(shapes))
    row = encoders.row_shape(shapes)
    counts = dataset["dataset"]["counts"]
    return {
        "backbone_fingerprint": backbone["fingerprint"],
        "backbone": backbone,
        "encoder": {"fingerprint": model.identity, "spec": encoder, "where": where},  # "spec": the record's word for it
        "cache": {
            "classes": dataset["dataset"]["classes"],
            "dtype": "bfloat16",
            "input_length": length,
            "shapes": {split: [counts[split], *row] for split in CACHED_SPLITS},
            "taps": [{"name": name, "tokens": tokens, "dim": dim} for name, (tokens, dim) in zip(names, shapes, strict=True)],  # tap layout
        },
    }


def run(
    dataset_dir: str | Path,
    backbone_dir: str | Path,
    out_dir: str | Path,
    scratch: str | Path,
    *,
    batch_size: int,
    disk_headroom: float,
    encoder: dict[str, Any] | None = None,
    batch_profile: str | Path | None = None,
    device: str = "cpu",
    threads: int | None = None,
    store: str | Path | None = None,
    profile_runs: list[str] = (),
    profile_batches: int = 0,
    devices: list[str] | None = None,
) -> Path:
    """Write the cache record of one (dataset, backbone) into out_dir and build the cache itself under `scratch`.

    `encoder` says how the backbone is read (rffm.model.encoder.spec_for of the backbone's config; default: all tokens of
    the model's own outputs). With `profile_runs`, the first `profile_batches` batches are traced and the
    trace is published to each of those runs' profiling folders in the results store. Two or more `devices` (the GPUs
    the job holds: rffm.cli.steps.node_devices) build it data-parallel, one worker each, with the same bytes.
    """
    dataset_dir, backbone_dir = Path(dataset_dir), Path(backbone_dir)
    encoder = encoder or encoders.spec_for({})
    phases = PhaseTimes()
    with Step(RULE, out_dir, key={}, params=encoder, threads=threads) as step, tempfile.TemporaryDirectory() as traces:
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME, [split_file(s) for s in CACHED_SPLITS])
        weights = step.consume("backbone", backbone_dir / SENTINEL_NAME, [BACKBONE_NAME])
        step.key = {"dataset": dataset["key"]["dataset"], "backbone": weights["key"]["backbone"]}
        step.facts.update(describe(weights, dataset, dataset_dir, backbone_dir, encoder))
        record = {**step.identity(), **step.facts}  # the record as the epochs will read it
        step.device = torch.device(device)
        options = {"batch_size": batch_size, "disk_headroom": disk_headroom, "batch_profile": batch_profile, "device": device}
        options["devices"] = devices if devices and len(devices) > 1 else None
        trace = Path(traces) / TRACE if profile_runs else None
        directory, stats = ensure(record, step.out_dir, scratch, options, phases, trace, profile_batches)
        step.details = {"cache_dir": str(directory), "built": stats is not None, "phases": phases.as_dict()}
        step.details.update({key: value for key, value in (stats or {}).items() if key != "meta"})
        if trace is not None and trace.exists():
            for run in profile_runs:
                publish_trace(given_store(store, RULE), run, trace)
    return step.sentinel
