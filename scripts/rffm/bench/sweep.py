"""`rffm bench sweep`: a sweep of K heads against the same K heads as K separate runs, each arm run by the workflow.

Both arms run as the workflow runs them: the real Snakemake scheduler (workflow/Snakefile, target
validation_selection) at the same `--cores`, on one working folder whose dataset, backbone and hidden-state
cache are made first (not timed). The sweep arm is one run with `sweep:` (one epoch job per epoch trains all
K members); the separate arm is K plain runs in one config, one per member's settings (K epoch jobs per
epoch, which the scheduler runs side by side as the cores allow). Each arm's wall time is the clock around
its scheduler run (Snakemake's start, its DAG, every epoch, selection and validation-report job). Bytes are
measured in the epoch jobs and read from their provenance: the bytes the reader copied out of the mapped
cache (rffm.data.cache_reader counts them at the gather), and each job's process I/O counters (rchar: bytes
read through read(), which include the job's check of every cache byte against its sentinel; read_bytes:
bytes fetched from storage). Data: the default config's synthetic dataset size and backbone architecture
(random weights: the heads' work does not depend on them), or `--config`'s first run's dataset, backbone
and train block (the tests use config/examples/tiny.yaml). Reported:

    wall_ratio   = sweep arm's scheduler run / separate arm's (wall clock; goal <= 0.4)
    bytes_ratio  = bytes the sweep's epoch jobs copied out of the mapped cache / the separate runs' (goal 1/K)
    checkpoints_identical = every member's last checkpoint equals its separate run's, field by field and
                   tensors bit for bit, apart from the two fields that carry the run's name (run, params_sha256)

The bench exits 1 when a member's checkpoint differs from its separate run's. The last line printed is one JSON
object.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from rffm.backbone_kinds import RANDOM
from rffm.bench import work_folder
from rffm.bench.cache_measures import ARCH, CLASSES, SNRS
from rffm.bench.scheduled import jobs_run, scheduler_run
from rffm.records.files import read_json
from rffm.records.layout import CHECKPOINT_NAME, METRICS_NAME, PROVENANCE_NAME, SENTINEL_NAME, cache_folder, epoch_folder
from rffm.training import sweep

TRAIN = {"lr": 0.003, "batch_size": 128, "seed": 0}  # the default run's
GRID = {"train.lr": [0.001, 0.003, 0.01, 0.03], "train.weight_decay": [0.0, 0.01]}  # 8 members
SWEEP_RUN = "sweep"
NAMED_FIELDS = ("run", "params_sha256")  # checkpoint fields that carry the run's name (params_sha256: its step params)
FACTS = "bench_sweep.json"  # the arms' measured facts, in the work folder (conclude reads them)


def bench_config(samples: int, epochs: int, threads: int, device: str, like: str | None) -> dict[str, Any]:
    """The workflow config both arms share, without runs: a synthetic dataset of about `samples` examples and a
    default-architecture random backbone, or `like`'s first run's dataset and backbone; "train": the runs' train block."""
    if like:
        given = yaml.safe_load(Path(like).read_text())
        first = next(iter(given["runs"].values()))
        dataset, backbone = given["datasets"][first["dataset"]], given["backbones"][first["backbone"]]
        train = {key: value for key, value in first["train"].items() if key != "epochs"}
        settings = {key: given[key] for key in ("threads", "cache") if key in given}
    else:
        per_key = max(5, round(samples / (CLASSES * SNRS)))  # at least one example per (class, SNR) in each split
        dataset = {"source": "synthetic", "seed": 1, "synthetic": {"examples_per_class_snr": per_key}}
        backbone = {"source": RANDOM, "dataset": "bench", "arch": ARCH, "pretrain": {"seed": 0}}
        train, settings = dict(TRAIN), {}
    backbone = {**backbone, "dataset": "bench"}
    train = {**train, "epochs": epochs}
    common = {"results": "results", "scratch": "scratch", "epoch_threads": threads, "device": device, **settings}
    return {**common, "datasets": {"bench": dataset}, "backbones": {"bench": backbone}, "train": train}


def arm_runs(base: dict[str, Any], grid: dict[str, list[Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{arm: runs}: the sweep (one run of K members) and the K separate plain runs, one per member, in grid order."""
    run = {"dataset": "bench", "backbone": "bench", "train": base["train"], "export": False}
    spec = {"run": SWEEP_RUN, **run, "sweep": grid}
    separate = {f"separate{i}": {**run, "train": sweep.member_spec(spec, m)["train"]} for i, m in enumerate(sweep.members(spec))}
    return {"sweep": {SWEEP_RUN: {**run, "sweep": grid}}, "separate": separate}


def epoch_io(results: Path, runs: list[str], epochs: int) -> dict[str, int]:
    """The arm's epoch jobs' measured reads, summed: bytes copied out of the mapped cache and the process I/O counters."""
    total = {"jobs": 0, "cache_bytes": 0, "rchar": 0, "read_bytes": 0}
    for run in runs:
        for epoch in range(1, epochs + 1):
            details = read_json(results / epoch_folder(run, epoch) / PROVENANCE_NAME)
            total["jobs"] += 1
            total["cache_bytes"] += details["cache_bytes_read"]
            total["rchar"] += details.get("process_io", {}).get("rchar", 0)
            total["read_bytes"] += details.get("process_io", {}).get("read_bytes", 0)
    return total


def difference(a: Any, b: Any, where: str = "checkpoint") -> str | None:
    """Where two loaded checkpoints first differ (tensors bit for bit), None when equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        return next((found for key in a if (found := difference(a[key], b[key], f"{where}.{key}"))), None)
    if isinstance(a, list | tuple) and type(a) is type(b):
        if len(a) != len(b):
            return f"{where}: {len(a)} != {len(b)} items"
        return next((found for i, (x, y) in enumerate(zip(a, b, strict=True)) if (found := difference(x, y, f"{where}[{i}]"))), None)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}"
        bits = [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
        return None if torch.equal(*bits) else f"{where}: tensors differ"
    return None if type(a) is type(b) and a == b else f"{where}: {a!r} != {b!r}"


def member_difference(member: bytes, separate: bytes) -> str | None:
    """Where a sweep member's checkpoint differs from its separate run's, apart from the fields naming the run."""
    loaded = [torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True) for raw in (member, separate)]
    for checkpoint in loaded:
        for name in NAMED_FIELDS:
            checkpoint.pop(name, None)
    return difference(*loaded)


def conclude(work: Path) -> int:
    """Compare every member's last checkpoint with its separate run's, print the figures (the last line JSON);
    1 when one differs. Reads the facts main() left in `work` and the arms' results there."""
    facts = read_json(work / FACTS)
    results, epochs, runs = work / "results", facts["epochs"], facts["runs"]
    bundle = results / epoch_folder(SWEEP_RUN, epochs) / CHECKPOINT_NAME
    differing = {}
    for member, run in zip(facts["members"], runs["separate"], strict=True):
        separate = (results / epoch_folder(run, epochs) / CHECKPOINT_NAME).read_bytes()
        if found := member_difference(sweep.read_member(bundle, member, CHECKPOINT_NAME), separate):
            differing[member] = found
    read = {arm: epoch_io(results, list(runs[arm]), epochs) for arm in ("sweep", "separate")}
    wall = facts["wall_s"]
    table = json.loads((results / epoch_folder(SWEEP_RUN, epochs) / METRICS_NAME).read_text())["members"]
    best = max(table, key=lambda name: table[name]["val_accuracy"])
    result = {
        "bench": "sweep",
        "members": len(facts["members"]),
        "epochs": epochs,
        "samples": facts["samples"],
        "device": facts["device"],
        "cores": facts["cores"],
        "sweep_s": round(wall["sweep"], 2),
        "separate_s": round(wall["separate"], 2),
        "wall_ratio": round(wall["sweep"] / wall["separate"], 3),
        "sweep_jobs": facts["jobs"]["sweep"],
        "separate_jobs": facts["jobs"]["separate"],
        "sweep_cache_bytes": read["sweep"]["cache_bytes"],
        "separate_cache_bytes": read["separate"]["cache_bytes"],
        "bytes_ratio": round(read["sweep"]["cache_bytes"] / read["separate"]["cache_bytes"], 4),
        "sweep_io_rchar": read["sweep"]["rchar"],
        "separate_io_rchar": read["separate"]["rchar"],
        "io_rchar_ratio": round(read["sweep"]["rchar"] / read["separate"]["rchar"], 4) if read["separate"]["rchar"] else None,
        "sweep_io_read_bytes": read["sweep"]["read_bytes"],
        "separate_io_read_bytes": read["separate"]["read_bytes"],
        "checkpoints_identical": not differing,
        "differing_members": differing,
        "best_member_last_epoch": best,
        "best_val_accuracy_last_epoch": round(table[best]["val_accuracy"], 4),
    }
    print(
        f"wall (snakemake --cores {facts['cores']}): sweep {result['sweep_s']} s / {len(runs['separate'])} runs {result['separate_s']} s "
        f"= {result['wall_ratio']} (goal <= 0.4)"
    )
    print(
        f"cache bytes copied out of the map: {result['sweep_cache_bytes']} / {result['separate_cache_bytes']} = {result['bytes_ratio']} "
        f"(goal {1 / len(facts['members']):.4f}); epoch jobs' rchar {result['sweep_io_rchar']} / {result['separate_io_rchar']}"
    )
    for member, found in differing.items():
        print(
            f"{bundle}: member {member} differs from its separate run ({found}): a sweep member must train exactly as its "
            "plain run. Fix: rerun with --keep, compare the two runs' epoch folders, and report it as a bug.",
            file=sys.stderr,
        )
    print(json.dumps(result))
    return 1 if differing else 0


def main(
    samples: int,
    epochs: int,
    work_dir: str | None,
    threads: int,
    device: str,
    cores: int = 2,
    grid: dict[str, list[Any]] | None = None,
    like: str | None = None,
    keep: bool = False,
) -> int:
    """Make the dataset, backbone and cache once, then each arm by the scheduler; print the figures, the last line as JSON."""
    with work_folder("rffm-bench-sweep-", work_dir, keep) as work:
        base = bench_config(samples, epochs, threads, device, like)
        runs = arm_runs(base, grid or GRID)
        common = {key: value for key, value in base.items() if key != "train"}
        scheduler_run(work, {**common, "runs": runs["sweep"]}, cores, f"results/{cache_folder('bench', 'bench')}/{SENTINEL_NAME}")
        wall, jobs = {}, {}
        for arm in ("sweep", "separate"):
            wall[arm], output = scheduler_run(work, {**common, "runs": runs[arm]}, cores, "validation_selection")
            jobs[arm] = jobs_run(output)
            print(f"{arm}: {wall[arm]:.1f} s, jobs {jobs[arm]}", flush=True)
        members = [m["name"] for m in sweep.members({"run": SWEEP_RUN, "sweep": grid or GRID})]
        facts = {
            "epochs": epochs,
            "samples": None if like else samples,
            "device": device,
            "cores": cores,
            "members": members,
            "wall_s": wall,
            "jobs": jobs,
        }
        (work / FACTS).write_text(json.dumps({**facts, "runs": {arm: list(names) for arm, names in runs.items()}}))
        return conclude(work)
