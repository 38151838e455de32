"""Snakemake storage plugin `rffm-gcs`: snakemake-storage-plugin-gcs 1.1.4, with its failures explained.

Snakemake finds storage plugins by module name (`snakemake_storage_plugin_<name>` on sys.path), so
installing the rffm package registers `--default-storage-provider rffm-gcs` and its
`--storage-rffm-gcs-*` settings (upstream `gcs`'s settings, under this name). Reading and writing
objects is upstream's code; what differs:

- no Google credentials: upstream builds `storage.Client()` when Snakemake starts, even for
  `snakemake -n`, and ends in a 69-line `DefaultCredentialsError` traceback; here it is one
  line naming the fix (`gcloud auth application-default login`, or STORAGE_EMULATOR_HOST
  for a local emulator). Refused (expired, revoked) credentials and denied requests are one line too;
- a bucket that does not exist is an error, never created: upstream's `store_object` creates any
  missing bucket, so a typo in `default-storage-prefix` silently starts a new bucket. Each bucket is
  checked once, when Snakemake first names an object in it (while it reads the workflow), so a dry
  run says so too instead of planning every job as missing, and a run stops before it submits or
  uploads anything;
- buckets are checked by listing objects (storage.objects.list) instead of reading the bucket's
  metadata (upstream: storage.buckets.get, which roles/storage.objectAdmin does not grant);
- the client is made for the `project` setting (upstream: none, so credentials without a project of
  their own, such as a user's `gcloud auth application-default login`, fail with an OSError traceback
  unless gcloud has a default project);
- a bucket name that is not a valid GCS name, or still holds an unexpanded `$VARIABLE` from the
  profile, is refused before any request is made.

A failure while Snakemake starts (the client, the first read of a bucket: before any job runs) is a
Refused, printed as its one line; a failure later, while jobs run, is a WorkflowError, which Snakemake
prints with the plugin frame that raised it under the line and handles as the job's failure.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

import google.auth.exceptions
import requests
from google.api_core import exceptions as api_exceptions
from google.api_core import retry
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_storage_plugins.io import IOCacheStorageInterface, Mtime
from snakemake_interface_storage_plugins.storage_provider import StorageQueryValidationResult
from snakemake_storage_plugin_gcs import StorageObject as UpstreamStorageObject
from snakemake_storage_plugin_gcs import StorageProvider as UpstreamStorageProvider
from snakemake_storage_plugin_gcs import StorageProviderSettings as UpstreamSettings
from snakemake_storage_plugin_gcs import google_cloud_retry_predicate

PLUGIN = "rffm-gcs"
NO_CREDENTIALS = (
    f"{PLUGIN}: no Google Cloud credentials found (Application Default Credentials), so the bucket cannot be read. "
    "Fix: run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file); "
    "to plan or test without Google, point STORAGE_EMULATOR_HOST at a local GCS emulator (e.g. http://127.0.0.1:9023)."
)
# https://cloud.google.com/storage/docs/buckets#naming (dotted names may be up to 222 characters)
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
UNEXPANDED = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
REACH_TIMEOUT_S = 20.0  # retrying an unreachable endpoint for upstream's 120 s helps nobody
AUTH_ERRORS = (google.auth.exceptions.GoogleAuthError, api_exceptions.Unauthorized, api_exceptions.Forbidden)


def unset_variable(text: str | None) -> str | None:
    """The first `$VARIABLE` still in a profile value (Snakemake leaves unset ones as text)."""
    match = UNEXPANDED.search(text or "")
    return match.group(1) if match else None


def first_line(error: BaseException) -> str:
    """The first line of an error's message (google-auth errors carry it as their first argument)."""
    auth = isinstance(error, google.auth.exceptions.GoogleAuthError) and error.args and isinstance(error.args[0], str)
    text = (error.args[0] if auth else str(error)).strip()
    return text.splitlines()[0] if text else type(error).__name__


class Refused(SystemExit):
    """A failure while Snakemake starts, before any job runs: Snakemake would print a WorkflowError with the plugin's
    frames under its line (`File "…", line N`); a SystemExit passes up unwrapped, so the one line is all it prints
    (as rffm.errors.PlanRefused does for the workflow's own refusals)."""


def explanation(error: Exception, what: str) -> str:
    """The one line for an authentication or permission failure of a GCS request."""
    if isinstance(error, google.auth.exceptions.DefaultCredentialsError):
        return NO_CREDENTIALS
    if isinstance(error, google.auth.exceptions.GoogleAuthError):
        return (
            f"{PLUGIN}: {what}: the Google Cloud credentials were refused ({first_line(error)}). "
            "Fix: run `gcloud auth application-default login` again (or check GOOGLE_APPLICATION_CREDENTIALS)."
        )
    return (
        f"{PLUGIN}: {what}: permission denied ({first_line(error)}). Fix: grant the account you are using "
        "roles/storage.objectAdmin on the bucket and roles/serviceusage.serviceUsageConsumer on the project "
        "named by storage-rffm-gcs-project (requests are billed to it), or log in as another account "
        "(`gcloud auth application-default login`)."
    )


def explain(error: Exception, what: str) -> WorkflowError:
    """A WorkflowError of one line for an authentication or permission failure of a GCS request while jobs run."""
    return WorkflowError(explanation(error, what))


def explained(what: str) -> Callable:
    """Decorate a storage call: authentication and permission failures become one WorkflowError line
    (Snakemake prints a WorkflowError's message and the frame that raised it, not the whole traceback)."""

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except AUTH_ERRORS as error:
                raise explain(error, what.format(self=self)) from error

        return call

    return decorate


def missing_bucket(bucket: str) -> Refused:
    """The refusal of a bucket that does not exist."""
    return Refused(
        f"{PLUGIN}: bucket gs://{bucket} does not exist; rffm never creates buckets, so a typo in "
        "default-storage-prefix cannot start a new one. Fix: correct the prefix, or create the bucket once: "
        f"`gcloud storage buckets create gs://{bucket} --project PROJECT --location REGION --uniform-bucket-level-access` "
        "(profiles/README.md, Google Cloud)."
    )


@dataclass
class StorageProviderSettings(UpstreamSettings):
    """Upstream's settings (`--storage-rffm-gcs-project`, ...), unchanged."""


class StorageProvider(UpstreamStorageProvider):
    def __post_init__(self):
        variable = unset_variable(self.settings.project if self.settings else None)
        if variable:
            raise Refused(
                f"{PLUGIN}: environment variable {variable} is not set (storage-rffm-gcs-project: {self.settings.project}). "
                "Fix: export it (profiles/README.md, Google Cloud)."
            )
        self.checked_buckets: set[str] = set()
        try:
            # upstream passes no project: with credentials that name none (a user's ADC login) and no gcloud default
            # project, Client() fails with OSError; the plugin's required `project` setting is the natural one
            self.client = storage.Client(project=self.settings.project)
        except AUTH_ERRORS as error:
            raise Refused(explanation(error, "connecting to Google Cloud Storage")) from None

    @classmethod
    def is_valid_query(cls, query: str) -> StorageQueryValidationResult:
        result = super().is_valid_query(query)
        if not result:
            return result
        bucket = urlparse(query).netloc
        variable = unset_variable(query)
        if variable:
            reason = f"environment variable {variable} is not set (it names the bucket). Fix: export it (profiles/README.md, Google Cloud)"
        elif not BUCKET_NAME.fullmatch(bucket):
            reason = f"{bucket!r} is not a valid bucket name (lower-case letters, digits, '-', '_', '.'; 3 to 63 characters, 222 with dots)"
        else:
            return result
        return StorageQueryValidationResult(query=query, valid=False, reason=reason)

    @explained("listing objects")
    def list_objects(self, query):
        return super().list_objects(query)

    def require_bucket(self, bucket: storage.Bucket) -> None:
        """Stop unless the bucket exists (checked once per bucket, by listing at most one object, when Snakemake first
        names an object in it: while it reads the workflow)."""
        if bucket.name in self.checked_buckets:
            return
        try:
            next(iter(bucket.list_blobs(max_results=1, retry=DEFAULT_RETRY.with_timeout(REACH_TIMEOUT_S))), None)
        except api_exceptions.NotFound:
            raise missing_bucket(bucket.name) from None
        except AUTH_ERRORS as error:
            raise Refused(explanation(error, f"reading gs://{bucket.name}")) from None
        except (requests.exceptions.ConnectionError, api_exceptions.RetryError) as error:
            raise Refused(
                f"{PLUGIN}: cannot reach Cloud Storage at {self.client.api_endpoint} to read gs://{bucket.name} "
                f"({first_line(error)}). Fix: check the network; for a local emulator, start it and set STORAGE_EMULATOR_HOST "
                "to its URL."
            ) from None
        self.checked_buckets.add(bucket.name)


class StorageObject(UpstreamStorageObject):
    def __post_init__(self):
        super().__post_init__()
        # Snakemake validates a default-storage query only after making its object, and wraps the reason in a
        # paragraph of its own: refused here, in one line
        if not (validity := self.provider.is_valid_query(self.query)):
            raise Refused(f"{PLUGIN}: {self.query}: {validity.reason}")
        self.provider.require_bucket(self.bucket)

    async def inventory(self, cache: IOCacheStorageInterface):
        """Upstream's inventory without its bucket metadata read (the bucket is known to exist)."""
        if self.get_inventory_parent() in cache.exists_in_storage:
            return
        try:
            for blob in self.client.list_blobs(self.bucket_name, prefix=os.path.dirname(self.blob.name)):
                key = self.cache_key(self._local_suffix_from_key(blob.name))
                cache.exists_in_storage[key] = True
                cache.mtime[key] = Mtime(storage=blob.updated.timestamp())
                cache.size[key] = blob.size
        except AUTH_ERRORS as error:
            raise explain(error, f"listing gs://{self.bucket_name}") from error

    @explained("reading {self.query}")
    @retry.Retry(predicate=google_cloud_retry_predicate)
    def exists(self) -> bool:
        return self.blob.exists() or any(self.directory_entries())

    @explained("reading {self.query}")
    def mtime(self) -> float:
        return super().mtime()

    @explained("reading {self.query}")
    def size(self) -> int:
        return super().size()

    @explained("downloading {self.query}")
    def retrieve_object(self):
        super().retrieve_object()

    @explained("uploading {self.query}")
    def store_object(self):
        super().store_object()

    @explained("deleting {self.query}")
    def remove(self) -> None:
        super().remove()

    @explained("listing {self.query}")
    def list_candidate_matches(self):
        return list(super().list_candidate_matches())

    def ensure_bucket_exists(self) -> None:
        """Upstream creates a missing bucket here (before every upload); refuse instead."""
        try:
            self.provider.require_bucket(self.bucket)
        except Refused as refused:  # jobs may be running: Snakemake must handle it as this upload's failure
            raise WorkflowError(str(refused)) from None
