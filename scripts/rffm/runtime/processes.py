"""Child processes that do not outlive the command that started them."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def dies_with_parent() -> None:
    """A subprocess's preexec_fn: the child is sent SIGTERM when the process that started it exits (Linux; elsewhere
    nothing), so a stopped measurement leaves no scheduler behind to share the cores with the next one."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):
        pass
