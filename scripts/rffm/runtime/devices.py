"""Pinning the concurrent jobs of one group job to the devices of their node: one device per job, never shared.

Each device of the node has a lock file in a node-local directory (e.g. `<scratch>/.devices/`). A job takes the
first free device in the node's order (fcntl.flock, non-blocking, device after device), keeps it while it runs and
lets it go when it ends. The kernel drops the lock of a process that dies, so a killed or preempted job never keeps
its device. When every device is taken the job waits for one (it never runs without one); a job that needs
several (a multi-device cache build) takes them all at once or none. Nothing here imports torch.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from rffm.errors import ConfigError

POLL_S = 0.05


def choose(devices: Sequence[str], taken: Iterable[str], count: int = 1) -> list[str] | None:
    """The devices a job starting now gets: the first `count` free ones in node order, None when fewer are free."""
    busy = set(taken)
    free = [device for device in devices if device not in busy]
    return free[:count] if len(free) >= count else None


def lock_path(directory: Path, device: str) -> Path:
    """The lock file of one device."""
    return Path(directory) / (re.sub(r"[^A-Za-z0-9_.-]", "_", device) + ".lock")


class Lease:
    """Devices held by this process until release() (or its exit)."""

    def __init__(self, held: list[tuple[str, int]]):
        self.held = held

    @property
    def devices(self) -> list[str]:
        return [device for device, _ in self.held]

    @property
    def device(self) -> str:
        """The job's device (the first, when it holds several)."""
        return self.held[0][0]

    def release(self) -> None:
        for _, fd in self.held:
            os.close(fd)  # closing the descriptor drops its flock
        self.held = []

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def try_acquire(devices: Sequence[str], directory: Path, count: int = 1) -> Lease | None:
    """Take `count` free devices now (first free in order), or none of them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    held: list[tuple[str, int]] = []
    for device in devices:
        fd = os.open(lock_path(directory, device), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        held.append((device, fd))
        if len(held) == count:
            break
    lease = Lease(held)
    if len(held) < count:
        lease.release()
        return None
    for _, fd in held:  # who holds it, for the message of a job that waited too long
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return lease


def holders(devices: Sequence[str], directory: Path) -> dict[str, str]:
    """The process id last written into each device's lock file (its holder while it is held)."""
    found = {}
    for device in devices:
        try:
            found[device] = lock_path(directory, device).read_text().strip() or "?"
        except FileNotFoundError:
            found[device] = "?"
    return found


def acquire_free(devices: Sequence[str], directory: Path) -> Lease:
    """Every device free now, waiting for at least one (a cache build: the more devices, the sooner it is done)."""
    while True:
        for count in range(len(devices), 0, -1):
            if (lease := try_acquire(devices, directory, count)) is not None:
                return lease
        time.sleep(POLL_S)


def acquire(devices: Sequence[str], directory: Path, count: int = 1, timeout_s: float | None = None) -> Lease:
    """Wait until `count` devices are free and take them; one line after `timeout_s` (None: wait as long as it takes)."""
    if not 1 <= count <= len(devices):
        raise ConfigError(
            f"devices: a job asks for {count} of the node's {len(devices)} devices ({', '.join(devices) or 'none'}). "
            "Fix: list the node's devices, and ask for at least one and at most that many."
        )
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        lease = try_acquire(devices, directory, count)
        if lease is not None:
            return lease
        if deadline is not None and time.monotonic() >= deadline:
            taken = ", ".join(f"{device} by pid {pid}" for device, pid in holders(devices, directory).items())
            raise ConfigError(
                f"{directory}: no {count} of the node's devices came free in {timeout_s:g} s (held: {taken}). "
                "Fix: let the group run no more jobs at once than the node has devices, or end the processes named."
            )
        time.sleep(POLL_S)
