"""`rffm bench cache`: the hidden-state cache measured side by side against its physical limits.

P1 = epoch recomputing the backbone / epoch from the cache           (how much the cache saves)
P2 = epoch from the cache / (cache bytes / memmap read bandwidth + head-only compute)
                                                                      (distance from the I/O + compute floor)
P3 = cache build / backbone forward only with outputs discarded      (what writing the cache costs)
P5 = out-of-memory probes with a seeded batch profile / without      (what the profile saves)
P6 = tail-adaptation epoch from the cache / head-only epoch from the cache   (what training the last block adds)
P7 = epoch recomputing the backbone / tail-adaptation epoch from the cache  (what the cache still saves with a tail)
rss_1x_mb, rss_4x_mb: peak RSS of the cache build and of an epoch at 1x and 4x the data (flat = bounded memory)

Every figure is measured in this run, on the default backbone architecture (or, with --config, that
config's backbone: a user's `python` or `export` backbone) and the default run's training settings.
Each timing is the fastest of interleaved repeats: on a shared machine other
processes only ever add time, so the minimum is the least disturbed measurement. The last line
printed is one JSON object. The measures are rffm.bench.cache_measures'; this module runs and prints them.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import h5py
import torch

from rffm.backbone_kinds import USER_CODE
from rffm.bench.cache_measures import (
    ARCH,
    EPOCH_THREADS,
    build_cache,
    cache_bytes_time,
    cached_epoch,
    forward_only,
    head_only,
    load_encoder,
    oom_probes,
    option_bytes,
    peak_rss_mb,
    prepare,
    recompute_epoch,
    tail_epoch,
)
from rffm.config import entry_defaults
from rffm.model.taps import spec_for
from rffm.records.layout import CACHED_SPLITS, hidden_file


def with_threads(count: int, measure):
    """Run a measure with torch limited to `count` intra-op threads."""

    def measured() -> float:
        previous = torch.get_num_threads()
        torch.set_num_threads(count)
        try:
            return measure()
        finally:
            torch.set_num_threads(previous)

    return measured


def fastest_of(repeats: int, *measures) -> list[float]:
    """Run each measure `repeats` times, interleaved, and return the fastest time of each."""
    samples: list[list[float]] = [[] for _ in measures]
    for _ in range(repeats):
        for index, measure in enumerate(measures):
            samples[index].append(measure())
    return [min(values) for values in samples]


def run(
    samples: int,
    work: Path,
    threads: int,
    repeats: int,
    oom_limit: int,
    arch: dict[str, int] = ARCH,
    device: str = "cpu",
    user: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every figure of the benchmark, measured in this run (on `user`'s backbone when given: a config's backbone entry).

    Longer than 60 lines on purpose: one measurement protocol read top to bottom, each figure next to what it timed."""
    device = torch.device(device)
    torch.set_num_threads(threads)
    os.environ.setdefault("RFFM_PLAIN_PROGRESS", "1")
    os.environ.setdefault("RFFM_PROGRESS_INTERVAL", "3600")
    dataset_dir, backbone_dir = prepare(work / "1x", samples, arch, user)
    spec = spec_for(user or {})
    model = load_encoder(backbone_dir, spec, device)
    cache_dir = work / "1x" / "cache"
    forward_only(dataset_dir, model, 256, device)  # warm-up: page cache, allocator, kernels
    t_forward, t_build = fastest_of(
        repeats,
        lambda: forward_only(dataset_dir, model, 256, device),
        lambda: build_cache(dataset_dir, backbone_dir, cache_dir, 256, device=device, spec=spec),
    )
    tail_fits = user is None and arch["output_layers"] >= 2  # rffm's own blocks, the last one's input cached
    tail = [with_threads(EPOCH_THREADS, lambda: tail_epoch(cache_dir, backbone_dir, device))] if tail_fits else []
    t_recompute, t_recompute_ram, t_cached, t_head, *t_tail = fastest_of(
        repeats,
        lambda: recompute_epoch(cache_dir, dataset_dir, model, device=device),
        lambda: recompute_epoch(cache_dir, dataset_dir, model, in_ram=True, device=device),
        with_threads(EPOCH_THREADS, lambda: cached_epoch(cache_dir, device)),
        with_threads(EPOCH_THREADS, lambda: head_only(cache_dir, device)),
        *tail,
    )
    cache_files = [cache_dir / hidden_file(split) for split in CACHED_SPLITS]
    cache_bytes = sum(path.stat().st_size for path in cache_files)
    bandwidth = max(cache_bytes / sum(cache_bytes_time(path) for path in cache_files) for _ in range(repeats))
    floor = cache_bytes / bandwidth + t_head
    unseeded, seeded = oom_probes(dataset_dir, backbone_dir, work / "1x", oom_limit, device, spec)
    options = option_bytes(dataset_dir, model, spec)

    dataset_4x, backbone_4x = prepare(work / "4x", 4 * samples, arch, user)
    rss = {"python_torch_baseline_mb": peak_rss_mb("none", dataset_dir, backbone_dir, work / "none", threads, device)}
    for scale, (ds, bb) in {"1x": (dataset_dir, backbone_dir), "4x": (dataset_4x, backbone_4x)}.items():
        target = work / scale / "rss-cache"
        rss[f"build_{scale}_mb"] = peak_rss_mb("build", ds, bb, target, threads, device, spec)
        rss[f"epoch_{scale}_mb"] = peak_rss_mb("epoch", ds, bb, target, threads, device, spec)
    return {
        "P1": round(t_recompute / t_cached, 2),
        "P2": round(t_cached / floor, 2),
        "P3": round(t_build / t_forward, 3),
        "P5": round(seeded / unseeded, 3) if unseeded else None,
        "P6": round(t_tail[0] / t_cached, 2) if t_tail else None,
        "P7": round(t_recompute / t_tail[0], 2) if t_tail else None,
        "rss_1x_mb": round(max(rss["build_1x_mb"], rss["epoch_1x_mb"]), 1),
        "rss_4x_mb": round(max(rss["build_4x_mb"], rss["epoch_4x_mb"]), 1),
        "detail": {
            "samples_1x": int(
                h5py.File(dataset_dir / "train.h5", "r")["label"].shape[0] + h5py.File(dataset_dir / "val.h5", "r")["label"].shape[0]
            ),
            "threads": threads,
            "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
            "repeats": repeats,
            "epoch_recompute_s": round(t_recompute, 4),
            "epoch_recompute_iq_in_ram_s": round(t_recompute_ram, 4),
            "P1_iq_in_ram": round(t_recompute_ram / t_cached, 2),
            "P1_ceiling_if_cache_reads_were_free": round(t_recompute / t_head, 2),
            "epoch_cached_s": round(t_cached, 4),
            "head_only_s": round(t_head, 4),
            "epoch_tail_s": round(t_tail[0], 4) if t_tail else None,
            "tail_blocks": 1 if t_tail else None,
            "cache_bytes": cache_bytes,
            "epoch_threads": EPOCH_THREADS,
            "backbone_arch": arch if user is None else {"source": user["source"], **{k: user[k] for k in ("python",) if k in user}},
            "keep": spec["keep"],
            "cache_bytes_by_keep": options,
            "memmap_read_gb_s": round(bandwidth / 1e9, 3),
            "io_plus_compute_floor_s": round(floor, 4),
            "cache_build_s": round(t_build, 4),
            "forward_only_s": round(t_forward, 4),
            "oom_probes_unseeded": unseeded,
            "oom_probes_seeded": seeded,
            "oom_injected_above": oom_limit,
            **{k: round(v, 1) for k, v in rss.items()},
        },
    }


def main(
    samples: int = 22000,
    work_dir: str | None = None,
    threads: int = 2,
    repeats: int = 5,
    oom_limit: int = 100,
    arch: dict | None = None,
    device: str = "cpu",
    config: str | None = None,
) -> int:
    """Run the benchmark and print a readable summary, then the JSON line."""
    user = user_backbone(config) if config else None
    with tempfile.TemporaryDirectory(prefix="rffm-bench-", dir=work_dir) as tmp:
        result = run(samples, Path(tmp), threads, repeats, oom_limit, {**ARCH, **(arch or {})}, device, user)
    d = result["detail"]
    print(
        f"P1 epoch recomputing backbone / epoch from cache: {d['epoch_recompute_s']:.3f}s / {d['epoch_cached_s']:.3f}s = {result['P1']}"
        f" (ceiling if cache reads were free: {d['P1_ceiling_if_cache_reads_were_free']}; backbone {d['backbone_arch']})"
    )
    print(
        f"P2 epoch from cache / (cache bytes / memmap bandwidth + head-only compute): {d['epoch_cached_s']:.3f}s / "
        f"({d['cache_bytes'] / 1e6:.1f} MB / {d['memmap_read_gb_s']:.2f} GB/s + {d['head_only_s']:.3f}s) = {result['P2']}"
    )
    print(f"P3 cache build / forward only: {d['cache_build_s']:.3f}s / {d['forward_only_s']:.3f}s = {result['P3']}")
    if result["P6"] is not None:
        print(
            f"P6 tail-adaptation epoch (last block + head) / head-only epoch, both from the cache: {d['epoch_tail_s']:.3f}s / "
            f"{d['epoch_cached_s']:.3f}s = {result['P6']}; P7 epoch recomputing the backbone / tail epoch: "
            f"{d['epoch_recompute_s']:.3f}s / {d['epoch_tail_s']:.3f}s = {result['P7']}"
        )
    print(
        f"P5 OOM probes seeded / unseeded (injected above {d['oom_injected_above']} rows): "
        f"{d['oom_probes_seeded']} / {d['oom_probes_unseeded']} = {result['P5']}"
    )
    print(
        f"peak RSS MB: build {d['build_1x_mb']} -> {d['build_4x_mb']} (4x data), epoch {d['epoch_1x_mb']} -> {d['epoch_4x_mb']} (4x data);"
        f" python+torch after imports {d['python_torch_baseline_mb']}"
    )
    sizes = ", ".join(f"{option} {size / 1e6:.1f} MB" for option, size in d["cache_bytes_by_keep"].items())
    print(f"cache bytes by keep option (train + val, exact): {sizes}; this cache: {d['keep']}")
    print(json.dumps(result, sort_keys=True))
    return 0


def user_backbone(path: str) -> dict[str, Any]:
    """The backbone of a config file (its one backbone, or the first one of source python or export), schema defaults filled."""
    from rffm import config as rffm_config

    backbones = rffm_config.read(path).get("backbones", {})
    chosen = [spec for spec in backbones.values() if spec.get("source") in USER_CODE] or list(backbones.values())
    if not chosen:
        raise SystemExit(f"{path}: no backbones. Fix: pass a config with a backbones: entry (e.g. config/examples/wavesfm_like.yaml)")
    return entry_defaults("backbones", {"name": "bench", **chosen[0]})
