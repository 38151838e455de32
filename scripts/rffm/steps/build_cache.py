"""build_cache: the frozen backbone once over train and val, kept as a node-local memo; its record in results.

The record (results/caches/<dataset>__<backbone>/sentinel.json) names the recipe — the dataset and
backbone sentinels and this code — and what the cache holds (classes, shapes); epochs link to it.
The cache itself lives under `scratch` on the node that trains (rffm.data.cache): the workflow never
tracks, uploads or deletes it, and an epoch that does not find it builds it the same way.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from rffm.data import cache
from rffm.model.backbone import BackboneArch
from rffm.records.layout import CACHED_SPLITS, SENTINEL_NAME, split_file
from rffm.records.step import Step
from rffm.records.store import open_store, publish_trace
from rffm.runtime.profiling import PhaseTimes

RULE = "build_cache"
TRACE = "cache_build.trace.json"


def run(
    dataset_dir: str | Path,
    backbone_dir: str | Path,
    out_dir: str | Path,
    scratch: str | Path,
    *,
    batch_size: int,
    disk_headroom: float,
    batch_profile: str | Path | None = None,
    device: str = "cpu",
    store: str | Path | None = None,
    profile_runs: list[str] = (),
    profile_batches: int = 0,
) -> Path:
    """Write the cache record of one (dataset, backbone) into out_dir and build its memo under `scratch`.

    With `profile_runs`, the first `profile_batches` batches are traced and the trace is published to
    each of those runs' profiling folders in the results store.
    """
    dataset_dir, backbone_dir = Path(dataset_dir), Path(backbone_dir)
    phases = PhaseTimes()
    with Step(RULE, out_dir, key={}, params={}) as step, tempfile.TemporaryDirectory() as traces:
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME, [split_file(s) for s in CACHED_SPLITS])
        weights = step.consume("backbone", backbone_dir / SENTINEL_NAME, ["backbone.pt"])
        step.key = {"dataset": dataset["key"]["dataset"], "backbone": weights["key"]["backbone"]}
        arch = BackboneArch(**weights["backbone"]["arch"])
        counts = dataset["dataset"]["counts"]
        step.facts["backbone_fingerprint"] = weights["backbone"]["fingerprint"]
        step.facts["cache"] = {
            "classes": dataset["dataset"]["classes"],
            "dtype": "bfloat16",
            "shapes": {split: [counts[split], *arch.feature_shape] for split in CACHED_SPLITS},
        }
        record = {**step.identity(), **step.facts}  # the record as the epochs will read it
        step.device = torch.device(device)
        options = {"batch_size": batch_size, "disk_headroom": disk_headroom, "batch_profile": batch_profile, "device": device}
        trace = Path(traces) / TRACE if profile_runs else None
        directory, stats = cache.ensure(record, step.out_dir, scratch, options, phases, trace, profile_batches)
        step.details = {"memo": str(directory), "built": stats is not None, "phases": phases.as_dict()}
        step.details.update({key: value for key, value in (stats or {}).items() if key != "meta"})
        if trace is not None and trace.exists():
            for run in profile_runs:
                publish_trace(open_store(store or step.out_dir.parents[1]), run, trace)
    return step.sentinel
