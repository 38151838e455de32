"""Non-deterministic facts about where and how a step ran (kept out of sentinels)."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

from rffm.files import atomic_write_json

# Environment variables that identify the executor and its job, in priority order.
EXECUTOR_JOB_VARS = (
    ("slurm", "SLURM_JOB_ID"),
    ("googlebatch", "BATCH_JOB_ID"),
    ("vertex", "CLOUD_ML_JOB_ID"),
)


def executor_identity() -> dict[str, str | None]:
    """Executor kind and provider job id, from the environment the provider sets."""
    if os.environ.get("RFFM_EXECUTOR"):
        return {"executor": os.environ["RFFM_EXECUTOR"], "job_id": os.environ.get("RFFM_JOB_ID")}
    for kind, variable in EXECUTOR_JOB_VARS:
        if os.environ.get(variable):
            return {"executor": kind, "job_id": os.environ[variable]}
    return {"executor": "local", "job_id": None}


def device_name(device: Any = None) -> str:
    """Human-readable device: the GPU model, or the CPU."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def start() -> dict[str, float]:
    """Mark the start of a step."""
    return {"wall": time.time(), "perf": time.perf_counter()}


def finish(path: str | Path, rule: str, started: dict[str, float], device: Any = None, extra: dict | None = None) -> dict:
    """Write the step's provenance file and return it."""
    record = {
        "rule": rule,
        **executor_identity(),
        "host": socket.gethostname(),
        "device": device_name(device),
        "image": os.environ.get("RFFM_CONTAINER_IMAGE"),
        "started_unix": round(started["wall"], 3),
        "duration_s": round(time.perf_counter() - started["perf"], 3),
        "python": sys.version.split()[0],
        "pid": os.getpid(),
        **(extra or {}),
    }
    atomic_write_json(path, record)
    return record
