"""`rffm unlock`: remove the lock a killed Snakemake left in its working directory, and only that.

Snakemake locks a working directory for the duration of a run and asks for `--unlock` after a
crash. This command does it safely: only when the lock was taken on this host (the workflow's
`onstart` handler records the host, rffm.ops.unlock.record_owner) and no process on this host
still runs snakemake or an rffm step in that directory. Otherwise it explains why not.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

OWNER_FILE = "rffm-lock-owner"


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


def record_owner(workdir: str | Path) -> None:
    """Note which host holds the lock of the run that is starting (called from the workflow's onstart)."""
    state = Path(workdir) / ".snakemake"
    state.mkdir(parents=True, exist_ok=True)
    (state / OWNER_FILE).write_text(socket.gethostname() + "\n")


def clear_stale_lock(workdir: str | Path) -> str:
    """Remove a dead run's lock files; say what was done, or why nothing was."""
    state = Path(workdir) / ".snakemake"
    locks = sorted((state / "locks").glob("*.lock")) if (state / "locks").is_dir() else []
    if not locks:
        return f"{workdir}: not locked"
    if not Path("/proc").is_dir():
        return f"{workdir}: locked; cannot tell whether its run is alive here (no /proc). Fix: if nothing runs, `snakemake --unlock`"
    owner_file = state / OWNER_FILE
    owner = owner_file.read_text().strip() if owner_file.exists() else None
    if owner != socket.gethostname():
        return f"{workdir}: locked by a run on host {owner or 'unknown'}; left alone. Fix: if nothing runs there, `snakemake --unlock`"
    live = live_workflow_processes(workdir)
    if live:
        return f"{workdir}: locked by a live run (pid {', '.join(map(str, live))}); left alone"
    for lock in locks:
        lock.unlink(missing_ok=True)
    return f"{workdir}: removed the lock of a killed run ({state / 'locks'}); `snakemake` reruns its incomplete jobs"
