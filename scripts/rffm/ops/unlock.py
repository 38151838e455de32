"""`rffm unlock`: remove the lock a killed Snakemake left in its working directory, and only that.

Snakemake locks a working directory for the duration of a run and asks for `--unlock` after a
crash. This command does it safely: only when the lock was taken on this host (the workflow's
`onstart` handler records the host, rffm.ops.unlock.record_owner) and no process on this host
still runs snakemake or an rffm step in that directory. Otherwise it explains why not.

`lock_state` is the read-only judgement both use: `rffm unlock` (which acts on it; its exit status
says what it did: UNLOCKED, NOT_LOCKED or LEFT_ALONE) and the workflow while it plans (common.smk
prints `lock_line` before Snakemake's own "Directory cannot be locked" paragraph).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

OWNER_FILE = "rffm-lock-owner"
# `rffm unlock` exit statuses (2 is every rffm command's error status)
UNLOCKED, NOT_LOCKED, LEFT_ALONE = 0, 1, 3


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ancestors() -> set[int]:
    """This process and the processes that started it (a shell running `snakemake` or `rffm unlock` is not another run)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def live_workflow_processes(workdir: str | Path) -> list[int]:
    """PIDs on this host (besides this one and its ancestors) running snakemake or rffm in workdir."""
    target = os.path.realpath(workdir)
    ours = _ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        try:
            if os.readlink(entry / "cwd") != target:
                continue
        except OSError:
            continue
        command = _cmdline(int(entry.name))
        if "snakemake" in command or "rffm" in command:
            found.append(int(entry.name))
    return sorted(found)


def record_owner(workdir: str | Path) -> None:
    """Note which host holds the lock of the run that is starting (called from the workflow's onstart)."""
    state = Path(workdir) / ".snakemake"
    state.mkdir(parents=True, exist_ok=True)
    (state / OWNER_FILE).write_text(socket.gethostname() + "\n")


def lock_state(workdir: str | Path) -> tuple[str, str | None, list[int]]:
    """(state, owner host, live pids) of the Snakemake lock in workdir, read only.

    state: "unlocked"; "dead" (taken on this host, no snakemake or rffm process left in the directory);
    "live" (such a process runs); "elsewhere" (taken on another or an unrecorded host); "unknown" (no /proc)."""
    state = Path(workdir) / ".snakemake"
    if not (state / "locks").is_dir() or not any((state / "locks").glob("*.lock")):
        return "unlocked", None, []
    owner_file = state / OWNER_FILE
    owner = owner_file.read_text().strip() if owner_file.exists() else None
    if not Path("/proc").is_dir():
        return "unknown", owner, []
    if owner != socket.gethostname():
        return "elsewhere", owner, []
    live = live_workflow_processes(workdir)
    return ("live" if live else "dead"), owner, live


def lock_line(workdir: str | Path) -> str | None:
    """One line for the plan when workdir is locked: how to clear a dead run's lock, or whose live lock it is."""
    state, owner, live = lock_state(workdir)
    where = os.path.abspath(workdir)
    if state == "dead":
        return (
            f"rffm: {where} is locked by a run that was killed (no snakemake left in it on {owner}). "
            f"Fix: `rffm unlock {where}`, then run snakemake again"
        )
    if state == "live":
        return f"rffm: {where} is locked by a live run (pid {', '.join(map(str, live))}); left alone: wait for it or stop it"
    if state == "elsewhere":
        return f"rffm: {where} is locked by a run on host {owner or 'unknown'}; if nothing runs there, `snakemake --unlock`"
    return None


def clear_stale_lock(workdir: str | Path) -> str:
    """Remove a dead run's lock files; say what was done, or why nothing was."""
    return unlock(workdir)[1]


def unlock(workdir: str | Path) -> tuple[int, str]:
    """(exit status, message): remove a dead run's lock files (UNLOCKED), or say why nothing was removed."""
    state, owner, live = lock_state(workdir)
    locks = Path(workdir) / ".snakemake" / "locks"
    if state == "unlocked":
        return NOT_LOCKED, f"{workdir}: not locked"
    if state == "unknown":
        why = "cannot tell whether its run is alive here (no /proc)"
        return LEFT_ALONE, f"{workdir}: locked; {why}. Fix: if nothing runs, `snakemake --unlock`"
    if state == "elsewhere":
        fix = "Fix: if nothing runs there, `snakemake --unlock`"
        return LEFT_ALONE, f"{workdir}: locked by a run on host {owner or 'unknown'}; left alone. {fix}"
    if state == "live":
        return LEFT_ALONE, f"{workdir}: locked by a live run (pid {', '.join(map(str, live))}); left alone"
    for lock in sorted(locks.glob("*.lock")):
        lock.unlink(missing_ok=True)
    return UNLOCKED, f"{workdir}: removed the lock of a killed run ({locks}); `snakemake` reruns its incomplete jobs"
