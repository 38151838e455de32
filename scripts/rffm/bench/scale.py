"""`rffm bench scale`: RadioML 2018 size end to end, its cost predicted before each size runs and measured after.

For each fraction of RadioML 2018.01A's size (2,555,904 examples of 1,024 IQ samples: 24 classes x 26 SNRs x 4,096),
smallest first: a file in its exact HDF5 layout (X float32 [N, 1024, 2], Y one-hot, Z SNR; seeded noise rows, all
distinct) is written, then the real workflow (`snakemake --cores <cores>`, the default local profile) stages it,
caches it with the default backbone architecture (frozen random weights: a forward costs what a pretrained one does;
`keep: mean`, the cache plan workflow/docs/performance.md recommends at this size: 512 bytes per example instead of
64 KiB) and trains, selects and qualifies a grid of `runs` runs of `epochs` epochs on that cache. Every job takes all
the cores (threads and epoch_threads = --cores), as a cluster job has its allocation to itself: two epochs sharing
the cores each take longer by an amount that depends on what ran beside them, which no throughput record can predict.

Before a size runs, its plan is costed (rffm.plan.cost) from the throughput record of the sizes before it (`rffm
throughput` of their trees); the first size has none. After it ran: per stage the work, the measured seconds (each
job's provenance), throughput, the largest peak RSS of its jobs, predicted against measured; the disk the plan says
the staged data set and the cache take against what they take (allocated blocks); wall and CPU seconds of the whole
scheduler run. The full / (1/8) cost ratio compares CPU seconds (linear: 8). Each size's tree is removed once measured
(disk: the full size's source and staged copy take 42 GB). The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

from rffm.bench import require_idle, work_folder
from rffm.bench.scheduled import snakemake, write_config
from rffm.bench.staging import LENGTH, STRATA, generate
from rffm.config import entry_defaults
from rffm.data import cache_plan
from rffm.model.taps import spec_for
from rffm.plan import cost
from rffm.records.layout import SENTINEL_NAME, cache_folder, dataset_folder, qualification_folder

FULL_PER_STRATUM = 4096  # RadioML 2018.01A: 4,096 examples per (modulation, SNR)
DATASET, BACKBONE = "rml2018", "default"
RSS_LIMIT_MB = 2 * 2**30 / 1e6
TARGETS = {"peak_rss_mb": round(RSS_LIMIT_MB, 1), "disk_error": 0.05, "full_over_eighth": 9.0, "prediction_error": 0.25}


def scale_config(work: Path, source: Path, runs: int, epochs: int, record: Path | None, cores: int = 2) -> dict[str, Any]:
    """The workflow config of one size: the file as a radioml2018 dataset, the default backbone, `runs` seeds, every
    job on all `cores`."""
    train = {"epochs": epochs, "lr": 0.003, "batch_size": 256}
    config: dict[str, Any] = {
        "results": "results",
        "scratch": str(work / "scratch"),
        "threads": cores,
        "epoch_threads": cores,  # every job has the cores to itself: its seconds are its own, not its neighbour's
        "device": "cpu",
        "datasets": {DATASET: {"source": "radioml2018", "seed": 0, "radioml2018": {"path": str(source)}}},
        "backbones": {BACKBONE: {"source": "random", "dataset": DATASET, "keep": "mean"}},
        "runs": {
            f"grid{i + 1}": {"dataset": DATASET, "backbone": BACKBONE, "train": {**train, "seed": i}, "export": False} for i in range(runs)
        },
    }
    if record is not None:
        config["throughput"] = str(record)
    return config


def filled(config: dict[str, Any]) -> dict[str, Any]:
    """The config with the schema's defaults, as the workflow reads it."""
    from rffm.config import check

    return check(config)


def staged_bytes(counts: dict[str, int], length: int) -> int:
    """Bytes the staged splits take: per example its IQ (float32 [2, L]), label (int64), SNR (float32), content id (32)."""
    return sum(count * (length * 2 * 4 + 8 + 4 + 32) for count in counts.values())


def planned_disk(config: dict[str, Any], results: str) -> dict[str, int]:
    """What the plan says the staged data set and the cache take, in bytes."""
    counts, length = cost.dataset_size(config, results, DATASET)
    backbone = config["backbones"][BACKBONE]
    raw = cache_plan.native_raw_shapes(backbone, length)
    classes = [str(i) for i in range(24)]
    keep = backbone["keep"]
    return {
        "dataset": staged_bytes(counts, length),
        "cache": cache_plan.option_sizes(counts, raw, spec_for(backbone), classes, [keep])[keep],
    }


def allocated(folder: Path) -> int:
    """Bytes the files under `folder` take on disk (allocated blocks)."""
    return sum(path.lstat().st_blocks * 512 for path in folder.rglob("*") if path.is_file())


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_size(work: Path, fraction: Fraction, runs: int, epochs: int, cores: int, record: Path) -> dict[str, Any]:
    """Generate, plan, run and measure one size; its figures (the record gains its jobs)."""
    work.mkdir(parents=True)
    per_stratum = max(5, round(FULL_PER_STRATUM * fraction))
    rows = per_stratum * STRATA
    started = time.perf_counter()
    source = work / "source.hdf5"
    source_bytes = generate(source, rows, seed=int(fraction.denominator))
    generated_s = time.perf_counter() - started
    config = scale_config(work, source, runs, epochs, record if record.is_file() else None, cores)
    configfile = write_config(work / "config.yaml", config)
    full = filled(config)
    jobs, _ = cost.planned_jobs(full, str(work / "results"))
    predicted = cost.predict(jobs, cost.fit(cost.read_record(record)), "cpu") if record.is_file() else [None] * len(jobs)
    dry = snakemake(work, configfile, cores, ["-n", "--quiet", "rules"])
    plan_notes = [line for line in dry.splitlines() if line.startswith("note: cost:")]
    disk_planned = planned_disk(full, str(work / "results"))
    cpu_before, started = cpu_seconds(), time.perf_counter()
    snakemake(work, configfile, cores, [f"results/{qualification_folder(run)}/{SENTINEL_NAME}" for run in config["runs"]])
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu_before
    stages = cost.by_stage(jobs, predicted, work / "results")
    for row in stages:
        row["throughput_per_s"] = round(row["work"] / row["measured_s"], 1) if row.get("measured_s") else None
        if row["predicted_s"] is not None:
            row["predicted_s"] = round(row["predicted_s"], 2)
        row["measured_s"] = round(row.get("measured_s", 0.0), 2)
    disk_used = {
        "dataset": allocated(work / "results" / dataset_folder(DATASET)),
        "cache": allocated(work / "scratch" / Path(cache_folder(DATASET, BACKBONE)).name),
    }
    cost.write_record(record, cost.record_points(work / "results", jobs))
    return {
        "fraction": str(fraction),
        "examples": rows,
        "source_bytes": source_bytes,
        "generated_s": round(generated_s, 1),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "stages": stages,
        "plan_notes": plan_notes,
        "disk_planned": disk_planned,
        "disk_used": disk_used,
        "disk_error": round(sum(disk_used.values()) / sum(disk_planned.values()) - 1, 4),
        "peak_rss_mb": max(row.get("peak_rss_mb") or 0.0 for row in stages),
    }


def checks(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """The acceptance figures: largest peak RSS, largest disk error, full / (1/8) CPU and wall, prediction errors."""
    by_fraction = {size["fraction"]: size for size in sizes}
    result: dict[str, Any] = {
        "peak_rss_mb": max(size["peak_rss_mb"] for size in sizes),
        "disk_error": max(abs(size["disk_error"]) for size in sizes),
    }
    if "1" in by_fraction and "1/8" in by_fraction:
        full, eighth = by_fraction["1"], by_fraction["1/8"]
        result["full_over_eighth_cpu"] = round(full["cpu_s"] / eighth["cpu_s"], 2)
        result["full_over_eighth_wall"] = round(full["wall_s"] / eighth["wall_s"], 2)
    errors = {}
    for size in sizes:
        for row in size["stages"]:
            if row["predicted_s"] and row["measured_s"]:
                errors.setdefault(size["fraction"], {})[row["stage"]] = round(row["measured_s"] / row["predicted_s"] - 1, 3)
    result["prediction_error"] = errors
    return result


def main(
    fractions: list[str], runs: int, epochs: int, cores: int, work_dir: str | None = None, keep: bool = False, shared: bool = False
) -> int:
    """Run each size smallest first; print each one's figures, the last line JSON. Unless `shared`, refuse to start
    while other schedulers share the cores."""
    parsed = sorted(Fraction(text) for text in fractions)
    if not shared:
        require_idle("scale")
    parent = Path(work_dir) if work_dir else Path.cwd()
    parent.mkdir(parents=True, exist_ok=True)
    sizes = []
    with work_folder(".rffm-bench-scale-", parent, keep) as work:
        record = work / "throughput.json"
        for fraction in parsed:
            folder = work / f"size-{fraction.numerator}-{fraction.denominator}"
            size = one_size(folder, fraction, runs, epochs, cores, record)
            sizes.append(size)
            print(f"size {fraction}: {size['examples']} examples, {size['wall_s']} s wall, {size['cpu_s']} CPU-s", flush=True)
            print(cost.render_stages(size["stages"], "the sizes before" if size["fraction"] != str(parsed[0]) else None), flush=True)
            print(f"disk planned {size['disk_planned']} used {size['disk_used']} ({size['disk_error']:+.2%})", flush=True)
            if not keep:  # the ledger's entries are immutable: released first
                from rffm.ops.clean import release_immutable

                release_immutable([folder])
                shutil.rmtree(folder, ignore_errors=True)
        points = json.loads(record.read_text())["points"]
    result = {
        "bench": "scale",
        "full_size": {"examples": FULL_PER_STRATUM * STRATA, "length": LENGTH},
        "runs": runs,
        "epochs": epochs,
        "cores": cores,
        "cpus": os.cpu_count(),
        "shared": shared,
        "backbone": entry_defaults("backbones", {"source": "random", "dataset": DATASET, "keep": "mean"})["arch"],
        "sizes": sizes,
        "checks": checks(sizes),
        "targets": TARGETS,
        "throughput_points": len(points),
    }
    print(json.dumps(result, sort_keys=True))
    return 0
