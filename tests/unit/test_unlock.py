import os
import socket
import subprocess
import sys
import time
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
        while not Path(f"/proc/{sleeper.pid}/cmdline").read_bytes().startswith(b"snakemake-like"):
            time.sleep(0.01)  # bash has not exec'd yet
        assert locks.live_workflow_processes(tmp_path) == [sleeper.pid]
        assert "locked by a live run" in locks.clear_stale_lock(tmp_path) and lock.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    (tmp_path / ".snakemake" / locks.OWNER_FILE).write_text("another-host\n")
    assert "locked by a run on host another-host" in locks.clear_stale_lock(tmp_path) and lock.exists()
    assert locks.clear_stale_lock(tmp_path / "elsewhere").endswith("not locked")
    assert os.getpid() not in locks.live_workflow_processes(Path.cwd())


def test_unlock_exit_status_says_whether_a_lock_was_removed(tmp_path: Path):
    assert locks.unlock(tmp_path)[0] == locks.NOT_LOCKED == 1
    lock = make_lock(tmp_path, "another-host")
    assert locks.unlock(tmp_path)[0] == locks.LEFT_ALONE == 3 and lock.exists()
    (tmp_path / ".snakemake" / locks.OWNER_FILE).write_text(socket.gethostname() + "\n")
    assert locks.unlock(tmp_path)[0] == locks.UNLOCKED == 0 and not lock.exists()


def test_the_plan_line_names_rffm_unlock_for_a_dead_lock_and_the_pid_of_a_live_one(tmp_path: Path):
    assert locks.lock_line(tmp_path) is None
    lock = make_lock(tmp_path, socket.gethostname())
    assert locks.lock_line(tmp_path) == (
        f"rffm: {tmp_path} is locked by a run that was killed (no snakemake left in it on {socket.gethostname()}). "
        f"Fix: `rffm unlock {tmp_path}`, then run snakemake again"
    )
    sleeper = subprocess.Popen(["bash", "-c", "exec -a snakemake-like sleep 30"], cwd=tmp_path)
    try:
        while not Path(f"/proc/{sleeper.pid}/cmdline").read_bytes().startswith(b"snakemake-like"):
            time.sleep(0.01)  # bash has not exec'd yet
        live = f"rffm: {tmp_path} is locked by a live run (pid {sleeper.pid}); left alone: wait for it or stop it"
        assert locks.lock_line(tmp_path) == live
    finally:
        sleeper.kill()
        sleeper.wait()
    assert lock.exists(), "reading the lock's state never removes it"


def test_the_shell_that_started_this_process_is_not_a_live_run(tmp_path: Path):
    make_lock(tmp_path, socket.gethostname())
    code = "from rffm.ops import unlock; print(unlock.lock_state('.')[0])"
    # `bash -c "... snakemake ..."` in the directory is this process's parent, not another run
    script = f'{sys.executable} -c "{code}"; true # snakemake'  # `; true` keeps bash alive as the parent
    shown = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert shown.stdout.strip() == "dead", shown.stderr
