"""`rffm vertex-job`: a Vertex AI CustomJob request that runs the whole workflow (`rffm posttrain`) on one L4 worker.

One worker pool, replicaCount 1, g2-standard-8 with one NVIDIA L4, the worker image pinned by digest,
command `rffm posttrain --config C --hidden-state-cache-directory D` with D on the worker's own disk
(the boot disk, sized for the cache: the cache is node-local and never copied to Cloud Storage).
`baseOutputDirectory` makes Vertex AI set AIP_MODEL_DIR (<base>/model), AIP_CHECKPOINT_DIR
(<base>/checkpoints) and AIP_TENSORBOARD_LOG_DIR, which posttrain honours: the selected artifact and the
exported classifier go to the model directory, completed epochs to the checkpoint directory (a
preempted SPOT worker relaunched by Vertex AI resumes from them). The request is written as the JSON
the REST API (`gcloud ai custom-jobs create --config`, or POST .../customJobs) takes, and checked
against google-cloud-aiplatform's own CustomJob message before it is written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rffm.errors import ConfigError

DIGEST_PINNED = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
STRATEGIES = ("SPOT", "FLEX_START", "STANDARD")
MACHINE = {"machineType": "g2-standard-8", "acceleratorType": "NVIDIA_L4", "acceleratorCount": 1}
CACHE_DIR = "/tmp/rffm-hidden-state-cache"  # on the worker's boot disk


def custom_job(
    *,
    image: str,
    config: str,
    output_uri: str,
    display_name: str = "rffm-posttrain",
    strategy: str = "SPOT",
    timeout_hours: float = 24.0,
    boot_disk_gb: int = 500,
    cache_dir: str = CACHE_DIR,
    procedure: str = "final_qualification",
    max_wait_hours: float | None = None,
    service_account: str | None = None,
) -> dict[str, Any]:
    """The CustomJob request body (REST JSON field names)."""
    if not DIGEST_PINNED.match(image):
        raise ConfigError(
            f"--image {image}: the worker image must be pinned by digest (<image>@sha256:<64 hex>); a tag can move. "
            "Fix: pass the digest the registry printed when you pushed (profiles/README.md, Google Cloud)."
        )
    if strategy not in STRATEGIES:
        raise ConfigError(f"--strategy {strategy}: choose one of {', '.join(STRATEGIES)}")
    if not output_uri.startswith("gs://"):
        raise ConfigError(f"--output {output_uri}: the base output directory must be a gs:// URI. Fix: gs://<bucket>/<prefix>")
    if timeout_hours <= 0 or boot_disk_gb < 100:
        raise ConfigError("--timeout-hours must be > 0 and --boot-disk-gb >= 100 (the image, the data and the cache share that disk)")
    scheduling: dict[str, Any] = {"strategy": strategy, "timeout": f"{round(timeout_hours * 3600)}s"}
    if strategy == "FLEX_START":  # how long Vertex AI may wait for the GPU before giving up
        scheduling["maxWaitDuration"] = f"{round((max_wait_hours or 24.0) * 3600)}s"
    container = {
        "imageUri": image,
        "command": ["rffm", "posttrain"],
        "args": ["--config", config, "--hidden-state-cache-directory", cache_dir, "--procedure", procedure],
        "env": [{"name": "RFFM_CONTAINER_IMAGE", "value": image}],  # provenance names the image
    }
    spec: dict[str, Any] = {
        "workerPoolSpecs": [
            {
                "machineSpec": dict(MACHINE),
                "replicaCount": "1",
                "diskSpec": {"bootDiskType": "pd-ssd", "bootDiskSizeGb": boot_disk_gb},
                "containerSpec": container,
            }
        ],
        "scheduling": scheduling,
        "baseOutputDirectory": {"outputUriPrefix": output_uri.rstrip("/")},
    }
    if service_account:
        spec["serviceAccount"] = service_account
    return {"displayName": display_name, "jobSpec": spec}


def validate(body: dict[str, Any]):
    """Parse the request as the API's CustomJob message (unknown fields and bad enum values are errors); return it."""
    try:
        from google.cloud.aiplatform_v1.types import CustomJob
        from google.protobuf import json_format
    except ImportError:
        raise ConfigError("google-cloud-aiplatform is not installed. Fix: pip install 'rffm[dev]'") from None
    message = CustomJob()
    try:
        json_format.ParseDict(body, CustomJob.pb(message))
    except json_format.ParseError as error:
        raise ConfigError(f"the CustomJob request does not parse as aiplatform_v1.CustomJob: {error}") from None
    return message


def write(body: dict[str, Any], path: str | Path) -> Path:
    """Write the request as JSON (checked first)."""
    validate(body)
    path = Path(path)
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    return path
