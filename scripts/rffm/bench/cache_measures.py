"""`rffm bench cache`'s measures: each stages, builds or times one thing and returns its figure (rffm.bench.cache
runs them side by side and prints the figures)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from rffm.backbone_kinds import RANDOM
from rffm.config import entry_defaults
from rffm.data import cache_plan, cache_reader
from rffm.data.cache_format import built_recipe, release_pages, split_count
from rffm.data.cache_reader import prefetched
from rffm.model import encoder as encoders
from rffm.model.taps import keep_options
from rffm.records.files import read_json
from rffm.records.layout import BACKBONE_NAME, CACHED_SPLITS, SENTINEL_NAME
from rffm.runtime import batching
from rffm.runtime.profiling import PhaseTimes
from rffm.steps import build_cache as build_cache_step
from rffm.steps import import_backbone, pretrain_backbone, stage_dataset
from rffm.training import epoch as train

CLASSES = 11
SNRS = 20
TRAIN = {"lr": 0.003, "batch_size": 128, "seed": 0}
ARCH = entry_defaults("backbones", {"source": RANDOM})["arch"]  # the schema's default backbone (the default run's)
EPOCH_THREADS = 1  # as the train_epoch rule: the head is too small for intra-op threads; the prefetcher takes the other core


def prepare(work: Path, samples: int, arch: dict[str, int] = ARCH, user: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Stage a synthetic dataset of about `samples` examples and a default-architecture backbone (or import `user`'s)."""
    per_key = max(5, round(samples / (CLASSES * SNRS)))  # at least one example per (class, SNR) in each split
    spec = {"name": "bench", "source": "synthetic", "seed": 1, "synthetic": {"examples_per_class_snr": per_key}}
    stage_dataset.run(entry_defaults("datasets", spec), work / "ds")
    if user is not None:
        kept = {key: value for key, value in user.items() if key not in ("adapter", "taps", "keep")}
        import_backbone.run(entry_defaults("backbones", {**kept, "name": "bench"}), work / "bb")
        return work / "ds", work / "bb"
    backbone_spec = {"name": "bench", "source": RANDOM, "dataset": "bench", "arch": arch, "pretrain": {"seed": 0}}
    pretrain_backbone.run(entry_defaults("backbones", backbone_spec), work / "ds", work / "bb")
    return work / "ds", work / "bb"


def load_encoder(backbone_dir: Path, spec: dict[str, Any], device: torch.device) -> encoders.Encoder:
    """The bench backbone behind its adapter and taps, as build_cache and qualify run it."""
    record = read_json(backbone_dir / SENTINEL_NAME)["backbone"]
    return encoders.load(record, backbone_dir / BACKBONE_NAME, spec, "backbones.bench", device)


def encode(model: encoders.Encoder, iq: torch.Tensor) -> torch.Tensor:
    """One batch of cache rows, as the cache build computes them."""
    return encoders.as_row(model.features(iq))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


def forward_only(dataset_dir: Path, model: encoders.Encoder, batch_size: int, device: torch.device) -> float:
    """Seconds to read train+val and run the backbone over them, outputs discarded."""
    started = time.perf_counter()
    for split in CACHED_SPLITS:
        with h5py.File(dataset_dir / f"{split}.h5", "r") as handle, torch.no_grad(), autocast(device):
            iq = handle["iq"]
            for start in range(0, iq.shape[0], batch_size):
                encode(model, torch.from_numpy(iq[start : start + batch_size]).to(device)).to(torch.bfloat16).cpu()
    synchronize(device)
    return time.perf_counter() - started


def build_cache(
    dataset_dir: Path, backbone_dir: Path, out: Path, batch_size: int, profile: Path | None = None, device: str = "cpu", spec=None
) -> float:
    """Seconds of a build_cache step (record and node-local cache, hashing included); its cache ends up in `out`."""
    headroom = entry_defaults("cache", {})["disk_headroom"]  # outside the timing: a per-process cost, like the imports
    options = {"batch_size": batch_size, "disk_headroom": headroom, "batch_profile": profile, "device": str(device)}
    scratch = out.with_name(out.name + ".scratch")
    started = time.perf_counter()
    build_cache_step.run(dataset_dir, backbone_dir, out.with_name(out.name + ".record"), scratch, encoder=spec, **options)
    elapsed = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    (scratch / "bench__bench").rename(out)
    return elapsed


def open_cache(cache_dir: Path) -> tuple[dict, dict]:
    """The splits of a cache this bench built (checked against its sentinel)."""
    return cache_reader.open_cache(cache_dir, built_recipe(cache_dir), "bench")


def head_steps(batches, head, optimizer) -> None:
    for hidden, labels in batches:
        loss = F.cross_entropy(head(hidden), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    loss.item()  # wait for the device


def fresh_head(meta: dict[str, Any], device: torch.device = torch.device("cpu")):
    torch.manual_seed(0)
    options = train.train_options(entry_defaults("runs", {"train": TRAIN}))
    head = train.make_head(meta, options).to(device)
    optimizer, _ = train.make_optimizer(head, options, 1)
    return head, optimizer


TAIL = {"blocks": 1, "lr": 0.001}  # tail adaptation measured: the backbone's last block trained beside the head


def tail_head(meta: dict[str, Any], backbone_dir: Path, device: torch.device = torch.device("cpu")):
    """A fresh head with the backbone's last block as its tail (train.tail), and its optimizer."""
    torch.manual_seed(0)
    options = train.train_options(entry_defaults("runs", {"train": {**TRAIN, "tail": TAIL}}))
    head = train.tail_head(meta, options, backbone_dir / BACKBONE_NAME, "bench").to(device)
    optimizer, _ = train.make_optimizer(head, options, 1)
    return head, optimizer


def tail_epoch(cache_dir: Path, backbone_dir: Path, device: torch.device = torch.device("cpu")) -> float:
    """Seconds for one epoch of tail adaptation reading the cache: train pass + validation pass."""
    splits, meta = open_cache(cache_dir)
    head, optimizer = tail_head(meta, backbone_dir, device)
    batches = epoch_orders(len(splits["train"]))
    started = time.perf_counter()
    head_steps(prefetched(splits["train"], batches, device, PhaseTimes()), head, optimizer)
    head_validation(prefetched(splits["val"], validation_batches(len(splits["val"])), device, PhaseTimes()), head)
    return time.perf_counter() - started


def epoch_orders(count: int) -> list[np.ndarray]:
    order = np.random.default_rng([0, 1]).permutation(count)
    return [order[start : start + TRAIN["batch_size"]] for start in range(0, count, TRAIN["batch_size"])]


def validation_batches(count: int) -> list[np.ndarray]:
    return [np.arange(start, min(start + 512, count)) for start in range(0, count, 512)]


def head_validation(batches, head) -> None:
    with torch.no_grad():
        for hidden, labels in batches:
            loss = F.cross_entropy(head(hidden), labels)
    loss.item()


def cached_epoch(cache_dir: Path, device: torch.device = torch.device("cpu")) -> float:
    """Seconds for one epoch of the head reading the cache: train pass + validation pass."""
    splits, meta = open_cache(cache_dir)
    head, optimizer = fresh_head(meta, device)
    batches = epoch_orders(len(splits["train"]))
    started = time.perf_counter()
    head_steps(prefetched(splits["train"], batches, device, PhaseTimes()), head, optimizer)
    val = validation_batches(len(splits["val"]))
    head_validation(prefetched(splits["val"], val, device, PhaseTimes()), head)
    return time.perf_counter() - started


def recompute_epoch(
    cache_dir: Path, dataset_dir: Path, model: encoders.Encoder, in_ram: bool = False, device: torch.device = torch.device("cpu")
) -> float:
    """Seconds for the same pass without a cache: read the signal records, run the backbone, train the head.

    With in_ram the IQ is loaded before timing, which leaves only the backbone's cost (a lower bound).
    """
    _, meta = open_cache(cache_dir)
    head, optimizer = fresh_head(meta, device)

    def recomputed(iq, labels, batches):
        for rows in batches:
            rows = np.sort(rows)
            with torch.no_grad(), autocast(device):
                hidden = encode(model, torch.from_numpy(iq[rows]).to(device)).to(torch.bfloat16).float()
            yield hidden, torch.from_numpy(labels[rows]).to(device)

    with h5py.File(dataset_dir / "train.h5", "r") as train_file, h5py.File(dataset_dir / "val.h5", "r") as val_file:
        train_labels, val_labels = train_file["label"][()], val_file["label"][()]
        train_iq = train_file["iq"][()] if in_ram else train_file["iq"]
        val_iq = val_file["iq"][()] if in_ram else val_file["iq"]
        started = time.perf_counter()
        head_steps(recomputed(train_iq, train_labels, epoch_orders(len(train_labels))), head, optimizer)
        head_validation(recomputed(val_iq, val_labels, validation_batches(len(val_labels))), head)
        return time.perf_counter() - started


def head_only(cache_dir: Path, device: torch.device = torch.device("cpu")) -> float:
    """Seconds for the head's compute alone (train + validation) on batches already in (device) memory."""
    splits, meta = open_cache(cache_dir)
    head, optimizer = fresh_head(meta, device)

    def resident(split, rows):
        hidden, labels = split.gather(rows)
        return hidden.to(device), labels.to(device)

    batches = [resident(splits["train"], rows) for rows in epoch_orders(len(splits["train"]))]
    val = [resident(splits["val"], rows) for rows in validation_batches(len(splits["val"]))]
    started = time.perf_counter()
    head_steps(batches, head, optimizer)
    head_validation(val, head)
    return time.perf_counter() - started


def cache_bytes_time(path: Path) -> float:
    """Seconds to read a cache file sequentially through a memory map (as warm as the epoch's reads)."""
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    buffer = np.empty(8 << 20, dtype=np.uint8)
    started = time.perf_counter()
    for start in range(0, len(mapped), len(buffer)):
        chunk = mapped[start : start + len(buffer)]
        buffer[: len(chunk)] = chunk
    elapsed = time.perf_counter() - started
    release_pages(mapped)
    return elapsed


def oom_probes(dataset_dir: Path, backbone_dir: Path, work: Path, limit: int, device: torch.device, spec=None) -> tuple[int, int]:
    """Out-of-memory probes of a cache build without and then with the profile it left behind."""
    profile = work / "oom-profile.json"
    profile.unlink(missing_ok=True)
    counts = []
    previous = os.environ.get(batching.INJECT_ENV)
    os.environ[batching.INJECT_ENV] = str(limit)
    try:
        for name in ("unseeded", "seeded"):
            build_cache(dataset_dir, backbone_dir, work / f"cache-{name}", 1024, profile, device, spec)
            stats = json.loads((work / f"cache-{name}.record/provenance.json").read_text())["batch_stats"]
            counts.append(sum(s["ooms"] for s in stats.values()))
    finally:
        if previous is None:
            os.environ.pop(batching.INJECT_ENV, None)
        else:
            os.environ[batching.INJECT_ENV] = previous
    return counts[0], counts[1]


def peak_rss_mb(phase: str, dataset_dir: Path, backbone_dir: Path, cache_dir: Path, threads: int, device: torch.device, spec=None) -> float:
    """Peak RSS of a fresh process doing only one phase (build or epoch)."""
    code = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from rffm.bench import cache_measures as b\n"
        f"phase, ds, bb, c = {phase!r}, Path({str(dataset_dir)!r}), Path({str(backbone_dir)!r}), Path({str(cache_dir)!r})\n"
        f"torch.set_num_threads({threads} if phase == 'build' else b.EPOCH_THREADS)\n"
        "open('/proc/self/clear_refs', 'w').write('5')  # reset the peak: measure the phase, not the imports\n"
        f"device = torch.device({str(device)!r})\n"
        f"spec = {spec!r}\n"
        "if phase == 'build': b.build_cache(ds, bb, c, 256, device=device, spec=spec)\n"
        "elif phase == 'epoch': b.cached_epoch(c, device)\n"
        "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, "RFFM_PLAIN_PROGRESS": "1"}
    )
    return int(result.stdout.strip().splitlines()[-1]) / 1024


def option_bytes(dataset_dir: Path, model: encoders.Encoder, spec: dict[str, Any]) -> dict[str, int]:
    """Exact cache bytes of this data for every keep option (the cache planner's numbers)."""
    counts = {split: split_count(dataset_dir / f"{split}.h5") for split in CACHED_SPLITS}
    with h5py.File(dataset_dir / "train.h5", "r") as handle:
        length = int(handle["iq"].shape[-1])
    every = encoders.Encoder(model.model, model.fingerprint, {**spec, "keep": "all"}, model.where, model.native_layers, model.length)
    pooled = spec["taps"]["form"] == "pooled"
    raw_shapes = [(tokens, width, pooled) for tokens, width in every.tap_shapes(length)]
    classes = read_json(dataset_dir / SENTINEL_NAME)["dataset"]["classes"]
    return cache_plan.option_sizes(counts, raw_shapes, spec, classes, keep_options(int(spec["taps"]["prefix"]), spec["keep"]))
