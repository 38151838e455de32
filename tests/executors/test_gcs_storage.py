"""The GCS storage plugin `rffm-gcs` (scripts/snakemake_storage_plugin_rffm_gcs) and the documented dry run.

`snakemake --profile profiles/gcp-batch -n` either plans (credentials, or a local GCS emulator through
STORAGE_EMULATOR_HOST) or stops with one line naming what is missing and the fix. The plugin is
snakemake-storage-plugin-gcs 1.1.4 with its failures explained; each difference has a test that also
runs against upstream `gcs` and must fail there (strict xfail), so the test is known to detect it.
The provider is chosen on the command line, so these tests hold whichever provider the profile names.
Nothing here reaches Google: no credentials, the metadata server pointed at a closed local port, and
every request that is made goes to 127.0.0.1.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import yaml
from batch_support import IMAGE, PROJECT, bucket_objects, free_port, output, profile_env, run_fake_batch
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from conftest import BIN, REPO, WARM, tiny_config

UPSTREAM = pytest.param(
    "gcs",
    marks=pytest.mark.xfail(
        strict=True, raises=AssertionError, reason="upstream snakemake-storage-plugin-gcs 1.1.4 defect: the assertion naming it fails"
    ),
)
PROVIDERS = ["rffm-gcs", UPSTREAM]
# Snakemake frames a WorkflowError with these lines; everything else it prints about the error is the message
FRAMING = ("Using profile", "WorkflowError", '  File "', "Building DAG of jobs", "Config file ")


@pytest.fixture(scope="module")
def emulator():
    """gcp-storage-emulator on 127.0.0.1 (in memory), stopped after this module."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="module")
def repo_checkout(tmp_path_factory) -> Path:
    """What a user runs from: the workflow, the profiles and the tiny config as config/config.yaml."""
    checkout = tmp_path_factory.mktemp("checkout")
    for name in ("workflow", "profiles"):
        shutil.copytree(REPO / name, checkout / name)
    (checkout / "config").mkdir()
    (checkout / "config" / "config.yaml").write_text(yaml.safe_dump(tiny_config(), sort_keys=False))
    return checkout


def provider_args(provider: str) -> list[str]:
    return ["--default-storage-provider", provider, f"--storage-{provider}-project", PROJECT]


def offline_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No Google credentials of any kind, and no way to the GCE metadata server."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RFFM_", "SNAKEMAKE_", "FAKE_BATCH_", "GOOGLE_", "GCE_", "CLOUDSDK_"))
        and key not in {"STORAGE_EMULATOR_HOST", "API_ENDPOINT_OVERRIDE"}
    }
    gcloud = tmp_path / "gcloud-config"  # where gcloud's application-default credentials would be: empty
    gcloud.mkdir(exist_ok=True)
    environ.update(
        {
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "CLOUDSDK_CONFIG": str(gcloud),
            "NO_GCE_CHECK": "true",
            "GCE_METADATA_HOST": "127.0.0.1:9",
            "GCE_METADATA_IP": "127.0.0.1:9",
            **extra,
        }
    )
    return environ


def snakemake(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return WARM.run_any([str(BIN / "snakemake"), *args], cwd, env, timeout=900)


def message_lines(result: subprocess.CompletedProcess) -> list[str]:
    """What Snakemake printed about the error, less its framing lines."""
    text = result.stdout + result.stderr
    return [line for line in text.splitlines() if line.strip() and not line.startswith(FRAMING)]


def plugin_error(result: subprocess.CompletedProcess) -> str:
    """The one line of a refusal rffm-gcs raises while Snakemake starts: besides Snakemake's notices and the workflow's
    own (`rffm: ` lines), nothing is printed, neither a `WorkflowError` header nor the `File "…", line N` of a frame."""
    text = result.stdout + result.stderr
    notices = ("Using profile", "Config file ", "rffm: ", "note: ")  # the workflow's own lines and notes
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(notices)]
    assert len(lines) == 1, text
    return lines[0]


def create_bucket(emulator_url: str, name: str) -> None:
    client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator_url})
    if client.lookup_bucket(name) is None:
        client.create_bucket(name)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_documented_dry_run_without_credentials_stops_with_one_line(provider, repo_checkout, tmp_path):
    """Upstream builds storage.Client() at startup and ends in a 69-line DefaultCredentialsError traceback."""
    env = offline_env(tmp_path, **profile_env("rffm-plan"))
    result = snakemake(repo_checkout, env, "--profile", "profiles/gcp-batch", "-n", *provider_args(provider))
    assert result.returncode != 0
    line = plugin_error(result)
    assert "no Google Cloud credentials found" in line
    assert "gcloud auth application-default login" in line and "STORAGE_EMULATOR_HOST" in line


def test_the_dry_run_against_an_emulator_shows_the_batch_plan(repo_checkout, emulator, tmp_path):
    create_bucket(emulator, "rffm-plan")
    env = offline_env(tmp_path, STORAGE_EMULATOR_HOST=emulator, **profile_env("rffm-plan"))
    result = snakemake(repo_checkout, env, "--profile", "profiles/gcp-batch", "-n", *provider_args("rffm-gcs"))
    assert result.returncode == 0, output(result)
    plan = result.stdout
    assert "gs://rffm-plan/rffm/results/runs/base/qualification/run_manifest.json" in plan
    assert "googlebatch_machine_type=g2-standard-8" in plan and "nvidia_gpu=nvidia-l4" in plan
    assert "googlebatch_local_ssd_gb=375" in plan
    assert "This was a dry-run" in plan
    assert bucket_objects(emulator, "rffm-plan") == {}, "a dry run must not write to the bucket"


def test_a_dry_run_refuses_a_mutable_image_tag(repo_checkout, emulator, tmp_path):
    """The workflow refuses RFFM_WORKER_IMAGE=<image>:latest when it is parsed, so `-n` refuses it too."""
    create_bucket(emulator, "rffm-plan")
    image = IMAGE.split("@")[0] + ":latest"
    env = offline_env(tmp_path, STORAGE_EMULATOR_HOST=emulator, **profile_env("rffm-plan", image))
    result = snakemake(repo_checkout, env, "--profile", "profiles/gcp-batch", "-n", *provider_args("rffm-gcs"))
    assert result.returncode != 0
    node_checks = "rffm: scratch ("  # the plan's note that the nodes check their scratch and GPU (planning.note_node_checks)
    [line] = [line for line in message_lines(result) if not line.startswith(node_checks)]
    assert line.startswith(f"RFFM_WORKER_IMAGE={image}: the worker image must be pinned by digest")
    assert "Job stats" not in result.stdout


MINIMAL_SNAKEFILE = """
rule ok:
    output:
        "ok.txt",
    shell:
        "echo ok > {output}"
"""


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_missing_bucket_is_named_and_never_created(provider, emulator, tmp_path):
    """Upstream's store_object creates any missing bucket: a typo in the prefix silently starts a new one."""
    workdir = tmp_path / "wf"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(MINIMAL_SNAKEFILE)
    bucket = f"rffm-typo-{provider}"
    env = offline_env(tmp_path, STORAGE_EMULATOR_HOST=emulator)
    storage_args = [*provider_args(provider), "--default-storage-prefix", f"gs://{bucket}/wf"]
    for args in (["-n"], ["--cores", "1"]):  # the plan, then a real (local) run that would upload
        result = snakemake(workdir, env, *args, *storage_args, "ok.txt")
        assert result.returncode != 0, output(result)
        line = plugin_error(result)
        assert line.startswith(f"rffm-gcs: bucket gs://{bucket} does not exist") and "gcloud storage buckets create" in line
    client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator})
    assert client.lookup_bucket(bucket) is None


@pytest.mark.parametrize("bucket", ["$RFFM_GCS_BUCKET", "My_Bucket"])
def test_an_invalid_bucket_name_is_refused_before_any_request(bucket, tmp_path):
    workdir = tmp_path / "wf"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(MINIMAL_SNAKEFILE)
    env = offline_env(tmp_path, STORAGE_EMULATOR_HOST="http://127.0.0.1:9")  # closed: any request would fail otherwise
    result = snakemake(workdir, env, "-n", *provider_args("rffm-gcs"), "--default-storage-prefix", f"gs://{bucket}/wf", "ok.txt")
    assert result.returncode != 0
    line = plugin_error(result)
    expected = "environment variable RFFM_GCS_BUCKET is not set" if bucket.startswith("$") else f"'{bucket}' is not a valid bucket name"
    assert line.startswith(f"rffm-gcs: gs://{bucket}/wf/ok.txt: {expected}"), line


class RefusingTokenServer(http.server.BaseHTTPRequestHandler):
    """An OAuth token endpoint that refuses every refresh token, as Google does for revoked ones."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"error": "invalid_grant", "error_description": "Token has been expired or revoked."}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def service_account_key(path: Path, token_uri: str) -> Path:
    """A service-account key file (a fresh RSA key) whose token endpoint is `token_uri`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    key = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "0" * 40,
        "private_key": pem.decode(),
        "client_email": f"revoked@{PROJECT}.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }
    path.write_text(json.dumps(key))
    return path


def test_refused_credentials_are_one_line(repo_checkout, emulator, tmp_path):
    """Credentials Google refuses (a deleted key, a revoked login): the first request fails with one line."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RefusingTokenServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        key = service_account_key(tmp_path / "key.json", f"http://127.0.0.1:{server.server_address[1]}/token")
        # requests would go to the emulator (with credentials: API_ENDPOINT_OVERRIDE), never to Google
        env = offline_env(tmp_path, GOOGLE_APPLICATION_CREDENTIALS=str(key), API_ENDPOINT_OVERRIDE=emulator, **profile_env("rffm-plan"))
        result = snakemake(repo_checkout, env, "--profile", "profiles/gcp-batch", "-n", *provider_args("rffm-gcs"))
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode != 0
    line = plugin_error(result)
    assert "the Google Cloud credentials were refused (invalid_grant" in line and "gcloud auth application-default login" in line


def test_a_batch_run_stores_through_rffm_gcs(emulator, tmp_path):
    """The executor with rffm-gcs as the default provider: the worker (the fake VM) uses it too, nothing is
    pip-installed for it, and the output reaches the (existing) bucket."""
    workdir = tmp_path / "wf"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(MINIMAL_SNAKEFILE)
    create_bucket(emulator, "rffm-store")
    args = [
        "--executor", "rffm-googlebatch", "--jobs", "1", "--latency-wait", "3", "--seconds-between-status-checks", "1",
        "--retries", "0", "--rffm-googlebatch-project", PROJECT, "--rffm-googlebatch-region", "us-central1",
        "--rffm-googlebatch-container", IMAGE, "--default-storage-prefix", "gs://rffm-store/wf", *provider_args("rffm-gcs"), "ok.txt",
    ]  # fmt: skip
    result, report = run_fake_batch(workdir, tmp_path / "state", emulator, *args, env={"FAKE_BATCH_PYPI": "offline"})
    assert result.returncode == 0, output(result)
    [job] = report["jobs"]
    command = " ".join(job["request"]["job"]["task_groups"][0]["task_spec"]["runnables"][0]["script"]["text"].split())
    assert "--default-storage-provider 'rffm-gcs'" in command  # the worker stores through rffm-gcs too
    assert bucket_objects(emulator, "rffm-store")["wf/ok.txt"].download_as_text() == "ok\n"
