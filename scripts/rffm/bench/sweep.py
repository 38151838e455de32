"""`rffm bench sweep`: a sweep of K heads against the same K heads as K separate runs, side by side in one run.

Both arms run the real `rffm train_epoch` command once per epoch job, as the workflow's rule does
(a fresh process each: Python and torch start, the cache record and the node's cache are checked,
the cache is read): the sweep arm runs one job per epoch training all K members, the separate arm
K jobs per epoch, one per member, each a plain run of that member's settings. The epochs of the two
arms are interleaved (epoch e of the sweep, then epoch e of every separate run), so a machine whose
load drifts slows both alike. Data: the default config's synthetic dataset size and backbone
architecture (random weights: the heads' work does not depend on them). Reported:

    wall_ratio   = sweep's epoch jobs / separate runs' epoch jobs (wall time; goal <= 0.4)
    bytes_ratio  = cache bytes the sweep's jobs read / the separate runs' (goal 1/K)
    identical    = every member's last checkpoint equals (bytes) its separate run's

The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rffm.bench.cache_measures import ARCH, prepare
from rffm.config import entry_defaults
from rffm.records.files import read_json
from rffm.records.layout import CHECKPOINT_NAME, METRICS_NAME, PROVENANCE_NAME, cache_folder, epoch_folder, epochs_folder
from rffm.steps import build_cache as build_cache_step
from rffm.training import sweep

TRAIN = {"lr": 0.003, "batch_size": 128, "seed": 0}  # the default run's
GRID = [["train.lr", [0.001, 0.003, 0.01, 0.03]], ["train.weight_decay", [0.0, 0.01]]]  # 8 members


def epoch_job(spec: dict[str, Any], record: Path, epoch: int, results: Path, scratch: Path, memo: Path, threads: int, device: str) -> float:
    """Seconds of one `rffm train_epoch` process, as the rule runs it (in the results tree `results`)."""
    out = results / epochs_folder(spec["run"])
    command = [str(Path(sys.executable).with_name("rffm")), "train_epoch", "--spec", json.dumps(spec), "--threads", str(threads)]
    command += ["--epoch", str(epoch), "--cache-record-dir", str(record), "--device", device, "--scratch", str(scratch)]
    command += ["--store", str(results), f"--memo-store={memo}", "--batch-size", "256", "--disk-headroom", "0"]
    command += ["--out-dir", str(out / str(epoch))] + (["--previous-dir", str(out / str(epoch - 1))] if epoch > 1 else [])
    members = sweep.plan_label(spec)
    command += ["--members", members] if members else []
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "RFFM_PLAIN_PROGRESS": "1"})
    return time.perf_counter() - started


def bytes_read(out: Path, epochs: int) -> int:
    return sum(read_json(out / str(e) / PROVENANCE_NAME)["cache_bytes_read"] for e in range(1, epochs + 1))


def main(samples: int, epochs: int, work_dir: str | None, threads: int, device: str, grid: list | None = None) -> int:
    """Build the cache once, then both arms epoch by epoch; print the figures, the last line as JSON."""
    grid = grid or GRID
    work = Path(tempfile.mkdtemp(prefix="rffm-bench-sweep-", dir=work_dir))
    try:
        dataset_dir, backbone_dir = prepare(work, samples, ARCH)  # the default run's backbone: the schema's default
        record, scratch = work / "results" / cache_folder("bench", "bench"), work / "scratch"
        cache = entry_defaults("cache", {})
        build_cache_step.run(dataset_dir, backbone_dir, record, scratch, batch_size=cache["batch_size"], disk_headroom=0)
        base = entry_defaults("runs", {"run": "sweep", "dataset": "bench", "backbone": "bench", "train": dict(TRAIN)})
        spec = {**base, "sweep": grid}
        members = sweep.members(spec)
        # each separate run is the plain run of one member's settings, same run name, in a results tree of its own
        alone = [(sweep.member_spec(spec, m), work / f"separate-{i}/results") for i, m in enumerate(members)]
        swept = work / "results" / epochs_folder("sweep")
        wall = {"sweep": 0.0, "separate": 0.0}
        for epoch in range(1, epochs + 1):
            wall["sweep"] += epoch_job(spec, record, epoch, work / "results", scratch, work / "memo-sweep", threads, device)
            for i, (one, tree) in enumerate(alone):
                wall["separate"] += epoch_job(one, record, epoch, tree, scratch, work / f"memo-{i}", threads, device)
            print(f"epoch {epoch}: sweep {wall['sweep']:.1f} s, separate {wall['separate']:.1f} s (cumulative)", flush=True)
        read = {"sweep": bytes_read(swept, epochs), "separate": sum(bytes_read(tree / epochs_folder("sweep"), epochs) for _, tree in alone)}
        last = swept / str(epochs) / CHECKPOINT_NAME
        identical = all(
            sweep.read_member(last, m["name"], CHECKPOINT_NAME) == (tree / epoch_folder("sweep", epochs) / CHECKPOINT_NAME).read_bytes()
            for m, (_, tree) in zip(members, alone, strict=True)
        )
        table = json.loads((swept / str(epochs) / METRICS_NAME).read_text())["members"]
        best = max(table, key=lambda name: table[name]["val_accuracy"])
        result = {
            "bench": "sweep",
            "members": len(members),
            "epochs": epochs,
            "samples": samples,
            "device": device,
            "sweep_s": round(wall["sweep"], 2),
            "separate_s": round(wall["separate"], 2),
            "wall_ratio": round(wall["sweep"] / wall["separate"], 3),
            "sweep_cache_bytes": read["sweep"],
            "separate_cache_bytes": read["separate"],
            "bytes_ratio": round(read["sweep"] / read["separate"], 4),
            "checkpoints_identical": identical,
            "best_member_last_epoch": best,
            "best_val_accuracy_last_epoch": round(table[best]["val_accuracy"], 4),
        }
        print(f"wall: sweep {result['sweep_s']} s / {len(members)} runs {result['separate_s']} s = {result['wall_ratio']} (goal <= 0.4)")
        print(f"cache bytes read: {read['sweep']} / {read['separate']} = {result['bytes_ratio']} (goal {1 / len(members):.4f})")
        print(json.dumps(result))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
