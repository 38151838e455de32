"""Optional TensorBoard event logs of per-epoch metrics (tensorboardX: `pip install 'rffm[tensorboard]'`).

Each train_epoch job appends its epoch's scalars when a log directory is set in the environment
(AIP_TENSORBOARD_LOG_DIR on Vertex AI, else RFFM_TENSORBOARD_DIR); `rffm tensorboard` writes the
same scalars for every finished epoch of a results tree. Event files hold wall times, so they are
side outputs like provenance: never in a sentinel, never a reason to rerun anything.
"""

from __future__ import annotations

import os
import posixpath
import sys
from pathlib import Path
from typing import Any

from rffm.records.layout import EPOCHS, RUNS, SENTINEL_NAME
from rffm.records.sentinel import read_sentinel

ENV_VARS = ("AIP_TENSORBOARD_LOG_DIR", "RFFM_TENSORBOARD_DIR")
SCALARS = {
    "loss/train": "train_loss",
    "loss/val": "val_loss",
    "accuracy/train": "train_accuracy",
    "accuracy/val": "val_accuracy",
    "macro_f1/val": "val_macro_f1",
    "lr": "lr",
}


def log_dir_from_env() -> str | None:
    """The TensorBoard log directory the environment asks for, if any."""
    return next((os.environ[name] for name in ENV_VARS if os.environ.get(name)), None)


def write_epochs(log_dir: str, run: str, epochs: list[dict[str, Any]]) -> str:
    """Append per-epoch scalars (step = epoch) under log_dir/run; return that directory."""
    from tensorboardX import SummaryWriter

    run_dir = posixpath.join(str(log_dir), run)  # posixpath keeps gs:// and s3:// prefixes intact
    epochs = sorted(epochs, key=lambda m: m["epoch"])
    first = epochs[0]["epoch"] if epochs else 0
    # purge_step: TensorBoard hides older events from this epoch on, so a rerun epoch replaces its points;
    # the suffix keeps two epochs finishing within the same second from sharing (overwriting) one file
    writer = SummaryWriter(logdir=run_dir, purge_step=first or None, flush_secs=1, filename_suffix=f".epoch{first}-{len(epochs)}")
    try:
        for metrics in epochs:
            for tag, key in SCALARS.items():
                if key in metrics:
                    writer.add_scalar(tag, float(metrics[key]), global_step=int(metrics["epoch"]))
    finally:
        writer.close()
    return run_dir


def log_epoch(run: str, metrics: dict[str, Any]) -> str | None:
    """Write one epoch's scalars when the environment sets a log directory; never fail the epoch for it."""
    log_dir = log_dir_from_env()
    if log_dir is None:
        return None
    try:
        return write_epochs(log_dir, run, [metrics])
    except ImportError:
        print(
            f"rffm: TensorBoard logging asked for by {'/'.join(ENV_VARS)} but tensorboardX is not installed; "
            "skipped. Fix: pip install 'rffm[tensorboard]'",
            file=sys.stderr,
        )
    except Exception as exc:  # a logging side output must not lose a finished epoch
        print(f"rffm: could not write TensorBoard events to {log_dir}: {exc}", file=sys.stderr)
    return None


def export(results_dir: str | Path, log_dir: str) -> dict[str, int]:
    """Write every finished epoch of every run under results_dir; return epochs written per run."""
    written = {}
    runs = Path(results_dir) / RUNS
    for run_dir in sorted(d for d in runs.iterdir() if d.is_dir()) if runs.is_dir() else []:
        by_run: dict[str, list] = {}
        for path in (run_dir / EPOCHS).glob(f"*/{SENTINEL_NAME}"):
            body = read_sentinel(path)
            for member, entry in body.get("members", {}).items():  # a sweep: one log per member
                by_run.setdefault(f"{run_dir.name}/{member}", []).append(entry["metrics"])
            if "metrics" in body:
                by_run.setdefault(run_dir.name, []).append(body["metrics"])
        for name, epochs in sorted(by_run.items()):
            write_epochs(log_dir, name, epochs)
            written[name] = len(epochs)
    return written
