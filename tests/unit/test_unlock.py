import os
import socket
import subprocess
from pathlib import Path

from rffm.ops import unlock as locks


def make_lock(workdir: Path, host: str) -> Path:
    (workdir / ".snakemake/locks").mkdir(parents=True)
    (workdir / ".snakemake/locks/0.input.lock").write_text("x\n")
    (workdir / ".snakemake" / locks.OWNER_FILE).write_text(host + "\n")
    return workdir / ".snakemake/locks/0.input.lock"


def test_a_dead_runs_lock_is_removed(tmp_path: Path):
    lock = make_lock(tmp_path, socket.gethostname())
    assert "removed the lock of a killed run" in locks.clear_stale_lock(tmp_path)
    assert not lock.exists()


def test_a_live_or_foreign_lock_is_kept(tmp_path: Path):
    lock = make_lock(tmp_path, socket.gethostname())
    sleeper = subprocess.Popen(["bash", "-c", "exec -a snakemake-like sleep 30"], cwd=tmp_path)
    try:
        assert locks.live_workflow_processes(tmp_path) == [sleeper.pid]
        assert "locked by a live run" in locks.clear_stale_lock(tmp_path) and lock.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    (tmp_path / ".snakemake" / locks.OWNER_FILE).write_text("another-host\n")
    assert "locked by a run on host another-host" in locks.clear_stale_lock(tmp_path) and lock.exists()
    assert locks.clear_stale_lock(tmp_path / "elsewhere").endswith("not locked")
    assert os.getpid() not in locks.live_workflow_processes(Path.cwd())
