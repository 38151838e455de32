"""Child processes that do not outlive the command that started them."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
from typing import Any

PR_SET_PDEATHSIG = 1


def dies_with_parent() -> None:
    """A subprocess's preexec_fn: the child is sent SIGTERM when the process that started it exits (Linux; elsewhere
    nothing), so a stopped measurement leaves no scheduler behind to share the cores with the next one."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):
        pass


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_as_group(command: list[str], **options: Any) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output, text) of `command` in its own process group, the whole group (a scheduler and
    the jobs it started) killed when this call ends early: an exception, or SIGTERM to this process."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_term) if in_main else None
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=dies_with_parent, **options
    )
    try:
        stdout, stderr = process.communicate()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
