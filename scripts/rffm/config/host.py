"""What this machine must provide (checked only where the caller says the workflow's files and jobs are here):
writable results and scratch, the imported files, the configured GPU. Nothing is ever created while checking."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rffm.backbone_kinds import IMPORTED
from rffm.model.pins import pin_problem
from rffm.records.files import sha256_file
from rffm.records.layout import BACKBONE_NAME


def _from_cwd(path: str) -> str:
    """Where a relative path starts from, for a Fix that names it."""
    return "" if os.path.isabs(path) else f" (relative paths start from {os.getcwd()})"


def unusable_directory(value: str) -> str | None:
    """Why a directory could not be created or written at value, or None; never creates anything."""
    path = Path(os.path.abspath(value))
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path} is a file, not a directory"
    ancestor = path
    while not os.path.exists(ancestor):  # the first ancestor that exists is where mkdir -p would start
        if os.path.lexists(ancestor):
            return f"{ancestor} is a broken symbolic link (to {os.readlink(ancestor)})"
        ancestor = ancestor.parent
    if not os.path.isdir(ancestor):
        return f"{path} lies under the file {ancestor}"
    if not os.access(ancestor, os.W_OK | os.X_OK):  # root passes unless the filesystem is read-only
        return f"{ancestor} is not writable" + ("" if ancestor == path else f", so {path} cannot be created")
    if (kind := _kernel_filesystem(ancestor)) is not None:  # root passes os.access there, but mkdir fails
        return f"{ancestor} is on the kernel's {kind} filesystem, where no directory can be made or written" + (
            "" if ancestor == path else f", so {path} cannot be created"
        )
    return None


# Filesystems the kernel fills itself: their modes say writable to root, but mkdir and new files fail (EPERM/ENOENT).
KERNEL_FILESYSTEMS = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs", "debugfs", "tracefs", "configfs", "pstore", "bpf"}


def _kernel_filesystem(path: Path) -> str | None:
    """The type of the kernel filesystem `path` lies on (its mount from /proc/self/mounts), None for ordinary storage."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    real, best, kind = os.path.realpath(path), "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind if kind in KERNEL_FILESYSTEMS else None


def directory_problems(config: dict[str, Any], keys: Iterable[str]) -> list[str]:
    """Configured directories that are files, lie under a file, or cannot be written."""
    problems = []
    for key in keys:
        value = config.get(key)
        if isinstance(value, str) and "://" not in value and (why := unusable_directory(value)):
            problems.append(f"{key}: {why}. Fix: set {key} to a directory you can write{_from_cwd(value)}")
    return problems


IMPORTED_FILE = {"checkpoint": BACKBONE_NAME, "python": "weights file", "export": ".pt2 program"}


def pinned_file_digest(path: str | Path) -> str:
    """The sha256 of an imported file, hashed once per process while its size and mtime stay (each plan reads it once)."""
    stat = os.stat(path)
    return _file_digest(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def imported_file_problems(config: dict[str, Any]) -> list[str]:
    """Backbone files that are not there or not the pinned bytes, and dataset source files that are not there."""
    from rffm.data.sources import input_files

    problems = []
    for name, spec in config["backbones"].items():
        path = spec.get("path")
        if spec["source"] not in IMPORTED or not path:
            continue
        if not Path(path).is_file():
            problems.append(
                f"backbones.{name}.path: {path} {'is a directory' if Path(path).is_dir() else 'does not exist'}. "
                f"Fix: point it at the {IMPORTED_FILE[spec['source']]} to import{_from_cwd(path)}"
            )
        elif spec.get("sha256") and (actual := pinned_file_digest(path)) != spec["sha256"]:
            problems.append(pin_problem(name, path, actual, spec["sha256"]))
    for name, spec in config["datasets"].items():
        key = f"datasets.{name}.{spec['source']}" + (".recordings" if spec["source"] == "sigmf" else ".path")
        for path in input_files({"name": name, **spec}):
            if not Path(path).exists():
                problems.append(f"{key}: {path} does not exist. Fix: point it at the source file{_from_cwd(path)}")
    return problems


def device_problems(device: str) -> list[str]:
    """A configured CUDA device that torch cannot see on this machine."""
    if not device.startswith("cuda"):
        return []
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index < count:
        return []
    build = f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}"
    seen = f"torch sees {count} GPU(s) here" if count else f"torch sees no GPU here ({build})"
    return [f"device: {device!r} but {seen}. Fix: set device: cpu (or auto), or run where that GPU is visible"]


def machine_errors(config: dict[str, Any], runs_here: bool, local_files: bool) -> list[str]:
    """What this machine must provide: writable results, imported files, and (when jobs run here) scratch and the GPU."""
    problems = []
    if local_files:
        problems += directory_problems(config, ("results", "checkpoint_store")) + imported_file_problems(config)
    if runs_here:
        problems += directory_problems(config, ("scratch",)) + device_problems(config["device"])
    return problems
