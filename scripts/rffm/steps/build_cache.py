"""build_cache: run the frozen backbone once over train and val and store BF16 hidden states (rffm.data.cache)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import torch

from rffm.data.cache import cache_split, check_disk_budget, preallocate, split_count
from rffm.model import backbone
from rffm.records.files import atomic_write_json
from rffm.records.layout import CACHED_SPLITS, SENTINEL_NAME, hidden_file, split_file
from rffm.records.sentinel import array_record
from rffm.records.step import Step
from rffm.runtime import batching
from rffm.runtime.profiling import BatchTracer, PhaseTimes
from rffm.runtime.progress import Progress

RULE = "build_cache"


def run(
    dataset_dir: str | Path,
    backbone_dir: str | Path,
    out_dir: str | Path,
    provenance_path: str | Path,
    *,
    batch_size: int,
    disk_headroom: float,
    full_hash: bool = False,
    batch_profile: str | Path | None = None,
    device: str = "cpu",
    profile_dirs: list[str | Path] | None = None,
    profile_batches: int = 0,
) -> Path:
    """Build the cache of one (dataset, backbone) into out_dir; batch sizes and devices never change its bytes."""
    dataset_dir, backbone_dir = Path(dataset_dir), Path(backbone_dir)
    device = torch.device(device)
    phases = PhaseTimes()
    # the key and params are filled in once the consumed sentinels are read: they name the dataset and backbone
    with Step(RULE, out_dir, key={}, params={}, provenance_path=provenance_path) as step:
        out_dir = step.out_dir
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME, [split_file(s) for s in CACHED_SPLITS], anonymous=True)
        backbone_sentinel = step.consume("backbone", backbone_dir / SENTINEL_NAME, ["backbone.pt"], anonymous=True)
        step.key = {"dataset": dataset["key"]["dataset"], "backbone": backbone_sentinel["key"]["backbone"]}
        step.device = device
        model = backbone.load(backbone_dir / "backbone.pt", device)
        arch = model.arch
        counts = {split: split_count(dataset_dir / split_file(split)) for split in CACHED_SPLITS}
        if disk_headroom > 0:
            check_disk_budget(out_dir, sum(counts.values()) * arch.tokens * arch.dim * 2, disk_headroom)
        profile = batching.BatchProfile(batch_profile)
        key = batching.profile_key(model.fingerprint, (2, arch.length), "float32", batching.device_context(device))
        controller = batching.AdaptiveBatch(maximum=batch_size)
        seeded = profile.seed(key, controller)
        profile_dirs = [Path(d) for d in profile_dirs or []]
        tracer = BatchTracer(profile_dirs[0] / "cache_build.trace.json" if profile_dirs else None, profile_batches, phases)
        progress = Progress(RULE, total=sum(counts.values()), unit="example")
        stats = {}
        for split in CACHED_SPLITS:
            shape = (counts[split], arch.tokens, arch.dim)
            path = out_dir / hidden_file(split)
            with phases.phase("preallocation"):
                target = preallocate(path, shape)
            stats[split] = cache_split(model, dataset_dir / split_file(split), target, controller, phases, tracer, progress, device)
            with phases.phase("fsync"):
                del target
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            with h5py.File(dataset_dir / split_file(split), "r") as handle:
                np.save(out_dir / f"{split}.labels.npy", handle["label"][()])
                np.save(out_dir / f"{split}.snr.npy", handle["snr_db"][()])
            step.output(hidden_file(split), array_record(path, shape, "bfloat16", full_hash=full_hash))
            step.output(f"{split}.labels.npy")
            step.output(f"{split}.snr.npy")
        tracer.close()
        progress.close()
        if controller.largest_good:
            profile.remember(key, controller, controller.largest_good, {"input_shape": [2, arch.length], **batching.device_context(device)})
        meta = {
            "backbone_fingerprint": model.fingerprint,
            "classes": dataset["dataset"]["classes"],
            "dtype": "bfloat16",
            "shapes": {split: [counts[split], arch.tokens, arch.dim] for split in CACHED_SPLITS},
        }
        atomic_write_json(out_dir / "meta.json", meta)
        step.output("meta.json")
        for directory in profile_dirs:
            directory.mkdir(parents=True, exist_ok=True)
            if directory != profile_dirs[0] and tracer.path and tracer.path.exists():
                shutil.copyfile(tracer.path, directory / tracer.path.name)
        step.details = {"batch_size_max": batch_size, "batch_stats": stats, "profile_seeded": seeded, "phases": phases.as_dict()}
        step.facts["backbone_fingerprint"] = model.fingerprint
    return step.sentinel
