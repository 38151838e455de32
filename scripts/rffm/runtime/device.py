"""Where a step computes: torch's threads and determinism, and the device a config's `device` names."""

from __future__ import annotations

import os

from rffm.errors import ConfigError

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
