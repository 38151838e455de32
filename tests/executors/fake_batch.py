"""Run the real Snakemake CLI with Google Cloud Batch replaced in-process by a fake.

    python tests/executors/fake_batch.py STATE_DIR -- <snakemake arguments>

The executor plugins call `google.cloud.batch_v1.BatchServiceClient()` and
`google.cloud.logging.Client()` at run time, so replacing those two module attributes is the whole
patch; everything else (Snakemake, the executor plugin's job builders, the GCS storage plugin talking
to a local emulator via STORAGE_EMULATOR_HOST) is real.

The fake stands where the Batch API and its VMs stand:
- create_job checks what the API documents (job id and label syntax, retry count range, volumes
  naming an attached disk) and raises InvalidArgument like the API; every request is recorded;
- in execute mode each job runs like a COS VM would run it: the host-side script runnables, then the
  container runnable (the local virtualenv stands in for the image; /tmp/workdir and the container's
  bind mounts are mapped into a per-job sandbox, a local-SSD volume becomes a sandbox directory);
  the job's state follows the container's exit status;
- a task whose attempt ends with a non-zero exit code is retried as Batch retries it: on a new VM (a
  fresh sandbox, BATCH_TASK_RETRY_ATTEMPT counting up) while max_retry_count allows, unless a
  FAIL_TASK lifecycle policy names the exit code; the job stays RUNNING meanwhile;
- FAKE_BATCH_PREEMPT = [{"job": <regex on the job id>, "bucket": <name>, "object": <regex on object
  names>, "json": <optional: fields the object's JSON content must have>}] preempts the first attempt
  of the first matching job once such an object exists in the bucket: every process of the VM is
  killed and the attempt ends with Batch's preemption exit code 50001;
- in capture mode only the host-side scripts run and every job reports FAILED (the run stops after
  the first wave, having recorded what it submitted);
- FAKE_BATCH_FAULTS = {"get_job": ["ServiceUnavailable", ...], "create_job": [...]} makes the next
  calls raise those google.api_core exceptions, in order;
- FAKE_BATCH_PYPI=offline: `pip` and `python3 -m pip` fail on the VM (no PyPI egress);
- the fake VMs have no GPU. By default the CPU stands in for a job's accelerators as the local
  virtualenv stands in for the image: the container does not get RFFM_GPUS_REQUESTED (the request,
  which the report keeps, still carries it). FAKE_BATCH_GPUS=invisible passes it on: a VM whose
  GPU the container cannot see (no driver, not passed through), where GPU steps must refuse to run.
At exit STATE_DIR/jobs.json holds every request (CreateJobRequest.to_dict), final state, whether it
was deleted or still running (then it is killed), where its (last) sandbox is, each attempt (sandbox,
exit code, preempted) and the job's status events.
"""

from __future__ import annotations

import os

# Never touch real credentials or the GCE metadata server (google-auth reads these at import).
os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
os.environ["NO_GCE_CHECK"] = "true"
os.environ["GCE_METADATA_HOST"] = "127.0.0.1:9"
os.environ["GCE_METADATA_IP"] = "127.0.0.1:9"

import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import google.cloud.logging  # noqa: E402
from google.api_core import exceptions as api_exceptions  # noqa: E402
from google.cloud import batch_v1  # noqa: E402

JOB_ID = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
HOST_WORKDIR = "/tmp/workdir"
PREEMPTION_EXIT_CODE = 50001  # Batch's exit code for a task whose VM was preempted


class FakeBatch:
    """Shared state of the fake API: jobs, faults, mode."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.mode = os.environ.get("FAKE_BATCH_MODE", "execute")
        self.faults = json.loads(os.environ.get("FAKE_BATCH_FAULTS", "{}"))
        self.pypi_online = os.environ.get("FAKE_BATCH_PYPI", "online") != "offline"
        self.preemptions = json.loads(os.environ.get("FAKE_BATCH_PREEMPT", "[]"))
        self.gpus_visible_as_cpu = os.environ.get("FAKE_BATCH_GPUS", "stand-in") != "invisible"
        self.jobs: dict[str, dict] = {}
        self.rejected: list[dict] = []
        self.fault_log: list[str] = []
        self.lock = threading.Lock()

    def maybe_fail(self, call: str) -> None:
        with self.lock:
            pending = self.faults.get(call) or []
            if not pending:
                return
            name = pending.pop(0)
            self.fault_log.append(f"{call}: {name}")
        raise getattr(api_exceptions, name)(f"fake Batch: injected {name} on {call}")


STATE: FakeBatch | None = None


def problems(request: batch_v1.CreateJobRequest) -> list[str]:
    """What the Batch API documents it rejects (a pass does not prove Batch accepts the job)."""
    found = []
    if not JOB_ID.match(request.job_id):
        found.append(f"job_id {request.job_id!r} must match {JOB_ID.pattern}")
    if not re.match(r"^projects/[^/$]+/locations/[^/$]+$", request.parent):
        found.append(f"parent {request.parent!r} is malformed")
    for key, value in request.job.labels.items():
        if not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
            found.append(f"label {key}={value!r} violates the label syntax")
    disks = {d.device_name for inst in request.job.allocation_policy.instances for d in inst.policy.disks}
    for group in request.job.task_groups:
        spec = group.task_spec
        if not 0 <= spec.max_retry_count <= 10:
            found.append(f"max_retry_count {spec.max_retry_count} not in [0, 10]")
        for volume in spec.volumes:
            if volume.device_name and volume.device_name not in disks:
                found.append(f"volume device {volume.device_name!r} is not an attached disk")
    return found


class FakeBatchServiceClient:
    """Stands in for google.cloud.batch_v1.BatchServiceClient."""

    def __init__(self, *args, **kwargs):
        pass

    def create_job(self, request=None, *, parent=None, job=None, job_id=None, **kwargs):
        STATE.maybe_fail("create_job")
        request = batch_v1.CreateJobRequest(
            request if request is not None else batch_v1.CreateJobRequest(parent=parent, job=job, job_id=job_id)
        )
        name = f"{request.parent}/jobs/{request.job_id}"
        found = problems(request)
        if found:
            STATE.rejected.append(
                {
                    "job_id": request.job_id,
                    "problems": found,
                    "request": batch_v1.CreateJobRequest.to_dict(request, use_integers_for_enums=False),
                }
            )
            raise api_exceptions.InvalidArgument("fake Batch rejected the job: " + "; ".join(found))
        if name in STATE.jobs:
            raise api_exceptions.AlreadyExists(f"fake Batch: {name} exists")
        entry = {"name": name, "request": request, "state": "QUEUED", "proc": None, "deleted": False, "uid": uuid.uuid4().hex[:12]}
        entry.update({"attempts": [], "events": []})
        with STATE.lock:
            STATE.jobs[name] = entry
        event(entry, "Job state is set from QUEUED to SCHEDULED")
        start_vm(entry)
        created = batch_v1.Job(request.job)
        created.name, created.uid = name, entry["uid"]
        return created

    def get_job(self, request=None, *, name=None, **kwargs):
        STATE.maybe_fail("get_job")
        name = request.name if request is not None else name
        entry = STATE.jobs.get(name)
        if entry is None:
            raise api_exceptions.NotFound(f"fake Batch: no job {name}")
        refresh(entry)
        events = [batch_v1.StatusEvent(**e) for e in entry["events"]]
        status = batch_v1.JobStatus(state=batch_v1.JobStatus.State[entry["state"]], status_events=events)
        return batch_v1.Job(name=name, uid=entry["uid"], status=status)

    def delete_job(self, request=None, *, name=None, **kwargs):
        STATE.maybe_fail("delete_job")
        name = request.name if request is not None else name
        entry = STATE.jobs.get(name)
        if entry is not None:
            entry["deleted"] = True
            stop_vm(entry)

        class Operation:
            def result(self, timeout=None):
                return "deleted"

        return Operation()


class FakeLoggingClient:
    """Stands in for google.cloud.logging.Client: the worker's log is the only entry."""

    def __init__(self, *args, **kwargs):
        pass

    def logger(self, name):
        class Logger:
            def list_entries(self, filter_=None, page_size=None):
                uid = (filter_ or "").rsplit("=", 1)[-1]
                for entry in STATE.jobs.values():
                    for attempt in entry["attempts"] if entry["uid"] == uid else []:
                        if (Path(attempt["sandbox"]) / "worker.log").exists():
                            yield type("Entry", (), {"payload": (Path(attempt["sandbox"]) / "worker.log").read_text()})()

        return Logger()


# ---- the simulated VM ----


def shim_dir(sandbox: Path) -> Path:
    """`pip` / `python3 -m pip` as the VM sees them: no-ops with PyPI egress, failures without."""
    shims = sandbox / "shims"
    shims.mkdir(parents=True)
    pip = (
        'echo "[fake VM] pip $*: skipped (PyPI reachable)"; exit 0'
        if STATE.pypi_online
        else 'echo "[fake VM] pip $*: no PyPI egress" >&2; exit 1'
    )
    (shims / "pip").write_text(f"#!/bin/bash\n{pip}\n")
    (shims / "python3").write_text(
        f'#!/bin/bash\nif [ "$1" = -m ] && [ "$2" = pip ]; then shift 2; exec pip "$@"; fi\nexec {sys.executable} "$@"\n'
    )
    for shim in shims.iterdir():
        shim.chmod(0o755)
    return shims


def vm_script(entry: dict) -> str:
    """The VM's runnables as one bash script with host paths mapped into the sandbox."""
    request, sandbox = entry["request"], entry["sandbox"]
    host = sandbox / "host"
    spec = request.job.task_groups[0].task_spec

    def host_path(path: str) -> str:
        return str(host) + path

    lines = []
    for volume in spec.volumes:
        if volume.device_name:  # a new disk Batch formats and mounts on the host
            lines.append(f"mkdir -p {host_path(volume.mount_path)}")
    for runnable in spec.runnables:
        if "script" in runnable:
            script = runnable.script.text.replace(HOST_WORKDIR, host_path(HOST_WORKDIR))
            path = sandbox / f"runnable-{len(lines)}.sh"
            path.write_text(script)
            lines.append(f"bash {path} || exit $?")
        elif "container" in runnable and STATE.mode == "execute":
            lines.extend(container_lines(runnable, host_path))
    return "\n".join(lines) + "\n"


def container_lines(runnable, host_path) -> list[str]:
    """`docker run` for the container runnable: bind mounts become symlinks in the sandbox."""
    container = runnable.container
    workdir = re.search(r"--workdir (\S+)", container.options).group(1)
    mounts = dict(volume.split(":")[:2] for volume in container.volumes)
    if mounts.get(workdir) != workdir:
        raise ValueError(f"fake Batch cannot simulate container volumes {list(container.volumes)}")
    lines = []
    for source, target in mounts.items():
        if target != workdir:
            if not target.startswith(workdir + "/"):
                raise ValueError(f"fake Batch cannot simulate a mount outside {workdir}: {target}")
            lines.append(f"mkdir -p $(dirname {host_path(target)}) && ln -s {host_path(source)} {host_path(target)}")
    variables = dict(runnable.environment.variables)
    if STATE.gpus_visible_as_cpu:
        variables.pop("RFFM_GPUS_REQUESTED", None)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())
    command = " ".join([container.entrypoint, *(c.replace(workdir, host_path(workdir)) for c in container.commands)])
    lines.append(f"cd {host_path(workdir)} && env {env} {command}")
    return lines


def event(entry: dict, description: str) -> None:
    """Append a status event to the job's history (Batch reports every event so far on each get_job)."""
    now = datetime.datetime.now(datetime.UTC)
    entry["events"].append({"type_": "STATUS_CHANGED", "description": f"fake Batch: {description}", "event_time": now})


def start_vm(entry: dict) -> None:
    """Start the task's next attempt on a new VM: a fresh sandbox (retries get vms/<job id>.retry<k>)."""
    retry = len(entry["attempts"])
    job_id = entry["request"].job_id
    sandbox = STATE.state_dir / "vms" / (job_id if retry == 0 else f"{job_id}.retry{retry}")
    entry["sandbox"] = sandbox
    entry["attempts"].append({"sandbox": str(sandbox), "exit_code": None, "preempted": False})
    shims = shim_dir(sandbox)
    try:
        script = vm_script(entry)
    except ValueError as error:
        script = f"echo {shlex.quote(str(error))}; exit 97\n"
    (sandbox / "vm.sh").write_text(script)
    env = {
        "PATH": f"{shims}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(sandbox),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "BATCH_TASK_INDEX": "0",
        "BATCH_TASK_RETRY_ATTEMPT": str(retry),
        "STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"],
        "NO_GCE_CHECK": "true",
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9",
        "RFFM_PLAIN_PROGRESS": "1",
    }
    log = open(sandbox / "worker.log", "w")
    entry["proc"] = subprocess.Popen(
        ["bash", str(sandbox / "vm.sh")], cwd=sandbox, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    if STATE.mode == "capture":
        entry["proc"].wait()
        entry["attempts"][-1]["exit_code"] = entry["proc"].returncode
        entry["state"] = "FAILED"
    else:
        entry["state"] = "RUNNING"
        event(entry, f"Task 0 attempt {retry} is RUNNING on a new VM")


def fails_without_retry(spec, exit_code: int) -> bool:
    """A FAIL_TASK lifecycle policy names this exit code (Batch then fails the task at once)."""
    fail = batch_v1.LifecyclePolicy.Action.FAIL_TASK
    return any(p.action == fail and exit_code in p.action_condition.exit_codes for p in spec.lifecycle_policies)


def refresh(entry: dict) -> None:
    """Follow a running attempt to its end: success, a retry on a new VM, or failure (as Batch decides)."""
    with STATE.lock:
        proc = entry["proc"]
        if entry["state"] != "RUNNING" or proc.poll() is None:
            return
        attempt = entry["attempts"][-1]
        code = PREEMPTION_EXIT_CODE if attempt["preempted"] else proc.returncode
        attempt["exit_code"] = code
        if code == 0:
            entry["state"] = "SUCCEEDED"
            event(entry, "Job state is set from RUNNING to SUCCEEDED")
            return
        spec = entry["request"].job.task_groups[0].task_spec
        retries_left = spec.max_retry_count - (len(entry["attempts"]) - 1)
        event(entry, f"Task 0 attempt {len(entry['attempts']) - 1} failed with exit code {code}")
        if retries_left > 0 and not fails_without_retry(spec, code):
            start_vm(entry)
            return
        entry["state"] = "FAILED"
        event(entry, "Job state is set from RUNNING to FAILED")


def has_fields(value, expected) -> bool:
    """Whether a JSON value holds every field of `expected` (recursively; other fields may differ)."""
    if isinstance(expected, dict):
        return isinstance(value, dict) and all(k in value and has_fields(value[k], v) for k, v in expected.items())
    return value == expected


def appeared(client, rule: dict) -> bool:
    """Whether the bucket holds an object the preemption rule waits for."""
    for blob in client.list_blobs(rule["bucket"]):
        if re.fullmatch(rule["object"], blob.name):
            if "json" not in rule:
                return True
            try:
                if has_fields(json.loads(blob.download_as_bytes()), rule["json"]):
                    return True
            except ValueError:
                continue
    return False


def watch_preemptions() -> None:
    """Preempt each configured job's first attempt once its object is in the bucket (a thread)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    endpoint = {"api_endpoint": os.environ["STORAGE_EMULATOR_HOST"]}
    client = storage.Client(project="fake", credentials=AnonymousCredentials(), client_options=endpoint)
    pending = list(STATE.preemptions)
    while pending:
        for rule in list(pending):
            with STATE.lock:
                targets = [e for e in STATE.jobs.values() if re.search(rule["job"], e["request"].job_id)]
            target = targets[0] if targets else None
            if target is None or target["state"] != "RUNNING" or len(target["attempts"]) != 1 or not appeared(client, rule):
                continue
            with STATE.lock:
                if target["proc"].poll() is None:
                    target["attempts"][-1]["preempted"] = True
                    os.killpg(target["proc"].pid, signal.SIGKILL)
                    target["proc"].wait()
                    event(target, f"Task 0 attempt 0: the VM was preempted (an object matching {rule['object']} had appeared)")
            pending.remove(rule)
        time.sleep(0.2)


def stop_vm(entry: dict) -> None:
    with STATE.lock:
        proc = entry["proc"]
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if entry["state"] not in ("SUCCEEDED", "FAILED"):
            entry["state"] = "DELETED"


def write_report(rc: int) -> None:
    jobs = []
    for entry in STATE.jobs.values():
        if entry["state"] == "RUNNING" and entry["proc"].poll() is not None and not entry["attempts"][-1]["preempted"]:
            entry["attempts"][-1]["exit_code"] = entry["proc"].returncode
            entry["state"] = "SUCCEEDED" if entry["proc"].returncode == 0 else "FAILED"
        proc = entry["proc"]
        running = proc is not None and proc.poll() is None
        jobs.append(
            {
                "name": entry["name"],
                "job_id": entry["request"].job_id,
                "state": entry["state"],
                "deleted": entry["deleted"],
                "running_at_exit": running,
                "sandbox": str(entry["sandbox"]),
                "attempts": entry["attempts"],
                "events": [{**e, "event_time": e["event_time"].isoformat()} for e in entry["events"]],
                "request": batch_v1.CreateJobRequest.to_dict(entry["request"], use_integers_for_enums=False),
            }
        )
        if running:  # the "VM" upstream would leave running: record it, then clean up
            stop_vm(entry)
    report = {"snakemake_rc": rc, "jobs": jobs, "rejected": STATE.rejected, "faults_raised": STATE.fault_log}
    (STATE.state_dir / "jobs.json").write_text(json.dumps(report, indent=1, default=str))


def main(argv: list[str]) -> int:
    global STATE
    state_dir = Path(argv[0]).resolve()
    args = argv[2:] if argv[1:2] == ["--"] else argv[1:]
    state_dir.mkdir(parents=True, exist_ok=True)
    STATE = FakeBatch(state_dir)
    batch_v1.BatchServiceClient = FakeBatchServiceClient
    google.cloud.logging.Client = FakeLoggingClient
    if STATE.preemptions:
        threading.Thread(target=watch_preemptions, daemon=True).start()
    from snakemake.cli import main as snakemake_main

    rc = 0
    try:
        snakemake_main(args)
    except SystemExit as exit_:
        rc = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, int | None):  # what Python prints for an uncaught SystemExit with a message
            print(exit_.code, file=sys.stderr)
    finally:
        write_report(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
