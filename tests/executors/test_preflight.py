"""`rffm preflight --profile gcp-batch` against the GCS emulator (issue 23, acceptance 4): a missing bucket, an
unpinned image and a missing variable each give one line with the fix; a correct setup prints what it checked.

The emulator (gcp-storage-emulator) keeps a bucket's IAM policy and settings as given, so the IAM facts
preflight reads are those the test sets; it enforces none of them (profiles/README.md, Write-once ledger)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator

import pytest
from batch_support import PROJECT, gcs_emulator, profile_env
from test_gcs_storage import RefusingTokenServer, offline_env, service_account_key

from conftest import BIN, REPO

BUCKET = "rffm-preflight"
ACCOUNT = f"rffm-batch@{PROJECT}.iam.gserviceaccount.com"
LEDGER = f"projects/_/buckets/{BUCKET}/objects/rffm/results/ledger/"


@pytest.fixture(scope="module")
def emulator():
    with gcs_emulator() as url:
        yield url


def client(emulator: str):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator})


def make_bucket(emulator: str, name: str, bindings: list[dict]) -> None:
    """The bucket as the one-time setup leaves it: uniform bucket-level access, the given IAM bindings."""
    bucket = client(emulator).lookup_bucket(name) or client(emulator).create_bucket(name, location="us-central1")
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    bucket.patch()
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.version = 3
    policy.bindings = bindings
    bucket.set_iam_policy(policy)


def recipe() -> list[dict]:
    """profiles/README.md's write-once ledger bindings for the VM account."""
    member = {f"serviceAccount:{ACCOUNT}"}
    return [
        {"role": "roles/storage.objectAdmin", "members": member,
         "condition": {"title": "not-the-ledger", "expression": f'!resource.name.startsWith("{LEDGER}")'}},
        {"role": "roles/storage.objectCreator", "members": member,
         "condition": {"title": "ledger-create-only", "expression": f'resource.name.startsWith("{LEDGER}")'}},
        {"role": "roles/storage.objectViewer", "members": member},
    ]  # fmt: skip


def preflight(emulator: str, **changes: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RFFM_")}
    env.update({**profile_env(BUCKET), "STORAGE_EMULATOR_HOST": emulator})
    for name, value in changes.items():
        env.pop(name) if value is None else env.update({name: value})
    return preflight_in(env)


def preflight_in(env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [str(BIN / "rffm"), "preflight", "--profile", "gcp-batch", "--checkout", str(REPO)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def problems(result: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in result.stderr, result.stderr
    return [line.removeprefix("PROBLEM ") for line in result.stdout.splitlines() if line.startswith("PROBLEM ")]


def test_a_correct_setup_prints_what_it_checked(emulator):
    make_bucket(emulator, BUCKET, recipe())
    result = preflight(emulator)
    assert result.returncode == 0 and problems(result) == [], result.stdout
    checked = [line.removeprefix("checked ") for line in result.stdout.splitlines()]
    assert checked[0] == f"profile {REPO}/profiles/gcp-batch/config.yaml: every variable it reads is set"
    assert f"worker image pinned by digest: {profile_env(BUCKET)['RFFM_WORKER_IMAGE']}" in checked
    assert f"bucket gs://{BUCKET}: exists and is reachable (listed its objects)" in checked
    assert "bucket region: us (jobs in us-central1)" in checked  # the emulator puts every bucket in the US multi-region
    assert any(line.startswith(f"IAM: {ACCOUNT} may use gs://{BUCKET} and no role of it deletes ledger entries") for line in checked)
    assert any(line.startswith("network: the project's default VPC network") for line in checked)


def test_a_missing_bucket_is_one_line_with_the_fix(emulator):
    [line] = problems(preflight(emulator, RFFM_GCS_BUCKET="rffm-no-such-bucket"))
    assert line.startswith("bucket gs://rffm-no-such-bucket does not exist; rffm never creates buckets")
    assert "Fix: correct the prefix, or create the bucket once: `gcloud storage buckets create gs://rffm-no-such-bucket" in line
    assert client(emulator).lookup_bucket("rffm-no-such-bucket") is None  # nothing created


def test_an_unpinned_image_is_one_line_with_the_fix(emulator):
    make_bucket(emulator, BUCKET, recipe())
    image = "us-central1-docker.pkg.dev/rffm-test/rffm/worker:latest"
    [line] = problems(preflight(emulator, RFFM_WORKER_IMAGE=image))
    assert line.startswith(f"RFFM_WORKER_IMAGE={image}: the worker image must be pinned by digest") and "Fix: export the digest" in line


def test_a_missing_variable_is_one_line_with_the_fix(emulator):
    make_bucket(emulator, BUCKET, recipe())
    result = preflight(emulator, RFFM_BATCH_SERVICE_ACCOUNT=None)
    assert result.returncode == 1
    [line] = problems(result)
    assert line == (
        f"RFFM_BATCH_SERVICE_ACCOUNT: not set; {REPO}/profiles/gcp-batch/config.yaml (rffm-googlebatch-service-account) reads it. "
        "Fix: export RFFM_BATCH_SERVICE_ACCOUNT=rffm-batch@my-project.iam.gserviceaccount.com (profiles/README.md, Google Cloud)"
    )


def test_a_vm_account_that_may_delete_the_ledger_is_one_line_naming_the_recipe(emulator):
    make_bucket(emulator, "rffm-open-ledger", [{"role": "roles/storage.objectAdmin", "members": {f"serviceAccount:{ACCOUNT}"}}])
    [line] = problems(preflight(emulator, RFFM_GCS_BUCKET="rffm-open-ledger"))
    assert line.startswith(f"{ACCOUNT}: holds roles/storage.objectAdmin on all of gs://rffm-open-ledger, so any job can delete")
    assert "Fix: replace it by the IAM Condition bindings of profiles/README.md, Write-once ledger" in line


class GrantingTokenServer(RefusingTokenServer):
    """An OAuth token endpoint that grants every service-account assertion (a valid key)."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"access_token": "test-token", "expires_in": 3600, "token_type": "Bearer"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def token_endpoint(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/token"
    finally:
        server.shutdown()
        server.server_close()


def test_without_credentials_every_problem_is_one_line_and_the_offline_checks_still_run(emulator, tmp_path):
    """Issue 34: no Google credentials at all (no key, no gcloud login, no metadata server, no emulator) was a
    DefaultCredentialsError traceback that hid the offline problems; then refused credentials, then the Fix."""
    make_bucket(emulator, BUCKET, recipe())
    image = "us-central1-docker.pkg.dev/rffm-test/rffm/worker:latest"
    env = offline_env(tmp_path, **{**profile_env(BUCKET), "RFFM_WORKER_IMAGE": image})
    result = preflight_in(env)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = problems(result)
    assert len(lines) == 2 and result.stdout.splitlines() == [*(f"PROBLEM {line}" for line in lines), "2 problem(s); nothing was submitted"]
    assert lines[0].startswith(f"RFFM_WORKER_IMAGE={image}: the worker image must be pinned by digest")
    assert lines[1].startswith("no Google Cloud credentials found (Application Default Credentials)")
    fix = "Fix: run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file)"
    assert fix in lines[1]

    # credentials Google refuses (a revoked key): one line, not "cannot reach" (requests go to the emulator: API_ENDPOINT_OVERRIDE)
    pinned = {**env, "RFFM_WORKER_IMAGE": profile_env(BUCKET)["RFFM_WORKER_IMAGE"], "API_ENDPOINT_OVERRIDE": emulator}
    with token_endpoint(RefusingTokenServer) as uri:
        key = service_account_key(tmp_path / "revoked.json", uri)
        result = preflight_in({**pinned, "GOOGLE_APPLICATION_CREDENTIALS": str(key)})
    assert result.returncode == 1
    [line] = problems(result)
    assert line.startswith(f"reading gs://{BUCKET}: the Google Cloud credentials were refused (invalid_grant"), line
    assert line.endswith("Fix: run `gcloud auth application-default login` again (or check GOOGLE_APPLICATION_CREDENTIALS).")

    # the Fix: GOOGLE_APPLICATION_CREDENTIALS names a service-account key file that Google accepts
    with token_endpoint(GrantingTokenServer) as uri:
        key = service_account_key(tmp_path / "key.json", uri)
        result = preflight_in({**pinned, "GOOGLE_APPLICATION_CREDENTIALS": str(key)})
    assert result.returncode == 0 and problems(result) == [], result.stdout + result.stderr
    assert f"checked bucket gs://{BUCKET}: exists and is reachable (listed its objects)" in result.stdout.splitlines()
