"""Where a step computes: torch's threads and determinism, and the device a config's `device` names."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from rffm.errors import ConfigError
from rffm.records.layout import DEVICE_LOCKS
from rffm.runtime import devices as node_devices

# Set by schedulers (SLURM) or by the rffm-googlebatch executor when a job was given GPUs.
GPU_GRANT_VARS = ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "RFFM_GPUS_REQUESTED")


def setup(threads: int) -> None:
    """Fixed intra-op threads and deterministic algorithms: bit-identical CPU results."""
    import torch

    torch.set_num_threads(threads)
    # The eager flag alone: torch.use_deterministic_algorithms also sets torch._inductor's, and importing the
    # compiler stack for it is ~1.6 s of every step's start-up; rffm never compiles (torch.compile) a model.
    torch._C._set_deterministic_algorithms(True, warn_only=True)


def granted_gpus() -> str | None:
    """The GPUs the scheduler says this job was given, if it says so."""
    return next((f"{name}={os.environ[name]}" for name in GPU_GRANT_VARS if os.environ.get(name, "0") not in ("", "0")), None)


def resolve(name: str) -> str:
    """'auto' -> cuda when torch sees a GPU, else cpu; a GPU the job was given but torch cannot see is an error."""
    import torch

    available = torch.cuda.is_available()
    granted = granted_gpus()
    if granted and not available and name != "cpu":
        raise ConfigError(
            f"device {name!r}: this job was given a GPU ({granted}) but torch sees none "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}). "
            "Fix: run a CUDA build of torch in the job's environment or image, and make the GPU visible to it "
            "(on Google Batch the VM installs the driver; check `nvidia-smi` in the job log)."
        )
    if name == "auto":
        return "cuda" if available else "cpu"
    if name.startswith("cuda") and not available:
        raise ConfigError(f"device {name!r}: no CUDA GPU is visible here. Fix: set `device: cpu` (or auto), or run on a GPU node.")
    return name


def visible_gpus() -> list[str]:
    """The GPUs this job sees (on SLURM the ones its allocation gives it, renumbered from 0)."""
    import torch

    return [f"cuda:{index}" for index in range(torch.cuda.device_count())]


def lock_directory(scratch: str | Path) -> Path:
    """The node-local folder of this job's device locks: one per SLURM job, whose GPU numbers are its own (two jobs
    on one node both see a cuda:0); one per node elsewhere (a Batch VM, this machine)."""
    return Path(scratch) / DEVICE_LOCKS / os.environ.get("SLURM_JOB_ID", "node")


@contextlib.contextmanager
def pinned(device: str, scratch: str | Path, every: bool = False, visible: Sequence[str] | None = None) -> Iterator[list[str]]:
    """The devices a job of a group job computes on, held for the block: for a bare `cuda`, one GPU of its own (with
    `every`, a cache build: every free GPU, at least one), waiting while the others hold them all; any other device
    (cpu, cuda:N the config names) as it is, nothing held."""
    if device != "cuda":
        yield [device]
        return
    gpus = visible_gpus() if visible is None else list(visible)
    directory = lock_directory(scratch)
    lease = node_devices.acquire_free(gpus, directory) if every else node_devices.acquire(gpus, directory)
    with lease:
        yield lease.devices
