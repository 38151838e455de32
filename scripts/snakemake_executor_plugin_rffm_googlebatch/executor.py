"""The upstream Google Batch executor (snakemake-executor-plugin-googlebatch 0.5.1), overridden where it
is wrong for rffm (profiles/README.md, "Google Cloud"; each fix has a test in tests/executors/test_googlebatch.py):

- the worker's exit status is the workflow's: no trailing `pip install` lines, nothing pip-installed;
- transient API errors while polling (503, DeadlineExceeded, ...) are retried with backoff and never
  end the run; a job we stop tracking for any other reason is deleted first (no abandoned VM);
- a custom boot disk size/type keeps the boot image;
- `--preemptible-rules` asks for SPOT VMs (not legacy PREEMPTIBLE);
- a local SSD can be attached and mounted into the container at the hidden-state cache directory;
- heredocs are quoted (the Snakefile is written verbatim, nothing expands on the VM host);
- job ids and labels are always valid Batch names;
- accelerator-optimized machine types (g2, a2, ...) always get the GPU driver installed;
- a job with accelerators tells its steps how many GPUs it was given (RFFM_GPUS_REQUESTED), so a step
  that cannot see them fails loudly instead of training on the CPU (rffm.runtime.device);
- VMs can go without external IP addresses (`no_external_ip_address`, with `network`/`subnetwork`);
- only container mode with an image pinned by @sha256 digest is accepted, checked before submission;
  the image is the workflow's declared `container:` (rffm: RFFM_WORKER_IMAGE), a plugin setting otherwise.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import time
import uuid
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.api_core.retry import if_transient_error
from google.cloud import batch_v1
from snakemake_executor_plugin_googlebatch.command import COSWriter
from snakemake_executor_plugin_googlebatch.executor import GoogleBatchExecutor
from snakemake_interface_common.exceptions import WorkflowError

# Host directory the container sees as its working directory (upstream's COS layout).
WORKDIR = "/tmp/workdir"
SCRATCH_DEVICE = "rffm-scratch"
SCRATCH_HOST_MOUNT = "/mnt/disks/rffm-scratch"
LOCAL_SSD_PARTITION_GB = 375
GPU_MACHINE_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-")
# Snakemake exits 1 when the workflow fails: never worth a Batch retry (other codes, e.g. 50001
# for a preempted VM, are retried up to retry_count).
WORKFLOW_FAILURE_EXIT_CODES = [1]
DIGEST_PINNED = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
UNEXPANDED = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
TRANSIENT_ERRORS = (
    api_exceptions.InternalServerError,
    api_exceptions.BadGateway,
    api_exceptions.ServiceUnavailable,
    api_exceptions.GatewayTimeout,  # includes DeadlineExceeded
    api_exceptions.TooManyRequests,  # includes ResourceExhausted
    api_exceptions.Aborted,
    api_exceptions.Unknown,
)
MAX_BACKOFF_S = 300.0


def is_transient(error: BaseException) -> bool:
    """Whether an API error may go away by itself (retry it) rather than mean a real failure."""
    return isinstance(error, TRANSIENT_ERRORS) or if_transient_error(error)


def require_pinned_image(image: str | None, where: str) -> str:
    """Refuse a container image that is not pinned by digest (a tag can point at new content)."""
    if image and DIGEST_PINNED.match(image):
        return image
    repository = (image or "<registry>/<repository>").split("@")[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    raise WorkflowError(
        f"rffm-googlebatch refuses container image {image!r} ({where}): it is not pinned by digest, so "
        "the jobs of one run could pull different software and the run would not be reproducible. "
        f"Fix: use {repository}@sha256:<digest> (profiles/gcp-batch: RFFM_WORKER_IMAGE); get the digest after pushing with "
        f"`gcloud artifacts docker images describe {image or repository} --format='value(image_summary.digest)'` "
        "(profiles/README.md, Google Cloud). Nothing was submitted."
    )


def without_scheme(image: str) -> str:
    """A container reference as Batch takes it (Snakemake's `container:` is written docker://<image>)."""
    return image.removeprefix("docker://")


def unset_variables(values: dict[str, object]) -> list[str]:
    """Settings still holding a `$VARIABLE` (Snakemake expands profile values; unset ones stay as text)."""
    found = []
    for key, value in values.items():
        for name in UNEXPANDED.findall(value if isinstance(value, str) else ""):
            found.append(f"{name} is not set ({key}: {value})")
    return found


def valid_name(text: str, limit: int) -> str:
    """Lower-case letters, digits and '-', starting with a letter, at most `limit` characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if not name or not name[0].isalpha():
        name = f"job-{name}".rstrip("-")
    return name[:limit].rstrip("-")


def heredoc(path: str, text: str) -> str:
    """Shell lines writing `text` to `path` verbatim (quoted delimiter: no expansion on the host)."""
    delimiter = "RFFM_EOF_" + hashlib.sha256(text.encode()).hexdigest()[:12]
    while delimiter in text.splitlines():
        delimiter += "_"
    body = text if text.endswith("\n") else text + "\n"
    return f"cat > {path} <<'{delimiter}'\n{body}{delimiter}\n"


class QuotedCOSWriter(COSWriter):
    """Container-mode commands with quoted heredocs and the workflow's exit status as the job's."""

    def setup(self) -> str:
        entrypoint = f"#!/bin/bash\n# the job's exit status is the workflow's\n{self.command}\n"
        return (
            f"#!/bin/bash\nset -euo pipefail\nmkdir -p {WORKDIR}\n"
            + heredoc(f"{WORKDIR}/entrypoint.sh", entrypoint)
            + f"chmod +x {WORKDIR}/entrypoint.sh\ncat {WORKDIR}/entrypoint.sh\n"
        )

    def write_snakefile(self) -> str:
        directory = posixpath.dirname(self.snakefile_path)
        return f"#!/bin/bash\nset -euo pipefail\nmkdir -p {directory}\n" + heredoc(self.snakefile_path, self.snakefile)


class RetryingBatchClient:
    """The Batch client with transient errors retried on submission and deletion."""

    def __init__(self, client: Any, logger: Any, attempts: int = 6, first_wait_s: float = 2.0):
        self.client, self.logger, self.attempts, self.first_wait_s = client, logger, attempts, first_wait_s

    def _retry(self, what: str, call, *args, **kwargs):
        for attempt in range(1, self.attempts + 1):
            try:
                return call(*args, **kwargs)
            except Exception as error:
                if not is_transient(error) or attempt == self.attempts:
                    raise
                wait = min(MAX_BACKOFF_S, self.first_wait_s * 2 ** (attempt - 1))
                self.logger.warning(f"Google Batch {what}: transient error ({error}); retry {attempt} in {wait:.0f}s")
                time.sleep(wait)

    def create_job(self, request: batch_v1.CreateJobRequest) -> batch_v1.Job:
        def create():
            try:
                return self.client.create_job(request)
            except api_exceptions.AlreadyExists:
                # an earlier attempt reached Batch after all: the same job id makes retrying safe
                return self.client.get_job(name=f"{request.parent}/jobs/{request.job_id}")

        return self._retry(f"create {request.job_id}", create)

    def delete_job(self, request: batch_v1.DeleteJobRequest):
        return self._retry(f"delete {request.name}", self.client.delete_job, request=request)

    def get_job(self, request: batch_v1.GetJobRequest) -> batch_v1.Job:
        # one call: the status loop backs off per job (see Executor.check_active_jobs)
        return self.client.get_job(request=request)


class Executor(GoogleBatchExecutor):
    """rffm's Google Batch executor: the upstream one with the fixes listed in the module docstring."""

    def __post_init__(self):
        super().__post_init__()
        self.batch = RetryingBatchClient(self.batch, self.logger)
        self._job_ids: dict[int, str] = {}
        settings = {f"rffm-googlebatch-{k.replace('_', '-')}": v for k, v in vars(self.executor_settings).items()}
        settings["default-storage-prefix"] = self.workflow.storage_settings.default_storage_prefix
        unset = unset_variables(settings)
        if unset:
            raise WorkflowError(
                "rffm-googlebatch: environment variable "
                + "; ".join(unset)
                + ". Fix: export it (profiles/README.md, Google Cloud); nothing was submitted."
            )
        family = self.executor_settings.image_family or ""
        if "batch-cos" not in family:
            raise WorkflowError(
                f"rffm-googlebatch runs every job in the digest-pinned container, which needs a Batch COS image "
                f"family; got rffm-googlebatch-image-family {family!r}. Fix: set it to batch-cos-stable-official "
                "(image project batch-custom-image)."
            )
        where = "the workflow's container: (RFFM_WORKER_IMAGE), rffm-googlebatch-container or --container-image"
        require_pinned_image(self.default_image(), where)

    # ---- settings ----

    def get_param(self, job, param):
        """Rule resource googlebatch_<param>, else (for the image) the rule's declared container, else the setting;
        unlike upstream, 0 and "" count."""
        value = job.resources.get(f"googlebatch_{param}")
        if value is None and param == "container":
            value = self.declared_image(job)
        return value if value is not None else getattr(self.executor_settings, param, None)

    def declared_image(self, job) -> str | None:
        """The `container:` a job's rule declares (every member of a group job runs in the same one)."""
        members = job.jobs if job.is_group() else [job]
        images = {without_scheme(member.container_img_url) for member in members if member.container_img_url}
        if len(images) > 1:
            raise WorkflowError(f"group job {job.name}: its rules declare different containers ({', '.join(sorted(images))}).")
        return images.pop() if images else None

    def default_image(self) -> str | None:
        """The image jobs run in: the workflow's declared container, else the plugin's setting, else --container-image."""
        declared = self.workflow.modifier.global_container_img
        if declared:
            return without_scheme(declared)
        return self.executor_settings.container or self.workflow.remote_execution_settings.container_image

    # ---- the job builders ----

    def generate_jobid(self, job) -> str:
        """A valid Batch job id (upper case, '.', '_' or a leading digit are rejected by Batch)."""
        return self._job_ids.pop(id(job), None) or self._new_job_id(job)

    def _new_job_id(self, job) -> str:
        return f"{valid_name(job.name, 56)}-{uuid.uuid4().hex[:6]}"

    def fix_job_name(self, name):
        return valid_name(name, 63)

    def get_labels(self, job):
        labels = super().get_labels(job)
        # label keys and values: lower case, digits, '_' and '-' (values may be empty)
        return {valid_name(k, 63): re.sub(r"[^a-z0-9_-]", "-", str(v).lower())[:63] for k, v in labels.items()}

    def get_command_writer(self, job):
        family = self.get_param(job, "image_family") or ""
        if "batch-cos" not in family:
            raise WorkflowError(f"rule(s) {job.name}: googlebatch_image_family {family!r} is not a Batch COS family (container mode).")
        return QuotedCOSWriter(
            command=self.format_job_exec(job),
            snakefile=self.read_snakefile(),
            snakefile_path=f"{WORKDIR}/Snakefile",
            settings=self.workflow.executor_settings,
            resources=job.resources,
        )

    def get_container(self, job, entrypoint=None, commands=None):
        container = super().get_container(job, entrypoint, commands)
        require_pinned_image(container.image_uri, f"job {job.name}")
        if self.local_ssd_gb(job):
            container.volumes = [*container.volumes, f"{SCRATCH_HOST_MOUNT}:{self.container_scratch_dir()}"]
        return container

    def add_storage(self, job, task):
        """Hook on the finished TaskSpec (before upstream copies it into the job)."""
        super().add_storage(job, task)
        job_id = self._job_ids[id(job)] = self._new_job_id(job)
        main = task.runnables[-1]
        main.environment.variables.update(
            {
                # read by rffm.provenance for every step's provenance.json
                "RFFM_EXECUTOR": "googlebatch",
                "RFFM_JOB_ID": f"{self.project_parent(job)}/jobs/{job_id}",
                "RFFM_CONTAINER_IMAGE": main.container.image_uri,
            }
        )
        gpus = sum(int(accelerator.count) for accelerator in self.get_accelerators(job) or [])
        if gpus:
            # read by rffm.runtime.device: a granted GPU that torch cannot see is an error, not a CPU run
            main.environment.variables["RFFM_GPUS_REQUESTED"] = str(gpus)
        if self.local_ssd_gb(job):
            task.volumes = [*task.volumes, batch_v1.Volume(device_name=SCRATCH_DEVICE, mount_path=SCRATCH_HOST_MOUNT)]
        task.lifecycle_policies = [
            batch_v1.LifecyclePolicy(
                action=batch_v1.LifecyclePolicy.Action.FAIL_TASK,
                action_condition=batch_v1.LifecyclePolicy.ActionCondition(exit_codes=WORKFLOW_FAILURE_EXIT_CODES),
            )
        ]

    def get_boot_disk(self, job):
        disk = super().get_boot_disk(job)
        if disk is not None and not disk.image:
            # upstream drops the image family when only the size or type is customised
            disk.image = f"projects/{self.get_param(job, 'image_project')}/global/images/family/{self.get_param(job, 'image_family')}"
        return disk

    def get_allocation_policy(self, job):
        policy = super().get_allocation_policy(job)
        instance = policy.instances[0]
        if self.is_preemptible(job):
            instance.policy.provisioning_model = batch_v1.AllocationPolicy.ProvisioningModel.SPOT
        if instance.policy.machine_type.startswith(GPU_MACHINE_FAMILIES):
            # these types come with their GPUs: upstream installs the driver only for `nvidia_gpu`
            instance.install_gpu_drivers = True
        size = self.local_ssd_gb(job)
        if size:
            scratch = batch_v1.AllocationPolicy.AttachedDisk(
                new_disk=batch_v1.AllocationPolicy.Disk(type_="local-ssd", size_gb=size), device_name=SCRATCH_DEVICE
            )
            instance.policy.disks = [*instance.policy.disks, scratch]
        policy.instances = [instance]
        return policy

    def get_network_policy(self, job):
        """Upstream's network interface (network, subnetwork) plus `no_external_ip_address`; None when nothing is set."""
        network, subnetwork = self.get_param(job, "network"), self.get_param(job, "subnetwork")
        private = bool(self.get_param(job, "no_external_ip_address"))
        if not (network or subnetwork or private):
            return None
        interface = batch_v1.AllocationPolicy.NetworkInterface(
            network=network or "", subnetwork=subnetwork or "", no_external_ip_address=private
        )
        return batch_v1.AllocationPolicy.NetworkPolicy(network_interfaces=[interface])

    def local_ssd_gb(self, job) -> int:
        """The VM's one local SSD, mounted at the cache directory. A group job's members share it (a co-located cache is
        built there once), so it is the largest member's size, never Snakemake's sum over members that may run at once."""
        members = job.jobs if job.is_group() else [job]
        size = max(int(self.get_param(member, "local_ssd_gb") or 0) for member in members)
        if size % LOCAL_SSD_PARTITION_GB:
            raise WorkflowError(f"rule(s) {job.name}: local SSD size {size} GB is not a multiple of {LOCAL_SSD_PARTITION_GB} GB.")
        return size

    def container_scratch_dir(self) -> str:
        """The cache directory as the container sees it (the workflow keeps the cache there, local)."""
        scratch = self.executor_settings.scratch_dir or self.workflow.config.get("scratch")
        if not scratch:
            raise WorkflowError("a local SSD needs the cache directory: set config `scratch` or rffm-googlebatch-scratch-dir.")
        return posixpath.normpath(posixpath.join(WORKDIR, scratch))

    # ---- status, cancellation ----

    async def check_active_jobs(self, active_jobs):
        """Poll each job; transient API errors back off per job and never end the run."""
        now = time.monotonic()
        for info in active_jobs:
            aux = info.aux
            if aux.get("next_poll", 0.0) > now:
                yield info
                continue
            try:
                response = self.batch.get_job(request=batch_v1.GetJobRequest(name=info.external_jobid))
            except Exception as error:
                if is_transient(error):
                    aux["poll_failures"] = aux.get("poll_failures", 0) + 1
                    wait = min(MAX_BACKOFF_S, self.status_interval() * 2 ** (aux["poll_failures"] - 1))
                    aux["next_poll"] = now + wait
                    self.logger.warning(
                        f"Google Batch status of {info.external_jobid}: transient error ({type(error).__name__}: {error}); "
                        f"the job keeps running, next check in {wait:.0f}s"
                    )
                    yield info
                    continue
                self.delete_quietly(info.external_jobid, f"rffm-googlebatch stopped tracking it: {error}")
                self.report_job_error(info, msg=f"Google Batch job '{info.external_jobid}': status unavailable ({error}); job deleted.")
                continue
            aux["poll_failures"], aux["next_poll"] = 0, 0.0
            state = response.status.state.name
            self.log_new_events(info, response)
            if state == "SUCCEEDED":
                self.save_finished_job_logs(info)
                self.report_job_success(info)
            elif state == "FAILED":
                self.save_finished_job_logs(info)
                self.report_job_error(info, msg=f"Google Batch job '{info.external_jobid}' failed.", aux_logs=[aux["logfile"]])
            else:
                yield info

    def status_interval(self) -> float:
        return float(self.workflow.remote_execution_settings.seconds_between_status_checks or 10)

    def log_new_events(self, info, response) -> None:
        seen = info.aux.setdefault("seen_events", set())
        for event in response.status.status_events:
            key = (event.event_time.isoformat() if event.event_time else "", event.type_, event.description)
            if key not in seen:
                seen.add(key)
                self.logger.info(f"{info.external_jobid}: {event.type_}: {event.description}")

    def delete_quietly(self, name: str, reason: str) -> None:
        try:
            self.batch.delete_job(batch_v1.DeleteJobRequest(name=name, reason=reason)).result()
        except Exception as error:
            self.logger.error(f"Could not delete Google Batch job {name} ({error}); delete it by hand: gcloud batch jobs delete {name}")

    def cancel_jobs(self, active_jobs):
        for info in active_jobs:
            self.logger.info(f"Deleting Google Batch job {info.external_jobid} ...")
            self.delete_quietly(info.external_jobid, f"User requested cancel for {info.external_jobid}")
        self.shutdown()
