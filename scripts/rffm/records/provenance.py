"""Non-deterministic facts about where and how a step ran (kept out of sentinels).

A provenance file is sealed like a sentinel (the sha256 of its content is inside) and names the
sentinel it accompanies by that sentinel's sha256: the run manifest and the profiling summary read
provenance, so a damaged one, or one of another computation put back, is refused rather than reported.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rffm.errors import IntegrityError
from rffm.records.files import atomic_write_bytes, sha256_bytes, sha256_file
from rffm.records.layout import PROVENANCE_NAME, SENTINEL_NAME, results_root
from rffm.records.seal import seal, unseal, verify_fix

# Environment variables that identify the executor and its job, in priority order.
EXECUTOR_JOB_VARS = (
    ("slurm", "SLURM_JOB_ID"),
    ("googlebatch", "BATCH_JOB_ID"),
    ("vertex", "CLOUD_ML_JOB_ID"),
)


# Further facts each provider sets about where a job runs (recorded when present).
PROVIDER_VARS = {
    "slurm": (
        "SLURM_CLUSTER_NAME",
        "SLURM_JOB_PARTITION",
        "SLURM_JOB_ACCOUNT",
        "SLURM_JOB_NODELIST",
        "SLURM_STEP_ID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_RESTART_COUNT",
    ),
    "googlebatch": ("BATCH_TASK_INDEX", "BATCH_TASK_COUNT", "BATCH_TASK_RETRY_ATTEMPT"),
    "vertex": ("CLOUD_ML_TRIAL_ID",),
}
# Container runtimes that announce the image they run (Apptainer/Singularity, e.g. Snakemake's
# --software-deployment-method apptainer); other runtimes need RFFM_CONTAINER_IMAGE.
CONTAINER_VARS = ("RFFM_CONTAINER_IMAGE", "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")


def executor_identity() -> dict[str, str | None]:
    """Executor kind and provider job id, from the environment the provider sets."""
    if os.environ.get("RFFM_EXECUTOR"):
        return {"executor": os.environ["RFFM_EXECUTOR"], "job_id": os.environ.get("RFFM_JOB_ID")}
    for kind, variable in EXECUTOR_JOB_VARS:
        if os.environ.get(variable):
            return {"executor": kind, "job_id": os.environ[variable]}
    return {"executor": "local", "job_id": None}


def provider_details(executor: str) -> dict[str, str]:
    """Provider-specific facts about the job (partition, node list, task index...), as the provider sets them."""
    return {name: os.environ[name] for name in PROVIDER_VARS.get(executor, ()) if os.environ.get(name)}


def container_image() -> str | None:
    """The container image this step runs in, when one is used and known."""
    return next((os.environ[name] for name in CONTAINER_VARS if os.environ.get(name)), None)


def visible_gpus() -> list[str]:
    """Models of the GPUs this job can see (torch when already loaded, else nvidia-smi), empty on CPU-only nodes."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except RuntimeError:
            return []
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1") or shutil.which("nvidia-smi") is None:
        return []
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def device_name(device: Any = None) -> str:
    """Human-readable device: the GPU model, or the CPU."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def peak_rss_mb() -> float:
    """The largest resident set this process (or a child it waited for) has had so far, in MB (10^6 bytes)."""
    import resource

    kib = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return round(kib * 1024 / 1e6, 1)


def start() -> dict[str, float]:
    """Mark the start of a step."""
    return {"wall": time.time(), "perf": time.perf_counter()}


def describe(rule: str, started: dict[str, float], device: Any = None, extra: dict | None = None) -> dict[str, Any]:
    """The provenance record of a step that is finishing now."""
    identity = executor_identity()
    return {
        "rule": rule,
        **identity,
        "provider": provider_details(identity["executor"]),
        "host": socket.gethostname(),
        "device": device_name(device),
        "gpus": visible_gpus(),
        "image": container_image(),
        "started_unix": round(started["wall"], 3),
        "duration_s": round(time.perf_counter() - started["perf"], 3),
        "python": sys.version.split()[0],
        "pid": os.getpid(),
        "peak_rss_mb": peak_rss_mb(),
        **(extra or {}),
    }


def write(path: str | Path, record: dict[str, Any], sentinel: bytes) -> None:
    """Write a provenance record, sealed and linked to the bytes of the sentinel it accompanies."""
    atomic_write_bytes(path, seal({**record, "sentinel_sha256": sha256_bytes(sentinel)}))


def check(where: str | Path, data: bytes | None, sentinel: bytes | None, sentinel_name: str | Path = "its sentinel") -> dict[str, Any]:
    """A provenance record from its bytes after checking its seal and, given a sentinel's bytes, that it belongs to that sentinel."""
    if data is None:
        raise IntegrityError(f"{where}: provenance is missing. Fix: {_rewrite(where)}")
    record = unseal(where, data, "provenance")
    if sentinel is not None and record.get("sentinel_sha256") != sha256_bytes(sentinel):
        raise IntegrityError(
            f"{where}: provenance of another run of the step than {sentinel_name} (put back or copied). Fix: {_rewrite(where)}"
        )
    return record


def _rewrite(where: str | Path) -> str:
    """The fix of a step folder's missing or foreign provenance: the command that runs its step again, which writes both
    (its sentinel comes back byte for byte); elsewhere (a memo entry), `rffm verify`'s line for it."""
    folder = Path(where).parent
    if results_root(folder) is None:
        return verify_fix(where)
    from rffm.records.rebuild import rebuild_command  # reads the plan records: only when a fix is printed

    return rebuild_command(folder / SENTINEL_NAME, remove=True)


def read(path: str | Path, sentinel_path: str | Path | None = None) -> dict[str, Any]:
    """A provenance record after checking its seal (and that it belongs to `sentinel_path`); one clear error otherwise."""
    path = Path(path)
    data = path.read_bytes() if path.exists() else None
    if sentinel_path is None:
        return check(path, data, None)
    sentinel_path = Path(sentinel_path)
    sentinel = sentinel_path.read_bytes() if sentinel_path.exists() else b""  # a missing sentinel matches no record
    return check(path, data, sentinel, sentinel_path)


def partial_output_problems(directory: Path, sentinel: dict[str, Any], record: dict[str, Any], names: list[str] | None = None) -> list[str]:
    """Outputs a sentinel vouches for only in part (JSON without its non-deterministic keys) whose bytes differ from the
    full sha256 the provenance `record` beside it holds (the non-deterministic part edited, or another run's file put back)."""
    full = record.get("outputs_sha256") if isinstance(record.get("outputs_sha256"), dict) else {}
    problems = []
    for name, output in sentinel["outputs"].items():
        path = Path(directory) / name
        if "excluding" not in output or (names is not None and name not in names) or not path.exists():
            continue
        if full.get(name) != sha256_file(path):
            kept = ", ".join(output["excluding"]) if isinstance(output["excluding"], list) else output["excluding"]
            problems.append(f"{path}: its {kept} differ from the file {Path(directory) / PROVENANCE_NAME} recorded (edited or put back)")
    return problems
