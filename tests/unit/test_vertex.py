"""`rffm vertex-job`: the CustomJob request, parsed offline as the Vertex AI API's own message (aiplatform_v1)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from google.cloud.aiplatform_v1.types import AcceleratorType, CustomJob, Scheduling
from google.protobuf import json_format

from conftest import BIN
from rffm.cloud import vertex
from rffm.errors import ConfigError

IMAGE = "us-central1-docker.pkg.dev/p/rffm/worker@sha256:" + "ab" * 32


def parsed(path: Path) -> CustomJob:
    message = CustomJob()
    json_format.ParseDict(json.loads(path.read_text()), CustomJob.pb(message))  # unknown fields, bad enums: ParseError
    return message


@pytest.mark.parametrize("strategy", ["SPOT", "FLEX_START"])
def test_the_written_request_is_a_customjob_running_posttrain_on_one_l4(tmp_path: Path, strategy: str):
    out = tmp_path / "job.json"
    command = [str(BIN / "rffm"), "vertex-job", "--image", IMAGE, "--config", "/gcs/b/rffm/config.yaml"]
    command += ["--output", "gs://b/rffm/vertex", "--strategy", strategy, "--timeout-hours", "12", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    job = parsed(out)
    [pool] = job.job_spec.worker_pool_specs
    assert pool.replica_count == 1
    assert pool.machine_spec.machine_type == "g2-standard-8"
    assert (pool.machine_spec.accelerator_type, pool.machine_spec.accelerator_count) == (AcceleratorType.NVIDIA_L4, 1)
    assert pool.container_spec.image_uri == IMAGE
    assert list(pool.container_spec.command) == ["rffm", "posttrain"]
    args = list(pool.container_spec.args)
    assert args[args.index("--config") + 1] == "/gcs/b/rffm/config.yaml"
    cache = args[args.index("--hidden-state-cache-directory") + 1]
    assert cache.startswith("/tmp/") and not cache.startswith("/gcs/")  # the worker's own disk, never the bucket
    assert pool.disk_spec.boot_disk_type == "pd-ssd" and pool.disk_spec.boot_disk_size_gb == 500
    assert job.job_spec.scheduling.strategy == Scheduling.Strategy[strategy]
    assert job.job_spec.scheduling.timeout.total_seconds() == 12 * 3600
    assert job.job_spec.scheduling.max_wait_duration.total_seconds() == (24 * 3600 if strategy == "FLEX_START" else 0)
    assert job.job_spec.base_output_directory.output_uri_prefix == "gs://b/rffm/vertex"  # AIP_MODEL_DIR, AIP_CHECKPOINT_DIR


def test_a_mutable_tag_and_a_local_output_are_refused_before_anything_is_written(tmp_path: Path):
    with pytest.raises(ConfigError, match="pinned by digest"):
        vertex.custom_job(image="us-docker.pkg.dev/p/rffm/worker:latest", config="c.yaml", output_uri="gs://b/x")
    with pytest.raises(ConfigError, match="gs:// URI"):
        vertex.custom_job(image=IMAGE, config="c.yaml", output_uri="/tmp/out")
    out = tmp_path / "job.json"
    command = [str(BIN / "rffm"), "vertex-job", "--image", "worker:v1", "--config", "c", "--output", "gs://b/x", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.count("\n") == 1 and "Fix:" in done.stderr


def test_validation_rejects_what_the_api_would(tmp_path: Path):
    """The check is the API's message: a misspelt field or strategy fails, so the test above can fail too."""
    body = vertex.custom_job(image=IMAGE, config="c.yaml", output_uri="gs://b/x")
    vertex.validate(body)
    body["jobSpec"]["scheduling"]["strategy"] = "SPOTTY"
    with pytest.raises(ConfigError, match="does not parse as aiplatform_v1.CustomJob"):
        vertex.validate(body)
    body = vertex.custom_job(image=IMAGE, config="c.yaml", output_uri="gs://b/x")
    body["jobSpec"]["workerPoolSpecs"][0]["replicas"] = 1
    with pytest.raises(ConfigError, match="replicas"):
        vertex.validate(body)
