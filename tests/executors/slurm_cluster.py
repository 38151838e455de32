"""A real single-node SLURM cluster on 127.0.0.1 for tests: munged, slurmctld and slurmd, stopped by PID.

Everything lives in a fresh runtime directory except /etc/slurm/slurm.conf and gres.conf: the
executor plugin's job step strips SLURM_CONF before its nested `srun`, so the configuration must
sit at the compiled-in default path. Those two files are written only when absent (or left by an
earlier run of this helper, recognised by MARKER) and removed again on stop; an flock serialises
concurrent test sessions on one machine.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

CONF_DIR = Path("/etc/slurm")
MARKER = "# written by rffm tests/slurm_cluster.py"
LOCK_FILE = Path(tempfile.gettempdir()) / "rffm-slurm-test.lock"
COMMANDS = ("munged", "mungekey", "munge", "slurmctld", "slurmd", "sbatch", "squeue", "srun", "scontrol", "sinfo", "scancel")
PACKAGES = "slurmctld slurmd slurm-client munge"
LOCK_TIMEOUT = 1800  # the other SLURM module may hold the cluster that long on a loaded machine (two test workers)
MIN_MEMORY_MB = 65536  # declared node memory (config_overrides): profiles/slurm asks up to 32 GB per job


def _which(command: str) -> str | None:
    return shutil.which(command) or shutil.which(command, path="/usr/sbin:/usr/bin:/sbin")


def unavailable_reason() -> str | None:
    """Why this machine cannot run the test cluster, or None when it can."""
    missing = [c for c in COMMANDS if _which(c) is None]
    if missing:
        return f"SLURM is not installed ({', '.join(missing)} missing); install it with: apt-get install -y {PACKAGES} (.ci/run does)"
    if os.geteuid() != 0:
        return "starting slurmd and writing /etc/slurm/slurm.conf need root"
    for name in ("slurm.conf", "gres.conf"):
        path = CONF_DIR / name
        if path.exists() and MARKER not in path.read_text(errors="replace"):
            return f"{path} belongs to a SLURM installation of this machine; the test cluster does not overwrite it"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait(what: str, check, timeout: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-2000:]}" for p in logs if p.exists())
            raise RuntimeError(f"test SLURM cluster: timed out after {timeout}s waiting for {what}\n{tails}")
        time.sleep(0.2)


def _ok(*command: str) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _out(*command: str) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
    except subprocess.TimeoutExpired:
        return ""


class LocalSlurm:
    """munged + slurmctld + slurmd for one node `localhost` with partitions `cpu` (default) and `gpu`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rffm-slurm-"))
        self.root.chmod(0o755)  # munged requires a traversable socket directory
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.written: list[Path] = []
        self.lock = None

    def _locked(self) -> bool:
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def _spawn(self, name: str, *command: str) -> None:
        out = open(self.root / f"{name}.out", "w")
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        self.processes.append((name, process))

    def _slurm_conf(self) -> str:
        hardware = _out(_which("slurmd"), "-C").splitlines()[0].split()
        fields = dict(item.split("=", 1) for item in hardware[1:] if "=" in item)
        fields["RealMemory"] = str(max(int(fields.get("RealMemory", "1")), MIN_MEMORY_MB))
        node = " ".join(f"{k}={v}" for k, v in fields.items())
        return f"""{MARKER}
ClusterName=rffmtest
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.root / "munge.socket"}
MpiDefault=none
MailProg=/bin/true
StateSaveLocation={self.root / "ctld"}
SlurmdSpoolDir={self.root / "slurmd"}
SlurmctldPidFile={self.root / "slurmctld.pid"}
SlurmdPidFile={self.root / "slurmd.pid"}
SlurmctldLogFile={self.log("slurmctld")}
SlurmdLogFile={self.log("slurmd")}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
ReturnToService=2
MinJobAge=300
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 {node} Gres=gpu:fake:1 State=UNKNOWN
PartitionName=cpu Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=localhost MaxTime=INFINITE State=UP
"""

    def start(self) -> LocalSlurm:
        """Write the configuration, start the three daemons and wait until the node is idle."""
        self.lock = open(LOCK_FILE, "w")
        _wait(f"{LOCK_FILE} (another test cluster runs)", self._locked, LOCK_TIMEOUT, [])  # one cluster per machine at a time
        for name in ("ctld", "slurmd"):
            (self.root / name).mkdir()
        key = self.root / "munge.key"
        subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        self._spawn(
            "munged",
            _which("munged"),
            "--foreground",
            f"--socket={self.root / 'munge.socket'}",
            f"--key-file={key}",
            f"--pid-file={self.root / 'munged.pid'}",
            f"--log-file={self.log('munged')}",
            f"--seed-file={self.root / 'munge.seed'}",
        )
        munge_socket = str(self.root / "munge.socket")
        _wait(
            "munged", lambda: _ok("bash", "-c", f"munge -n -S {munge_socket} | unmunge -S {munge_socket}"), 20, [self.root / "munged.out"]
        )

        CONF_DIR.mkdir(parents=True, exist_ok=True)
        for name, text in (
            ("slurm.conf", self._slurm_conf()),
            ("gres.conf", f"{MARKER}\nAutoDetect=off\nNodeName=localhost Name=gpu Type=fake File=/dev/null\n"),
        ):
            (CONF_DIR / name).write_text(text)
            self.written.append(CONF_DIR / name)

        logs = [self.log("slurmctld"), self.log("slurmd"), self.root / "slurmctld.out", self.root / "slurmd.out"]
        self._spawn("slurmctld", _which("slurmctld"), "-D")
        _wait("slurmctld", lambda: "UP" in _out("scontrol", "ping"), 60, logs)
        self._spawn("slurmd", _which("slurmd"), "-D", "-N", "localhost")
        _ok("scontrol", "update", "nodename=localhost", "state=resume")
        _wait("an idle node", lambda: _out("sinfo", "-h", "-n", "localhost", "-o", "%T").startswith("idle"), 60, logs)
        return self

    def stop(self) -> None:
        """Cancel leftover jobs, stop exactly the daemons started here (newest first), remove the config."""
        try:
            if any(name == "slurmctld" and p.poll() is None for name, p in self.processes):
                _ok("scancel", "--state=PENDING")
                _ok("scancel", "--state=RUNNING")
                deadline = time.monotonic() + 30
                while _out("squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING") and time.monotonic() < deadline:
                    time.sleep(0.5)
            for _name, process in reversed(self.processes):
                if process.poll() is None:
                    os.kill(process.pid, signal.SIGTERM)
                    try:
                        process.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        os.kill(process.pid, signal.SIGKILL)
                        process.wait()
        finally:
            for path in self.written:
                path.unlink(missing_ok=True)
            shutil.rmtree(self.root, ignore_errors=True)
            if self.lock is not None:
                self.lock.close()

    def __enter__(self) -> LocalSlurm:
        try:
            return self.start()
        except BaseException:
            self.stop()  # a half-started cluster is stopped too
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
