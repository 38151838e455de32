"""Recover from a killed Snakemake: remove its working-directory lock when no process holds it.

Snakemake locks a working directory for the duration of a run and tells the user to run
`--unlock` after a crash. After SIGKILL or a power loss this module makes the next run
proceed on its own, but only when the lock was taken on this host and no process on this
host (Snakemake, or an rffm step it started) still works in that directory.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

HOST_FILE = "rffm-lock-host"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def live_workflow_processes(workdir: str | Path) -> list[int]:
    """PIDs on this host (besides this one) running snakemake or rffm in workdir."""
    target = os.path.realpath(workdir)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.readlink(entry / "cwd") != target:
                continue
        except OSError:
            continue
        command = _cmdline(int(entry.name))
        if "snakemake" in command or "rffm" in command:
            found.append(int(entry.name))
    return found


def clear_stale_lock(workdir: str | Path) -> str | None:
    """Remove a dead run's lock files and say so; record this host as the next lock's owner."""
    if not Path("/proc").is_dir():
        return None
    state = Path(workdir) / ".snakemake"
    locks = sorted((state / "locks").glob("*.lock")) if (state / "locks").is_dir() else []
    host_file = state / HOST_FILE
    message = None
    if locks:
        owner = host_file.read_text().strip() if host_file.exists() else None
        if owner != socket.gethostname() or live_workflow_processes(workdir):
            return None  # a live or foreign run: let Snakemake report the lock as usual
        for lock in locks:
            lock.unlink(missing_ok=True)
        message = f"rffm: removed a stale Snakemake lock in {state / 'locks'} (its run was killed); incomplete jobs will rerun"
    state.mkdir(parents=True, exist_ok=True)
    host_file.write_text(socket.gethostname() + "\n")
    return message
