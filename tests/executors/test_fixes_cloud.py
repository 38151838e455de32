"""Issue 34: every Fix the Google Cloud side prints — `rffm preflight` (rffm.cloud.preflight), the rffm-gcs storage plugin,
the rffm-googlebatch executor — provoked, followed as printed, and the same check or call then passes.

Nothing here reaches Google. Cloud Storage is gcp-storage-emulator on 127.0.0.1; where a Fix grants a role to the
account you are using, an IAM-enforcing proxy stands in front of it (`iam_enforcing`: it refuses object requests, as
Cloud Storage does, unless the bucket's policy grants that account an object role). A `gcloud` command a Fix (or
profiles/README.md, where a Fix points there) prints is run by bash as printed, with `gcloud` a shell function that
records its arguments; `GcloudStandIn` then makes on the emulator the change that command makes on Cloud Storage:
the faithful stand-in at the external boundary. The executor's refusals are its checks as Snakemake starts it, run
in-process on the shipped profile (`started`); tests/executors/test_googlebatch.py submits that profile's jobs.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest
import yaml
from batch_support import DIGEST, IMAGE, PROJECT, free_port, gcs_emulator, profile_env
from snakemake_interface_common.exceptions import WorkflowError
from test_gcs_storage import service_account_key
from test_preflight import GrantingTokenServer, token_endpoint

import snakemake_storage_plugin_rffm_gcs as rffm_gcs
from conftest import REPO
from fixes import fix_of, run_fix
from rffm.cloud import preflight
from rffm.errors import RffmError
from snakemake_executor_plugin_rffm_googlebatch.executor import require_pinned_image

ACCOUNT = f"rffm-batch@{PROJECT}.iam.gserviceaccount.com"  # the VMs' identity (profile_env)
YOU = "user:you@example.com"  # the account you are using, as iam_enforcing sees every request
BUCKET = "rffm-test-rffm"  # profiles/README.md's my-project-rffm, in project rffm-test
PROFILE = REPO / "profiles" / "gcp-batch" / "config.yaml"
OBJECT_ROLES = ("roles/storage.objectAdmin", "roles/storage.objectUser", "roles/storage.objectViewer", "roles/storage.admin")


def yours(example: str) -> str:
    """An example value of a Fix with this setup's own values where it names a placeholder (as a user fills them in)."""
    return example.replace("my-project", PROJECT).replace("<digest>", DIGEST.removeprefix("sha256:"))


def storage_client(url: str):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": url})


def readme_block(section: str) -> str:
    """The first bash block after profiles/README.md's paragraph `**<section>.**` (a Fix names it: README, <section>)."""
    text = (REPO / "profiles" / "README.md").read_text()
    return text[text.index(f"**{section}.**") :].split("```bash\n", 1)[1].split("```", 1)[0]


# ---- the stand-ins: gcloud's effect on Cloud Storage, and Cloud Storage's IAM check of the account you are using ----

RECORDER = "gcloud() { printf '%s\\0' \"$@\"; printf '\\1\\0'; }"  # each call: its arguments, then a \x01 field


class GcloudStandIn:
    """Runs a shell text with gcloud recorded, then does each call's Cloud Storage effect on the emulator. Only the
    commands and flags the Fixes and profiles/README.md use are known; any other is an error, as a typo is to gcloud."""

    def __init__(self, emulator: str, cwd: Path):
        self.client, self.cwd = storage_client(emulator), cwd

    def run(self, script: str, env: dict[str, str] | None = None) -> None:
        done = run_fix(f"{RECORDER}\n{script}", self.cwd, env)
        calls, call = [], []
        for field in done.stdout.split("\0")[:-1]:
            calls, call = (calls + [call], []) if field == "\1" else (calls, call + [field])
        assert calls, f"no gcloud command in {script!r}"
        for argv in calls:
            self.apply(argv)

    def apply(self, argv: list[str]) -> None:
        words = tuple(a for a in argv if not a.startswith("-"))
        if words == ("auth", "application-default", "login") and len(argv) == 3:
            return self.login()
        known: dict[tuple[str, ...], tuple[set[str], Callable]] = {
            ("storage", "buckets", "create"): ({"--project", "--location", "--uniform-bucket-level-access"}, self.create),
            ("storage", "buckets", "update"): ({"--uniform-bucket-level-access"}, self.update),
            ("storage", "buckets", "add-iam-policy-binding"): ({"--member", "--role", "--condition"}, self.add_binding),
            ("storage", "buckets", "remove-iam-policy-binding"): ({"--member", "--role", "--condition"}, self.remove_binding),
            ("projects", "add-iam-policy-binding"): ({"--member", "--role"}, lambda target, flags: None),  # no project IAM here
        }
        command = next((c for c in known if words[: len(c)] == c), None)
        assert command is not None, f"gcloud stand-in: unknown command {argv}"
        flags, positional = self.flags(argv[len(command) :], known[command][0])
        assert len(positional) == 1, f"gcloud {' '.join(command)}: one target expected, got {positional}"
        known[command][1](positional[0], flags)

    @staticmethod
    def login() -> None:
        """What `gcloud auth application-default login` leaves once the browser consent is given: the user's refresh token
        as Application Default Credentials, in the gcloud configuration folder (CLOUDSDK_CONFIG)."""
        from google.auth import _cloud_sdk

        credentials = {"type": "authorized_user", "client_id": "764086051850-test.apps.googleusercontent.com",
                       "client_secret": "test-secret", "refresh_token": "1//test-refresh-token"}  # fmt: skip
        Path(_cloud_sdk.get_application_default_credentials_path()).write_text(json.dumps(credentials))

    @staticmethod
    def flags(args: list[str], allowed: set[str]) -> tuple[dict[str, str | bool], list[str]]:
        flags, positional, rest = {}, [], iter(args)
        for arg in rest:
            if not arg.startswith("--"):
                positional.append(arg)
                continue
            name, given, value = arg.partition("=")
            assert name in allowed, f"gcloud stand-in: {name} is not a flag of this command (allowed: {sorted(allowed)})"
            flags[name] = True if name == "--uniform-bucket-level-access" else (value if given else next(rest))
        return flags, positional

    def bucket(self, url: str):
        assert re.fullmatch(r"gs://[^/]+/?", url), f"gcloud storage buckets: {url!r} is not gs://<bucket>"
        return self.client.bucket(url.removeprefix("gs://").rstrip("/"))

    def create(self, url: str, flags: dict) -> None:
        bucket = self.bucket(url)
        assert self.client.lookup_bucket(bucket.name) is None, f"gcloud: {url} already exists (HTTPError 409)"
        bucket = self.client.create_bucket(bucket.name)
        with warnings.catch_warnings():  # the emulator puts a new bucket in US whatever it is asked, and keeps what a patch sets
            warnings.simplefilter("ignore", DeprecationWarning)
            bucket.location = str(flags.get("--location", "US")).upper()  # as Cloud Storage reports it
        bucket.iam_configuration.uniform_bucket_level_access_enabled = bool(flags.get("--uniform-bucket-level-access"))
        bucket.patch()

    def update(self, url: str, flags: dict) -> None:
        bucket = self.client.get_bucket(self.bucket(url).name)
        bucket.iam_configuration.uniform_bucket_level_access_enabled = bool(flags.get("--uniform-bucket-level-access"))
        bucket.patch()

    def binding(self, url: str, flags: dict):
        bucket = self.client.get_bucket(self.bucket(url).name)
        policy = bucket.get_iam_policy(requested_policy_version=3)
        policy.version = 3
        condition = None
        if flags.get("--condition"):  # title=...,expression=... (the expression may hold commas)
            parts = re.split(r",(?=(?:title|description|expression)=)", str(flags["--condition"]))
            condition = dict(part.split("=", 1) for part in parts)
            # Cloud Storage refuses IAM Conditions on a bucket without uniform bucket-level access (HTTPError 400)
            assert bucket.iam_configuration.uniform_bucket_level_access_enabled, f"gcloud: {url}: conditions need uniform access"
        return bucket, policy, {"role": flags["--role"], "member": flags["--member"], "condition": condition}

    def add_binding(self, url: str, flags: dict) -> None:
        bucket, policy, wanted = self.binding(url, flags)
        same = [b for b in policy.bindings if b["role"] == wanted["role"] and b.get("condition") == wanted["condition"]]
        if same:
            same[0]["members"] = {*same[0]["members"], wanted["member"]}
        else:
            entry = {"role": wanted["role"], "members": {wanted["member"]}}
            policy.bindings.append({**entry, "condition": wanted["condition"]} if wanted["condition"] else entry)
        bucket.set_iam_policy(policy)

    def remove_binding(self, url: str, flags: dict) -> None:
        bucket, policy, wanted = self.binding(url, flags)
        for binding in policy.bindings:
            if binding["role"] == wanted["role"] and binding.get("condition") == wanted["condition"]:
                binding["members"] = {m for m in binding["members"] if m != wanted["member"]}
        # a binding that is not there: gcloud says so and a pasted block goes on to its next command
        policy.bindings = [b for b in policy.bindings if b["members"]]
        bucket.set_iam_policy(policy)


@contextlib.contextmanager
def iam_enforcing(emulator: str) -> Iterator[str]:
    """A proxy to the emulator that answers an object request (list, read, write) 403, as Cloud Storage does, unless the
    bucket's IAM policy grants YOU an object role; every other request passes through. Yields its URL."""
    upstream = urlparse(emulator)
    objects = re.compile(r"^(?:/upload|/download)?/storage/v1/b/([^/?]+)/o(?:[/?]|$)")

    def granted(bucket: str) -> bool:
        connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
        connection.request("GET", f"/storage/v1/b/{bucket}/iam?optionsRequestedPolicyVersion=3")
        response = connection.getresponse()
        policy = json.loads(response.read() or b"{}")
        if response.status == 404:  # the bucket does not exist: Cloud Storage says so
            return True
        return any(b["role"] in OBJECT_ROLES and YOU in b.get("members", ()) for b in policy.get("bindings", ()))

    class Proxy(http.server.BaseHTTPRequestHandler):
        def relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if (match := objects.match(self.path)) and not granted(match.group(1)):
                message = f"{YOU.partition(':')[2]} does not have storage.objects.list access to the Google Cloud Storage bucket."
                return self.answer(403, [], json.dumps({"error": {"code": 403, "message": message}}).encode())
            connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            connection.request(self.command, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
            self.answer(response.status, response.getheaders(), response.read())

        def answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status)
            for key, value in headers:
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            if not headers:  # the proxy's own 403
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = relay

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with gcs_emulator() as url:
        yield url


@pytest.fixture
def gcloud(emulator: str, tmp_path: Path) -> GcloudStandIn:
    return GcloudStandIn(emulator, tmp_path)


def set_up(gcloud: GcloudStandIn, bucket: str, location: str = "us-central1", uniform: bool = True, ledger: bool = True) -> None:
    """profiles/README.md's bucket: created in `location` (uniform bucket-level access unless told), the VM account's
    roles/storage.objectAdmin, then (`ledger`) its Write-once ledger bindings instead."""
    if gcloud.client.lookup_bucket(bucket) is not None:
        return
    access = " --uniform-bucket-level-access" if uniform else ""
    gcloud.run(f"gcloud storage buckets create gs://{bucket} --project {PROJECT} --location {location}{access}")
    gcloud.run(
        f"gcloud storage buckets add-iam-policy-binding gs://{bucket} --member serviceAccount:{ACCOUNT} --role roles/storage.objectAdmin"
    )
    if ledger:
        gcloud.run(readme_block("Write-once ledger"), profile_env(bucket))


def check(env: dict[str, str], client, profile: str | Path = "gcp-batch") -> tuple[list[str], list[str]]:
    """`rffm preflight --profile <profile>` with this environment: (problems, checked)."""
    return preflight.preflight(profile, REPO, env, client=client)


# ---- rffm preflight ----


def exported(fix: str) -> dict[str, str]:
    """`export NAME=VALUE (...)`: the variable as a user sets it, the example's placeholders filled in."""
    match = re.match(r"export ([A-Z_][A-Z0-9_]*)=(\S+)", fix)
    assert match, f"not an export of a value: {fix!r}"
    return {match.group(1): yours(match.group(2))}


EXPORTS = {  # what is wrong in the environment -> how its printed Fix is done
    "project unset": ({"RFFM_GCP_PROJECT": None}, exported),
    "bucket unset": ({"RFFM_GCS_BUCKET": None}, exported),
    "service account unset": ({"RFFM_BATCH_SERVICE_ACCOUNT": None}, exported),
    "image unset": ({"RFFM_WORKER_IMAGE": None}, exported),
    "service account not an address": ({"RFFM_BATCH_SERVICE_ACCOUNT": "rffm-batch"}, exported),
    "project name for its id": ({"RFFM_GCP_PROJECT": "My Project"}, lambda fix: {"RFFM_GCP_PROJECT": PROJECT}),
    "invalid bucket name": ({"RFFM_GCS_BUCKET": "My_Bucket"}, lambda fix: {"RFFM_GCS_BUCKET": BUCKET}),
    "image by tag": ({"RFFM_WORKER_IMAGE": IMAGE.split("@")[0] + ":latest"}, lambda fix: {"RFFM_WORKER_IMAGE": IMAGE}),
}
PROSE = {  # the Fixes above that say what to export rather than print the line
    "project name for its id": "export the id, not the name",
    "invalid bucket name": "correct it",
    "image by tag": "export the digest the registry printed when you pushed (profiles/README.md, Google Cloud).",
}


@pytest.mark.parametrize("case", EXPORTS)
def test_a_missing_or_malformed_variable_is_fixed_by_exporting_what_the_fix_says(case: str, gcloud: GcloudStandIn, emulator: str):
    set_up(gcloud, BUCKET)
    wrong, follow = EXPORTS[case]
    env = {name: value for name, value in {**profile_env(BUCKET), **wrong}.items() if value is not None}
    problem, *derived = check(env, storage_client(emulator))[0]
    assert len(derived) == (case == "service account not an address")  # and it holds no storage role on the bucket
    fix = fix_of(problem)
    assert case not in PROSE or fix == PROSE[case], problem
    env.update(follow(fix))
    assert env == profile_env(BUCKET)  # what the Fix says is this setup's value
    problems, checked = check(env, storage_client(emulator))
    assert problems == [] and f"worker image pinned by digest: {IMAGE}" in checked, problems


def uncommented(text: str, *keys: str) -> str:
    for key in keys:
        assert f"\n# {key}:" in text, f"the profile has no commented {key} line"
        text = text.replace(f"\n# {key}:", f"\n{key}:")
    return text


NETWORK = "rffm-googlebatch-network"
SUBNETWORK = "rffm-googlebatch-subnetwork"
PRIVATE = "rffm-googlebatch-no-external-ip-address"
SUBNET_PATH = f"projects/{PROJECT}/regions/us-central1/subnetworks/rffm-central"


def filled_form(fix_line: str, name: str) -> str:
    """The form a `... is not <form>. Fix: use that form` line names, with this project, region and name."""
    form = re.search(r" is not (projects/\S+)\. Fix: use that form$", fix_line).group(1)
    return form.replace("<project>", PROJECT).replace("<region>", "us-central1").replace("<name>", name)


NETWORK_CASES = {  # the profile as the user left it -> the profile and environment after following the Fix
    "private without subnetwork": (
        lambda text: uncommented(text, PRIVATE),
        lambda text, line: (
            uncommented(text, NETWORK, SUBNETWORK),
            {name: preflight.EXAMPLES[name] for name in ("RFFM_BATCH_NETWORK", "RFFM_BATCH_SUBNETWORK")},
        ),
    ),
    "network not a path": (
        lambda text: text + f"{NETWORK}: rffm-vpc\n",
        lambda text, line: (text.replace(f"{NETWORK}: rffm-vpc", f"{NETWORK}: {filled_form(line, 'rffm-vpc')}"), {}),
    ),
    "subnetwork not a path": (
        lambda text: text + f"{SUBNETWORK}: rffm-central\n",
        lambda text, line: (text.replace(f"{SUBNETWORK}: rffm-central", f"{SUBNETWORK}: {filled_form(line, 'rffm-central')}"), {}),
    ),
    "subnetwork in another region": (
        lambda text: text + f"{SUBNETWORK}: {SUBNET_PATH.replace('us-central1', 'europe-west4')}\n",
        lambda text, line: (text.replace("/regions/europe-west4/", "/regions/us-central1/"), {}),
    ),
}
NETWORK_FIXES = {
    "private without subnetwork": "uncomment the network block of the profile and export RFFM_BATCH_NETWORK and RFFM_BATCH_SUBNETWORK "
    "(profiles/README.md, Network)",
    "network not a path": "use that form",
    "subnetwork not a path": "use that form",
    "subnetwork in another region": "name a subnetwork of the jobs' region",
}


@pytest.mark.parametrize("case", NETWORK_CASES)
def test_a_network_setting_is_fixed_as_its_line_says(case: str, gcloud: GcloudStandIn, emulator: str, tmp_path: Path):
    set_up(gcloud, BUCKET)
    profile = tmp_path / "gcp-batch" / "config.yaml"
    profile.parent.mkdir()
    provoke, follow = NETWORK_CASES[case]
    profile.write_text(provoke(PROFILE.read_text()))
    [problem], _ = check(profile_env(BUCKET), storage_client(emulator), profile.parent)
    assert fix_of(problem) == NETWORK_FIXES[case], problem
    text, env = follow(profile.read_text(), problem)
    profile.write_text(text)
    problems, checked = check({**profile_env(BUCKET), **env}, storage_client(emulator), profile.parent)
    assert problems == [] and any(line.startswith("network: ") for line in checked), problems


def test_a_misnamed_profile_is_fixed_by_naming_the_profile_directory(emulator: str, gcloud: GcloudStandIn, monkeypatch):
    set_up(gcloud, BUCKET)
    with pytest.raises(RffmError) as caught:
        check(profile_env(BUCKET), storage_client(emulator), "gcp-bach")
    assert fix_of(caught) == "name a profile directory (e.g. profiles/gcp-batch)"
    monkeypatch.chdir(REPO)  # where a user runs rffm preflight: the checkout
    assert check(profile_env(BUCKET), storage_client(emulator), "profiles/gcp-batch")[0] == []


def test_a_bucket_in_another_region_is_fixed_either_way_the_fix_names(gcloud: GcloudStandIn, emulator: str, tmp_path: Path):
    set_up(gcloud, "rffm-test-eu", location="europe-west4")
    env = profile_env("rffm-test-eu")
    [problem], _ = check(env, storage_client(emulator))
    assert problem.startswith("gs://rffm-test-eu: in europe-west4, the jobs run in us-central1; every read and write crosses regions")
    fix = "set rffm-googlebatch-region to the bucket's region, or use a bucket in the jobs' region"
    assert fix_of(problem) == fix
    profile = tmp_path / "gcp-batch" / "config.yaml"  # the profile's region set to the bucket's
    profile.parent.mkdir()
    profile.write_text(PROFILE.read_text().replace("rffm-googlebatch-region: us-central1", "rffm-googlebatch-region: europe-west4"))
    problems, checked = check(env, storage_client(emulator), profile.parent)
    assert problems == [] and "bucket region: europe-west4 (jobs in europe-west4)" in checked, problems
    set_up(gcloud, "rffm-test-us", location="us-central1")  # or a bucket in the jobs' region
    problems, checked = check(profile_env("rffm-test-us"), storage_client(emulator))
    assert problems == [] and "bucket region: us-central1 (jobs in us-central1)" in checked, problems


def test_uniform_access_off_and_a_ledger_deleting_role_are_fixed_by_the_printed_command_then_the_readme_bindings(
    gcloud: GcloudStandIn, emulator: str
):
    """A bucket made without --uniform-bucket-level-access, the VM account's objectAdmin as the one-time setup grants it."""
    set_up(gcloud, "rffm-test-acl", uniform=False, ledger=False)
    env = profile_env("rffm-test-acl")
    access, role = check(env, storage_client(emulator))[0]
    assert access.startswith("gs://rffm-test-acl: uniform bucket-level access is off"), access
    gcloud.run(fix_of(access))  # gcloud storage buckets update gs://rffm-test-acl --uniform-bucket-level-access
    assert check(env, storage_client(emulator))[0] == [role]
    assert role.startswith(f"{ACCOUNT}: holds roles/storage.objectAdmin on all of gs://rffm-test-acl, so any job can delete")
    section = re.search(r"the IAM Condition bindings of profiles/README\.md, ([\w -]+) \(", fix_of(role)).group(1)
    gcloud.run(readme_block(section), env)
    problems, checked = check(env, storage_client(emulator))
    assert problems == [] and any(line.startswith(f"IAM: {ACCOUNT} may use gs://rffm-test-acl") for line in checked), problems


def test_a_vm_account_without_a_storage_role_is_fixed_by_the_readme_bindings(gcloud: GcloudStandIn, emulator: str):
    gcloud.run(
        f"gcloud storage buckets create gs://rffm-test-norole --project {PROJECT} --location us-central1 --uniform-bucket-level-access"
    )
    env = profile_env("rffm-test-norole")
    [problem], _ = check(env, storage_client(emulator))
    assert problem.startswith(f"{ACCOUNT}: holds no storage role on gs://rffm-test-norole"), problem
    section = re.fullmatch(r"the bucket bindings of profiles/README\.md, ([\w -]+)", fix_of(problem)).group(1)
    gcloud.run(readme_block(section), env)
    assert check(env, storage_client(emulator))[0] == []


def test_access_denied_to_you_is_fixed_by_granting_your_account_object_admin(gcloud: GcloudStandIn, emulator: str):
    set_up(gcloud, "rffm-test-denied")
    env = profile_env("rffm-test-denied")
    with iam_enforcing(emulator) as proxy:
        [problem], _ = check(env, storage_client(proxy))
        assert problem.startswith("gs://rffm-test-denied: access denied (") and problem.endswith(
            "Fix: grant your account roles/storage.objectAdmin (profiles/README.md, Google Cloud)"
        ), problem
        gcloud.run(f"gcloud storage buckets add-iam-policy-binding gs://rffm-test-denied --member {YOU} --role roles/storage.objectAdmin")
        problems, checked = check(env, storage_client(proxy))
    assert problems == [] and "bucket gs://rffm-test-denied: exists and is reachable (listed its objects)" in checked, problems


def test_an_unreachable_endpoint_is_fixed_by_pointing_storage_emulator_host_at_it(gcloud: GcloudStandIn, emulator: str, monkeypatch):
    from google.cloud.storage.retry import DEFAULT_RETRY

    set_up(gcloud, BUCKET)
    for name in ("_timeout", "_deadline"):  # the client retries an unreachable endpoint for 120 s
        monkeypatch.setattr(DEFAULT_RETRY, name, 0.5)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    [problem], _ = check(profile_env(BUCKET), None)
    assert f"gs://{BUCKET}: cannot reach http://127.0.0.1:" in problem, problem
    assert fix_of(problem) == "check the network, STORAGE_EMULATOR_HOST"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
    assert check(profile_env(BUCKET), None)[0] == []


# ---- the rffm-gcs storage plugin, as Snakemake makes it: the provider, then an object of the default storage prefix ----


@pytest.fixture
def offline(monkeypatch, tmp_path: Path) -> None:
    """No Google credentials of any kind, no GCE metadata server, no emulator (test_gcs_storage.offline_env, in-process)."""
    for name in [
        *(k for k in os.environ if k.startswith(("GOOGLE_", "GCE_", "CLOUDSDK_"))),
        "STORAGE_EMULATOR_HOST",
        "API_ENDPOINT_OVERRIDE",
    ]:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "gcloud-config").mkdir()
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud-config"))
    for name, value in {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}.items():
        monkeypatch.setenv(name, value)


def provider(tmp_path: Path, project: str = PROJECT) -> rffm_gcs.StorageProvider:
    """The provider Snakemake makes for --storage-rffm-gcs-project <project> (a profile value, $VARIABLES expanded)."""
    settings = rffm_gcs.StorageProviderSettings(project=os.path.expandvars(project))
    return rffm_gcs.StorageProvider(local_prefix=tmp_path / ".snakemake/storage", logger=logging.getLogger(__name__), settings=settings)


def reads(tmp_path: Path, prefix: str = f"gs://{BUCKET}/rffm") -> rffm_gcs.StorageObject:
    """An object of the default storage prefix (a profile value, $VARIABLES expanded), as Snakemake names one first."""
    return provider(tmp_path).object(f"{os.path.expandvars(prefix)}/results/runs/base/qualification/run_manifest.json")


CREDENTIALS = {  # the Fix's ways, each as the environment it leaves
    "a service-account key file": lambda tmp_path, emulator, token_uri: {
        "GOOGLE_APPLICATION_CREDENTIALS": str(service_account_key(tmp_path / "key.json", token_uri)),  # a key Google accepts
        "API_ENDPOINT_OVERRIDE": emulator,  # its requests go to the emulator (STORAGE_EMULATOR_HOST would drop credentials)
    },
    "a local emulator": lambda tmp_path, emulator, token_uri: {"STORAGE_EMULATOR_HOST": emulator},
}


def test_no_credentials_are_fixed_by_gcloud_application_default_login(offline, gcloud: GcloudStandIn, emulator: str, tmp_path, monkeypatch):
    """The Fix's first way, as printed, through the gcloud stand-in (the credentials it leaves). google-auth refreshes
    such a user's token at Google's one OAuth endpoint whatever the file says, so that endpoint (the boundary) is a local
    one granting the refresh, and the requests go to the emulator."""
    import google.oauth2.credentials

    set_up(gcloud, BUCKET)
    with pytest.raises(rffm_gcs.Refused) as caught:
        reads(tmp_path)
    [command] = re.findall(r"run `([^`]+)`", fix_of(caught))
    assert command == "gcloud auth application-default login"
    gcloud.run(command)
    with token_endpoint(GrantingTokenServer) as uri:
        monkeypatch.setattr(google.oauth2.credentials, "_GOOGLE_OAUTH2_TOKEN_ENDPOINT", uri)
        monkeypatch.setenv("API_ENDPOINT_OVERRIDE", emulator)
        assert reads(tmp_path).bucket.name == BUCKET


@pytest.mark.parametrize("way", CREDENTIALS)
def test_no_credentials_are_fixed_by_a_key_file_or_an_emulator(
    way: str, offline, gcloud: GcloudStandIn, emulator: str, tmp_path, monkeypatch
):
    """The Fix's other two ways (its first: above)."""
    set_up(gcloud, BUCKET)
    with pytest.raises(rffm_gcs.Refused) as caught:
        reads(tmp_path)
    fix = fix_of(caught)
    assert "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file" in fix and "point STORAGE_EMULATOR_HOST at a" in fix
    with token_endpoint(GrantingTokenServer) as uri:
        for name, value in CREDENTIALS[way](tmp_path, emulator, uri).items():
            monkeypatch.setenv(name, value)
        assert reads(tmp_path).bucket.name == BUCKET


def test_permission_denied_is_fixed_by_granting_the_account_you_use(offline, gcloud: GcloudStandIn, emulator: str, tmp_path, monkeypatch):
    set_up(gcloud, "rffm-test-refused")
    prefix = "gs://rffm-test-refused/rffm"
    with iam_enforcing(emulator) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy)
        with pytest.raises(rffm_gcs.Refused) as caught:
            reads(tmp_path, prefix)
        assert str(caught.value).startswith("rffm-gcs: reading gs://rffm-test-refused: permission denied (403 ")
        assert fix_of(caught).startswith(
            "grant the account you are using roles/storage.objectAdmin on the bucket and roles/serviceusage.serviceUsageConsumer "
            "on the project named by storage-rffm-gcs-project"
        )
        gcloud.run(  # the project grant has nothing to set on the emulator (it bills no project): only recorded
            f"gcloud storage buckets add-iam-policy-binding gs://rffm-test-refused --member {YOU} --role roles/storage.objectAdmin\n"
            f"gcloud projects add-iam-policy-binding {PROJECT} --member {YOU} --role roles/serviceusage.serviceUsageConsumer"
        )
        assert reads(tmp_path, prefix).bucket.name == "rffm-test-refused"


def test_a_missing_bucket_is_fixed_by_the_printed_create_command(offline, gcloud: GcloudStandIn, emulator: str, tmp_path, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
    with pytest.raises(rffm_gcs.Refused) as caught:
        reads(tmp_path, "gs://rffm-test-new/rffm")
    command = re.search(r"create the bucket once: `([^`]+)`", fix_of(caught)).group(1)
    assert command == "gcloud storage buckets create gs://rffm-test-new --project PROJECT --location REGION --uniform-bucket-level-access"
    gcloud.run(command.replace("PROJECT", PROJECT).replace("REGION", "us-central1"))  # its placeholders, filled in
    assert reads(tmp_path, "gs://rffm-test-new/rffm").bucket.name == "rffm-test-new"
    created = gcloud.client.get_bucket("rffm-test-new")
    assert created.location == "US-CENTRAL1" and created.iam_configuration.uniform_bucket_level_access_enabled


@pytest.mark.parametrize("variable", ["RFFM_GCP_PROJECT", "RFFM_GCS_BUCKET"])
def test_an_unset_profile_variable_is_fixed_by_exporting_it(
    variable: str, offline, gcloud: GcloudStandIn, emulator: str, tmp_path, monkeypatch
):
    """The profile's storage-rffm-gcs-project: $RFFM_GCP_PROJECT and default-storage-prefix: gs://$RFFM_GCS_BUCKET/rffm."""
    set_up(gcloud, BUCKET)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
    for name in ("RFFM_GCP_PROJECT", "RFFM_GCS_BUCKET"):
        monkeypatch.setenv(name, profile_env(BUCKET)[name])
    monkeypatch.delenv(variable)
    project, prefix = "$RFFM_GCP_PROJECT", "gs://$RFFM_GCS_BUCKET/rffm"
    with pytest.raises(rffm_gcs.Refused) as caught:
        provider(tmp_path, project).object(f"{os.path.expandvars(prefix)}/results/x.json")
    assert f"environment variable {variable} is not set" in str(caught.value)
    assert fix_of(caught).startswith("export it (profiles/README.md, Google Cloud)")
    monkeypatch.setenv(variable, profile_env(BUCKET)[variable])
    assert provider(tmp_path, project).object(f"{os.path.expandvars(prefix)}/results/x.json").bucket.name == BUCKET


def test_an_unreachable_storage_endpoint_is_fixed_by_setting_storage_emulator_host_to_it(
    offline, gcloud: GcloudStandIn, emulator: str, tmp_path, monkeypatch
):
    set_up(gcloud, BUCKET)
    monkeypatch.setattr(rffm_gcs, "REACH_TIMEOUT_S", 0.5)  # it retries an unreachable endpoint for 20 s
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(rffm_gcs.Refused) as caught:
        reads(tmp_path)
    assert str(caught.value).startswith("rffm-gcs: cannot reach Cloud Storage at http://127.0.0.1:")
    assert fix_of(caught) == "check the network; for a local emulator, start it and set STORAGE_EMULATOR_HOST to its URL."
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
    assert reads(tmp_path).bucket.name == BUCKET


# ---- the rffm-googlebatch executor ----


def test_an_unpinned_image_is_fixed_by_the_digest_form_the_fix_names():
    tagged = IMAGE.split("@")[0] + ":v1"
    with pytest.raises(WorkflowError) as caught:
        require_pinned_image(tagged, "rffm-googlebatch-container")
    form = re.match(r"use (\S+@sha256:<digest>) ", fix_of(str(caught.value.args[0]))).group(1)
    assert require_pinned_image(yours(form), "rffm-googlebatch-container") == IMAGE


def started(profile_text: str, tmp_path: Path, monkeypatch) -> None:
    """rffm-googlebatch's checks as Snakemake starts it (Executor.__post_init__: before anything is submitted), given the
    profile's rffm-googlebatch-* settings and default-storage-prefix as Snakemake reads them ($VARIABLES expanded from the
    environment, unset ones kept) and the workflow's container: as common.smk declares it. Its __init__, Snakemake's
    status thread, is left out and the Batch client is never called (tests/executors/test_googlebatch.py submits)."""
    from google.cloud import batch_v1

    from snakemake_executor_plugin_rffm_googlebatch import ExecutorSettings
    from snakemake_executor_plugin_rffm_googlebatch.executor import Executor

    values = {key: os.path.expandvars(value) if isinstance(value, str) else value for key, value in yaml.safe_load(profile_text).items()}
    settings = {key.removeprefix("rffm-googlebatch-").replace("-", "_"): value for key, value in values.items() if key.startswith("rffm-")}
    executor = object.__new__(Executor)
    executor.logger, executor.executor_settings = logging.getLogger(__name__), ExecutorSettings(**settings)
    executor.workflow = SimpleNamespace(
        persistence=SimpleNamespace(path=str(tmp_path / ".snakemake")),
        storage_settings=SimpleNamespace(default_storage_prefix=values["default-storage-prefix"]),
        modifier=SimpleNamespace(global_container_img=f"docker://{IMAGE}"),
        remote_execution_settings=SimpleNamespace(container_image=None),
    )
    monkeypatch.setattr(batch_v1, "BatchServiceClient", lambda *args, **kwargs: None)
    executor.__post_init__()


def test_an_unset_variable_and_a_non_cos_image_family_are_fixed_as_printed(tmp_path: Path, monkeypatch):
    """The shipped profile, RFFM_BATCH_SERVICE_ACCOUNT unset and the image family changed: each refusal in turn."""
    for name, value in profile_env(BUCKET).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RFFM_BATCH_SERVICE_ACCOUNT")
    family = "rffm-googlebatch-image-family: batch-cos-stable-official"
    profile = PROFILE.read_text().replace(family, "rffm-googlebatch-image-family: cos-stable")
    with pytest.raises(WorkflowError) as caught:
        started(profile, tmp_path, monkeypatch)
    line = caught.value.args[0]
    assert line.startswith("rffm-googlebatch: environment variable RFFM_BATCH_SERVICE_ACCOUNT is not set"), line
    assert fix_of(line) == "export it (profiles/README.md, Google Cloud); nothing was submitted."
    monkeypatch.setenv("RFFM_BATCH_SERVICE_ACCOUNT", ACCOUNT)
    with pytest.raises(WorkflowError) as caught:
        started(profile, tmp_path, monkeypatch)
    assert fix_of(caught.value.args[0]) == "set it to batch-cos-stable-official (image project batch-custom-image)."
    profile = profile.replace("rffm-googlebatch-image-family: cos-stable", family)
    assert "rffm-googlebatch-image-project: batch-custom-image" in profile
    started(profile, tmp_path, monkeypatch)
