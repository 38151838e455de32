"""A measured command stopped early leaves nothing running: rffm.runtime.processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_scheduler_stopped_by_sigterm_takes_the_jobs_it_started_with_it(tmp_path: Path):
    pidfile = tmp_path / "job.pid"
    job = f"sleep 300 & echo $! > {pidfile}; wait"  # a scheduler whose job outlives a plain kill of the scheduler
    code = f"from rffm.runtime.processes import run_as_group; run_as_group(['bash', '-c', {job!r}])"
    env = {**os.environ, "PYTHONPATH": str(REPO / "scripts")}
    caller = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 30
    while not pidfile.is_file() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline and caller.poll() is None
        time.sleep(0.05)
    job_pid = int(pidfile.read_text())
    assert alive(job_pid)
    caller.send_signal(signal.SIGTERM)
    assert caller.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while alive(job_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(job_pid)
