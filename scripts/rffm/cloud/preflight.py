"""`rffm preflight --profile gcp-batch`: what a Google Batch run needs, checked before anything is submitted.

Reads the profile (profiles/gcp-batch/config.yaml) and the environment it names, then asks Cloud Storage
(STORAGE_EMULATOR_HOST for a local emulator) about the bucket. Each problem is one line with its fix, no
credentials (or refused ones) included, and the offline checks are reported whatever the credentials;
a setup without problems prints what was checked. Nothing is created or changed.

Checked: every environment variable the profile (and the workflow: RFFM_WORKER_IMAGE) reads; the worker
image pinned by digest; the project id and service-account address; the bucket's name, existence and
reachability; where the bucket's metadata can be read, its region against the jobs' and uniform
bucket-level access; where its IAM policy can be read, that the VM account may use the bucket and
cannot delete ledger entries (roles/storage.objectAdmin without the ledger's IAM Condition lets any
job delete them; profiles/README.md, "Write-once ledger"); the network settings; the protection of
every ledger entry already in the bucket.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from rffm.errors import RffmError
from rffm.records.layout import LEDGER

# A digest-pinned image reference: <registry>[:port]/<path>@sha256:<64 hex> (a tag can move).
PINNED_IMAGE = re.compile(r"[^\s@:]+(:[0-9]+)?/[^\s@]+@sha256:[0-9a-f]{64}")
PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
SERVICE_ACCOUNT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]@([a-z][a-z0-9-]{4,28}[a-z0-9]\.iam|developer)\.gserviceaccount\.com")
VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
# What each variable holds, for the Fix of a missing one (profiles/README.md, Google Cloud).
EXAMPLES = {
    "RFFM_GCP_PROJECT": "my-project",
    "RFFM_GCS_BUCKET": "my-project-rffm",
    "RFFM_BATCH_SERVICE_ACCOUNT": "rffm-batch@my-project.iam.gserviceaccount.com",
    "RFFM_WORKER_IMAGE": "us-central1-docker.pkg.dev/my-project/rffm/worker@sha256:<digest>",
    "RFFM_BATCH_NETWORK": "rffm-vpc",
    "RFFM_BATCH_SUBNETWORK": "rffm-central",
}
DELETING_ROLES = ("roles/storage.objectAdmin", "roles/storage.admin", "roles/storage.legacyBucketOwner", "roles/owner", "roles/editor")
OBJECT_ROLES = (*DELETING_ROLES, "roles/storage.objectUser", "roles/storage.objectCreator", "roles/storage.objectViewer")
README = "profiles/README.md, Google Cloud"


def pinned_image_problem(image: str) -> str | None:
    """Why a worker image reference is not pinned by digest, or None (common.smk refuses the same before planning)."""
    if PINNED_IMAGE.fullmatch(image):
        return None
    return (
        f"RFFM_WORKER_IMAGE={image}: the worker image must be pinned by digest (<image>@sha256:<64 hex>); a tag can move, so "
        "the jobs of one run could run different code. Fix: export the digest the registry printed when you pushed "
        f"({README})."
    )


def read_profile(profile: str | Path, checkout: Path) -> tuple[Path, dict[str, Any]]:
    """The profile's config.yaml (a name under checkout/profiles, or a directory) and its settings."""
    folder = Path(profile) if Path(profile).is_dir() else checkout / "profiles" / str(profile)
    path = folder / "config.yaml"
    if not path.is_file():
        raise RffmError(f"{path}: no such profile. Fix: name a profile directory (e.g. profiles/gcp-batch)")
    settings = yaml.safe_load(path.read_text()) or {}
    if settings.get("executor") != "rffm-googlebatch":
        raise RffmError(f"{path}: preflight checks Google Batch profiles (executor: rffm-googlebatch), not {settings.get('executor')!r}")
    return path, settings


def _strings(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _strings(item, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, key)


def expand(text: str, env: Mapping[str, str]) -> str:
    """A profile value with its $VARIABLES from env (unset ones kept, as Snakemake leaves them)."""
    return VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def variable_problems(settings: dict[str, Any], env: Mapping[str, str], where: Path) -> list[str]:
    """Every environment variable the profile reads (and RFFM_WORKER_IMAGE, which the workflow reads) that is not set."""
    readers: dict[str, str] = {"RFFM_WORKER_IMAGE": "the workflow (workflow/rules/common.smk)"}
    for key, text in _strings(settings):
        for name in VARIABLE.findall(text):
            readers.setdefault(name, f"{where} ({key})")
    return [
        f"{name}: not set; {reader} reads it. Fix: export {name}={EXAMPLES.get(name, '<value>')} ({README})"
        for name, reader in readers.items()
        if not env.get(name)
    ]


def network_problems(settings: dict[str, Any], env: Mapping[str, str]) -> tuple[list[str], str]:
    """(problems, what was checked) of the profile's network settings."""
    region = str(settings.get("rffm-googlebatch-region", ""))
    network = expand(str(settings.get("rffm-googlebatch-network") or ""), env)
    subnetwork = expand(str(settings.get("rffm-googlebatch-subnetwork") or ""), env)
    private = bool(settings.get("rffm-googlebatch-no-external-ip-address"))
    problems = []
    if private and not subnetwork:
        problems.append(
            "rffm-googlebatch-no-external-ip-address: true without rffm-googlebatch-subnetwork: VMs without external addresses "
            "reach Google APIs only through a subnetwork with Private Google Access (or Cloud NAT). Fix: uncomment the network "
            "block of the profile and export RFFM_BATCH_NETWORK and RFFM_BATCH_SUBNETWORK (profiles/README.md, Network)"
        )
    if network and "$" not in network and not re.fullmatch(r"projects/[^/]+/global/networks/[^/]+", network):
        problems.append(f"rffm-googlebatch-network: {network!r} is not projects/<project>/global/networks/<name>. Fix: use that form")
    if subnetwork and "$" not in subnetwork:
        match = re.fullmatch(r"projects/[^/]+/regions/([^/]+)/subnetworks/[^/]+", subnetwork)
        if not match:
            problems.append(
                f"rffm-googlebatch-subnetwork: {subnetwork!r} is not projects/<project>/regions/<region>/subnetworks/<name>. "
                "Fix: use that form"
            )
        elif match.group(1) != region:
            problems.append(
                f"rffm-googlebatch-subnetwork: in region {match.group(1)}, the jobs run in {region} (rffm-googlebatch-region). "
                "Fix: name a subnetwork of the jobs' region"
            )
    if subnetwork:
        addresses = "no external IP addresses" if private else "external IP addresses"
        checked = f"network: {network or 'the subnetwork’s'} / {subnetwork}, {addresses}"
    else:
        checked = "network: the project's default VPC network with external IP addresses (profiles/README.md, Network)"
    return problems, checked


def identity_problems(env: Mapping[str, str]) -> list[str]:
    """The project id and the VM service account's address, where set."""
    problems = []
    project, account = env.get("RFFM_GCP_PROJECT"), env.get("RFFM_BATCH_SERVICE_ACCOUNT")
    if project and not PROJECT_ID.fullmatch(project):
        problems.append(
            f"RFFM_GCP_PROJECT={project}: not a project id (6-30 lower-case letters, digits, '-'). Fix: export the id, not the name"
        )
    if account and not SERVICE_ACCOUNT.fullmatch(account):
        problems.append(
            f"RFFM_BATCH_SERVICE_ACCOUNT={account}: not a service-account address. Fix: export "
            f"RFFM_BATCH_SERVICE_ACCOUNT=rffm-batch@{project or 'PROJECT'}.iam.gserviceaccount.com ({README})"
        )
    return problems


def bucket_checks(client: Any, bucket_name: str, region: str, account: str | None) -> tuple[list[str], list[str]]:
    """(problems, checked) of the results bucket: it exists and is reachable, its region, access, IAM and ledger."""
    import google.auth.exceptions
    from google.api_core import exceptions as api

    from snakemake_storage_plugin_rffm_gcs import BUCKET_NAME, PLUGIN, explanation, missing_bucket

    if not BUCKET_NAME.fullmatch(bucket_name):
        return [f"RFFM_GCS_BUCKET={bucket_name}: not a valid bucket name (lower-case letters, digits, '-', '_', '.'). Fix: correct it"], []
    bucket = client.bucket(bucket_name)
    try:  # what the rffm-gcs plugin and the jobs do: list objects (storage.objects.list)
        next(iter(client.list_blobs(bucket, max_results=1, timeout=20)), None)
    except api.NotFound:
        return [str(missing_bucket(bucket_name)).removeprefix(f"{PLUGIN}: ")], []
    except (api.Forbidden, api.Unauthorized) as error:
        return [f"gs://{bucket_name}: access denied ({error.message}). Fix: grant your account roles/storage.objectAdmin ({README})"], []
    except google.auth.exceptions.GoogleAuthError as error:  # credentials Google refuses (expired, revoked): not the network
        return [explanation(error, f"reading gs://{bucket_name}").removeprefix(f"{PLUGIN}: ")], []
    except Exception as error:  # noqa: BLE001 - unreachable endpoint, DNS, TLS: one line naming it
        endpoint = getattr(client, "api_endpoint", "Cloud Storage")
        return [f"gs://{bucket_name}: cannot reach {endpoint} ({type(error).__name__}). Fix: check the network, STORAGE_EMULATOR_HOST"], []
    problems, checked = [], [f"bucket gs://{bucket_name}: exists and is reachable (listed its objects)"]
    try:
        bucket.reload()
    except (api.Forbidden, api.Unauthorized):
        checked.append(f"bucket gs://{bucket_name} region and access settings: not checked (your account may not read bucket metadata)")
    else:
        location = (bucket.location or "").lower()
        if "-" in location and location != region:
            problems.append(
                f"gs://{bucket_name}: in {location}, the jobs run in {region}; every read and write crosses regions (slower, "
                "billed egress). Fix: set rffm-googlebatch-region to the bucket's region, or use a bucket in the jobs' region"
            )
        else:
            checked.append(f"bucket region: {location or 'unknown'} (jobs in {region})")
        retention = "enabled" if bucket.object_retention_mode == "Enabled" else "not enabled"
        checked.append(f"bucket object retention: {retention} (profiles/README.md, Write-once ledger)")
        if not bucket.iam_configuration.uniform_bucket_level_access_enabled:
            problems.append(
                f"gs://{bucket_name}: uniform bucket-level access is off, so IAM Conditions (the ledger's write-once recipe) cannot "
                f"apply and object ACLs can grant more. Fix: gcloud storage buckets update gs://{bucket_name} --uniform-bucket-level-access"
            )
    if account:
        iam_problems, iam_checked = iam_checks(bucket, account)
        problems += iam_problems
        checked += iam_checked
    return problems, checked


def iam_checks(bucket: Any, account: str) -> tuple[list[str], list[str]]:
    """The VM account may use the bucket, and no unconditional role of it may delete ledger entries."""
    from google.api_core import exceptions as api

    member = f"serviceAccount:{account}"
    try:
        policy = bucket.get_iam_policy(requested_policy_version=3)
    except (api.Forbidden, api.Unauthorized, api.NotFound, api.MethodNotImplemented):
        return [], [f"IAM of gs://{bucket.name}: not checked (cannot read its policy: storage.buckets.getIamPolicy)"]
    held = [b for b in policy.bindings if member in b.get("members", ())]
    if not any(b["role"] in OBJECT_ROLES for b in held):
        return [
            f"{account}: holds no storage role on gs://{bucket.name}, so the jobs can neither read nor write results. "
            f"Fix: the bucket bindings of profiles/README.md, Write-once ledger"
        ], []
    open_roles = [b["role"] for b in held if b["role"] in DELETING_ROLES and not _spares_ledger(b.get("condition"))]
    if open_roles:
        return [
            f"{account}: holds {', '.join(open_roles)} on all of gs://{bucket.name}, so any job can delete or overwrite ledger "
            "entries and reset a split's exposure count. Fix: replace it by the IAM Condition bindings of profiles/README.md, "
            "Write-once ledger (create and read ledger/ objects, never delete)"
        ], []
    roles = ", ".join(b["role"] for b in held)
    return [], [f"IAM: {account} may use gs://{bucket.name} and no role of it deletes ledger entries ({roles})"]


def _spares_ledger(condition: dict | None) -> bool:
    """A binding's IAM Condition keeps it off the ledger's objects (the recipe: !resource.name.startsWith(...ledger/))."""
    expression = (condition or {}).get("expression", "").replace(" ", "")
    return "!resource.name.startsWith(" in expression and f"/{LEDGER}/" in expression


def ledger_protections(client: Any, prefix_url: str) -> list[str]:
    """What protects every ledger entry already under the results prefix (rffm.records.store.GcsStore.protection)."""
    from rffm.records import ledger
    from rffm.records.store import GcsStore

    store = GcsStore(f"{prefix_url.rstrip('/')}/results", client=client)
    return [f"ledger {where}: {what}" for where, what in ledger.protections(store)]


def storage_client(project: str | None) -> tuple[Any, str | None]:
    """(a Cloud Storage client with the Application Default Credentials, None), or (None, the problem) without any."""
    import google.auth.exceptions
    from google.cloud import storage

    from snakemake_storage_plugin_rffm_gcs import NO_CREDENTIALS, PLUGIN

    try:
        return storage.Client(project=project), None
    except google.auth.exceptions.DefaultCredentialsError:
        return None, NO_CREDENTIALS.removeprefix(f"{PLUGIN}: ")


def preflight(profile: str | Path, checkout: Path, env: Mapping[str, str] | None = None, client: Any = None) -> tuple[list[str], list[str]]:
    """(problems, checked): one line per problem with its fix; what was checked when it holds."""
    env = os.environ if env is None else env
    where, settings = read_profile(profile, checkout)
    problems = variable_problems(settings, env, where) + identity_problems(env)
    checked = [f"profile {where}: every variable it reads is set"] if not problems else []
    if not problems and env.get("RFFM_GCP_PROJECT") and env.get("RFFM_BATCH_SERVICE_ACCOUNT"):
        checked.append(f"project {env['RFFM_GCP_PROJECT']} and VM service account {env['RFFM_BATCH_SERVICE_ACCOUNT']}: well-formed")
    image = env.get("RFFM_WORKER_IMAGE")
    if image:
        problem = pinned_image_problem(image)
        problems += [problem] if problem else []
        checked += [] if problem else [f"worker image pinned by digest: {image}"]
    network, network_checked = network_problems(settings, env)
    problems += network
    checked += [] if network else [network_checked]
    prefix = expand(str(settings.get("default-storage-prefix", "")), env)
    bucket_name = prefix.removeprefix("gs://").partition("/")[0]
    if env.get("RFFM_GCS_BUCKET") and "$" not in bucket_name:
        if client is None:
            client, problem = storage_client(env.get("RFFM_GCP_PROJECT") or None)
            if problem:
                return [*problems, problem], checked
        region = str(settings.get("rffm-googlebatch-region", ""))
        bucket_problems, bucket_checked = bucket_checks(client, bucket_name, region, env.get("RFFM_BATCH_SERVICE_ACCOUNT"))
        problems += bucket_problems
        checked += bucket_checked
        if not bucket_problems:
            checked += ledger_protections(client, prefix)
    return problems, checked
