"""Google Cloud Batch: the rffm-googlebatch executor (scripts/snakemake_executor_plugin_rffm_googlebatch).

Real Snakemake, the real executor plugins and the GCS storage plugin against a local GCS emulator;
only the Batch API and its VMs are faked (tests/executors/fake_batch.py). Each upstream defect we fix has a
test that runs against both executors: ours must pass, upstream googlebatch 0.5.1 must fail it
(strict xfail), so the test is known to detect the defect.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from batch_support import (
    FAST,
    IMAGE,
    JOB_ID,
    PROJECT,
    bucket_objects,
    container,
    create_bucket,
    gcs_emulator,
    instance,
    make_checkout,
    output,
    profile_env,
    rule_of,
    run_fake_batch,
    task_spec,
)

from conftest import BIN, PROFILED_TRACES, WARM, snakemake, tiny_config, write_config
from rffm.records.files import sha256_file

UPSTREAM = pytest.param(
    "googlebatch",
    marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason="upstream googlebatch 0.5.1 defect: the assertion naming it fails"),
)
EXECUTORS = ["rffm-googlebatch", UPSTREAM]

# A minimal workflow for the executor tests. Rule `ok`'s shell carries a command substitution that an
# unquoted heredoc on the VM host would run there.
EXECUTOR_SNAKEFILE = '''
rule ok:
    output:
        "ok.txt",
    shell:
        """
cat > {output} <<'END'
$(echo not expanded on the host)
END
"""


rule fail:
    output:
        "fail.txt",
    shell:
        "echo started; exit 3"


rule trainModel:
    output:
        "model.txt",
    shell:
        "touch {output}"
'''
# A line reading EOF ends upstream's unquoted heredoc early (the rest runs as shell on the host).
EOF_RULE = '''

rule eof:
    output:
        "eof.txt",
    shell:
        """
cat > {output} <<'END'
EOF
END
"""
'''


@pytest.fixture(scope="module")
def emulator():
    """gcp-storage-emulator on 127.0.0.1 (in memory), stopped after this module."""
    with gcs_emulator() as url:
        yield url


# ---- acceptance: the real profile, the tiny workflow, end to end through the bucket ----


@pytest.fixture(scope="module")
def repo_checkout(tmp_path_factory) -> Path:
    """What a user runs from: a git checkout with the tiny config as config/config.yaml."""
    return make_checkout(tmp_path_factory.mktemp("checkout"), tiny_config(export=True))


@pytest.fixture(scope="module")
def batch_run(repo_checkout, emulator, tmp_path_factory):
    """`snakemake --profile profiles/gcp-batch` on the tiny workflow, every job run by the fake VMs."""
    state = tmp_path_factory.mktemp("batch-state")
    create_bucket(emulator, "rffm-e2e")
    result, report = run_fake_batch(repo_checkout, state, emulator, "--profile", "profiles/gcp-batch", *FAST, env=profile_env("rffm-e2e"))
    assert result.returncode == 0, output(result)
    return {"result": result, "report": report, "jobs": {rule_of(job): job for job in report["jobs"]}}


def test_profile_runs_the_workflow_end_to_end_through_the_bucket(batch_run, emulator, tmp_path):
    """Acceptance 1: every result is in the bucket, verifies, and the cache never left the VM."""
    report = batch_run["report"]
    assert report["rejected"] == [] and len(report["jobs"]) == 6  # stage, pretrain, the cache+epochs group, select, qualify, export
    assert all(job["state"] == "SUCCEEDED" and not job["running_at_exit"] for job in report["jobs"])
    objects = bucket_objects(emulator, "rffm-e2e")
    assert "rffm/results/runs/base/qualification/run_manifest.json" in objects
    assert not [name for name in objects if name.startswith("rffm/scratch/")], "the hidden-state cache was uploaded"
    results = tmp_path / "results"
    for name, blob in objects.items():
        if name.startswith("rffm/results/"):
            target = results / name.removeprefix("rffm/results/")
            target.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(target)
    verify = subprocess.run([str(BIN / "rffm"), "verify", str(results)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_gpu_steps_get_an_l4_with_driver_and_cpu_steps_a_small_machine(batch_run):
    jobs = batch_run["jobs"]
    expected = {"stage-dataset", "pretrain-backbone", "train-base-build-cache-train-epoch", "select-checkpoint", "qualify", "export"}
    assert set(jobs) == expected
    gpu = {"pretrain-backbone", "train-base-build-cache-train-epoch", "qualify"}
    for rule, job in jobs.items():
        policy = instance(job)
        if rule in gpu:
            assert policy["policy"]["machine_type"] == "g2-standard-8"
            assert [(a["type_"], a["count"]) for a in policy["policy"]["accelerators"]] == [("nvidia-l4", "1")]
            assert policy["install_gpu_drivers"] is True
        else:
            assert policy["policy"]["machine_type"] == "e2-standard-4"
            assert policy["policy"]["accelerators"] == [] and policy["install_gpu_drivers"] is False


def test_every_job_is_pinned_retry_free_long_enough_and_valid(batch_run):
    for job in batch_run["jobs"].values():
        spec, policy = task_spec(job), instance(job)["policy"]
        assert JOB_ID.match(job["job_id"]), job["job_id"]
        assert container(job)["image_uri"] == IMAGE
        assert spec["max_retry_count"] == 0 and spec["max_run_duration"] == "86400s"
        assert policy["provisioning_model"] == "PROVISIONING_MODEL_UNSPECIFIED"  # spot is opt-in
        assert policy["boot_disk"]["image"] == "projects/batch-custom-image/global/images/family/batch-cos-stable-official"
        assert policy["boot_disk"]["size_gb"] == "50"
        assert spec["lifecycle_policies"][0]["action"] == "FAIL_TASK"
        assert spec["lifecycle_policies"][0]["action_condition"]["exit_codes"] == [1]


def test_the_cache_lives_on_the_local_ssd_grouped_with_the_epochs(batch_run):
    job = batch_run["jobs"]["train-base-build-cache-train-epoch"]
    disks = instance(job)["policy"]["disks"]
    assert [(d["new_disk"]["type_"], d["new_disk"]["size_gb"], d["device_name"]) for d in disks] == [("local-ssd", "375", "rffm-scratch")]
    assert [(v["device_name"], v["mount_path"]) for v in task_spec(job)["volumes"]] == [("rffm-scratch", "/mnt/disks/rffm-scratch")]
    assert "/mnt/disks/rffm-scratch:/tmp/workdir/scratch" in container(job)["volumes"]  # config `scratch` of tiny.yaml
    ssd = Path(job["sandbox"]) / "host" / "mnt" / "disks" / "rffm-scratch" / "tiny__mini"
    assert (ssd / "sentinel.json").is_file() and (ssd / "train.hidden.bf16").is_file()
    for rule in ("stage-dataset", "qualify"):
        assert instance(batch_run["jobs"][rule])["policy"]["disks"] == []


def test_provenance_names_the_batch_job_and_the_pinned_image(batch_run, emulator):
    manifest = json.loads(bucket_objects(emulator, "rffm-e2e")["rffm/results/runs/base/qualification/run_manifest.json"].download_as_text())
    names = {rule: job["name"] for rule, job in batch_run["jobs"].items()}
    steps = manifest["provenance"]["steps"]
    assert steps["build_cache"]["job_id"] == names["train-base-build-cache-train-epoch"]
    assert steps["train_epoch"]["job_id"] == names["train-base-build-cache-train-epoch"]
    assert steps["stage_dataset"]["job_id"] == names["stage-dataset"]
    assert {step["executor"] for step in steps.values()} == {"googlebatch"}
    assert {step["image"] for step in steps.values()} == {IMAGE}


def test_the_manifest_names_the_launch_profile_and_the_traces_are_in_the_bucket(batch_run, repo_checkout, emulator):
    """The launch record, its sha256 in the manifest and the profiling traces (tiny.yaml profiles 2 batches) reach the bucket."""
    objects = bucket_objects(emulator, "rffm-e2e")
    manifest = json.loads(objects["rffm/results/runs/base/qualification/run_manifest.json"].download_as_text())
    profile = repo_checkout / "profiles" / "gcp-batch" / "config.yaml"
    launched = manifest["provenance"]["launch_profile"]
    assert launched["name"] == "gcp-batch" and launched["sha256"] == sha256_file(profile), launched
    assert Path(launched["path"]).resolve() == profile.resolve()
    kept = objects["rffm/results/runs/base/launch/gcp-batch/config.yaml"].download_as_bytes()
    assert kept == profile.read_bytes()
    profiling = "rffm/results/runs/base/profiling/"
    traces = sorted(name.removeprefix(profiling) for name in objects if name.startswith(profiling) and name.endswith(".trace.json"))
    assert traces == PROFILED_TRACES
    for name in traces:
        assert json.loads(objects[profiling + name].download_as_text())["traceEvents"], name
    # the test-split ledger is in the bucket too (it outlives the qualify VM): one entry, counted in the manifest
    ledger = [name for name in objects if name.startswith("rffm/results/ledger/")]
    assert [name.rsplit("/", 1)[1] for name in ledger] == ["base.json"], ledger
    entry = json.loads(objects[ledger[0]].download_as_text())["entry"]
    assert entry["artifact_sha256"] == manifest["selection"]["artifact_sha256"]
    assert manifest["qualification"]["exposure_count"] == 1


def test_a_finished_run_plans_nothing_although_the_cache_is_gone(batch_run, repo_checkout, emulator):
    environ = {**os.environ, "STORAGE_EMULATOR_HOST": emulator, **profile_env("rffm-e2e")}
    dry = WARM.run_any([str(BIN / "snakemake"), "--profile", "profiles/gcp-batch", "-n"], repo_checkout, environ)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "Nothing to be done" in dry.stdout + dry.stderr


def test_spot_is_opt_in_and_means_spot(repo_checkout, emulator, tmp_path):
    """The real profile with spot enabled for the first step (capture: the fake stops after it)."""
    create_bucket(emulator, "rffm-spot")
    result, report = run_fake_batch(
        repo_checkout, tmp_path / "state", emulator, "--profile", "profiles/gcp-batch", *FAST, "--preemptible-rules", "stage_dataset",
        env={**profile_env("rffm-spot"), "FAKE_BATCH_MODE": "capture"},
    )  # fmt: skip
    [job] = report["jobs"]
    assert instance(job)["policy"]["provisioning_model"] == "SPOT", output(result)


# ---- acceptance 3: a mutable image (or an unset profile variable) is refused before submission ----


def test_a_mutable_image_is_refused_before_anything_is_submitted(repo_checkout, emulator, tmp_path):
    image = "us-central1-docker.pkg.dev/rffm-test/rffm/worker:latest"
    result, report = run_fake_batch(
        repo_checkout, tmp_path / "state", emulator, "--profile", "profiles/gcp-batch", env=profile_env("rffm-latest", image)
    )
    assert result.returncode != 0
    assert report["jobs"] == [] and report["rejected"] == []
    text = output(result)
    assert f"RFFM_WORKER_IMAGE={image}: the worker image must be pinned by digest" in text and "Traceback" not in text


def test_an_unset_profile_variable_is_refused_with_its_name(repo_checkout, emulator, tmp_path):
    env = profile_env("rffm-unset")
    del env["RFFM_GCP_PROJECT"]
    result, report = run_fake_batch(repo_checkout, tmp_path / "state", emulator, "--profile", "profiles/gcp-batch", env=env)
    assert result.returncode != 0 and report["jobs"] == []
    assert "RFFM_GCP_PROJECT is not set" in output(result)


def test_the_profiles_network_lines_give_a_private_subnetwork(repo_checkout, emulator, tmp_path):
    """The commented network block of profiles/gcp-batch/config.yaml, uncommented as profiles/README.md says."""
    checkout = tmp_path / "checkout"
    shutil.copytree(repo_checkout, checkout, symlinks=True)
    profile = checkout / "profiles" / "gcp-batch" / "config.yaml"
    lines = profile.read_text().splitlines()
    network = [
        i
        for i, line in enumerate(lines)
        if line.startswith(("# rffm-googlebatch-network", "# rffm-googlebatch-subnetwork", "# rffm-googlebatch-no-external"))
    ]
    assert len(network) == 3, "the profile's network block changed"
    for i in network:
        lines[i] = lines[i].removeprefix("# ")
    profile.write_text("\n".join(lines) + "\n")
    create_bucket(emulator, "rffm-private")
    env = {**profile_env("rffm-private"), "RFFM_BATCH_NETWORK": "rffm-vpc", "RFFM_BATCH_SUBNETWORK": "rffm-central"}
    result, report = run_fake_batch(
        checkout, tmp_path / "state", emulator, "--profile", "profiles/gcp-batch", *FAST, env={**env, "FAKE_BATCH_MODE": "capture"}
    )
    assert report["jobs"], output(result)
    for job in report["jobs"]:
        [interface] = job["request"]["job"]["allocation_policy"]["network"]["network_interfaces"]
        assert interface == {
            "network": f"projects/{PROJECT}/global/networks/rffm-vpc",
            "subnetwork": f"projects/{PROJECT}/regions/us-central1/subnetworks/rffm-central",
            "no_external_ip_address": True,
        }, interface
    del env["RFFM_BATCH_SUBNETWORK"]
    result, report = run_fake_batch(checkout, tmp_path / "unset", emulator, "--profile", "profiles/gcp-batch", env=env)
    assert result.returncode != 0 and report["jobs"] == [] and "RFFM_BATCH_SUBNETWORK is not set" in output(result)


def test_a_dataset_file_uploaded_to_the_bucket_is_staged_on_a_vm(emulator, tmp_path):
    """profiles/README.md, "Your data in the bucket": a relative source path P is gs://$RFFM_GCS_BUCKET/rffm/P."""
    import h5py
    import numpy as np
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    rng = np.random.default_rng(5)
    labels, snrs = np.repeat(np.arange(4), 16), np.tile(np.repeat([0.0, 10.0], 8), 4)
    source = tmp_path / "mine.h5"
    with h5py.File(source, "w") as f:
        f["iq"] = rng.standard_normal((64, 2, 64)).astype(np.float32)
        f["label"], f["snr_db"] = labels, snrs
        f.attrs["classes"] = json.dumps(["BPSK", "QPSK", "16QAM", "GFSK"])
    config = tiny_config()
    config["datasets"]["tiny"] = {
        "source": "hdf5",
        "seed": 3,
        "hdf5": {"path": "data/mine.h5"},
        "splits": config["datasets"]["tiny"]["splits"],
    }
    checkout = make_checkout(tmp_path / "checkout", config)
    create_bucket(emulator, "rffm-data")
    gcs = storage.Client(project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator})
    gcs.bucket("rffm-data").blob("rffm/data/mine.h5").upload_from_filename(str(source))  # gcloud storage cp, as documented
    sentinel = "results/datasets/tiny/sentinel.json"
    result, report = run_fake_batch(
        checkout, tmp_path / "state", emulator, "--profile", "profiles/gcp-batch", *FAST, sentinel, env=profile_env("rffm-data")
    )
    assert result.returncode == 0, output(result)
    assert [rule_of(job) for job in report["jobs"]] == ["stage-dataset"]
    staged = bucket_objects(emulator, "rffm-data")[f"rffm/{sentinel}"].download_as_bytes()
    # the same dataset staged locally from the same file: the same sentinel, byte for byte
    local = tmp_path / "local"
    (local / "data").mkdir(parents=True)
    shutil.copy(source, local / "data" / "mine.h5")
    write_config(local, config)
    snakemake(local, sentinel)
    assert staged == (local / sentinel).read_bytes()


# ---- regression tests: each upstream defect, on a minimal workflow, against both executors ----


@pytest.fixture
def executor_workdir(tmp_path) -> Path:
    workdir = tmp_path / "wf"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(EXECUTOR_SNAKEFILE)
    return workdir


def executor_profile(workdir: Path, executor: str, bucket: str, **extra) -> str:
    """A profile for either executor (same settings; the local SSD only where the plugin has it)."""
    prefix = executor
    profile = {
        "executor": executor,
        "jobs": 4,
        "latency-wait": 3,
        "seconds-between-status-checks": 1,
        "retries": 0,
        f"{prefix}-project": PROJECT,
        f"{prefix}-region": "us-central1",
        f"{prefix}-image-family": "batch-cos-stable-official",
        f"{prefix}-image-project": "batch-custom-image",
        f"{prefix}-container": IMAGE,
        f"{prefix}-retry-count": 0,
        "default-storage-provider": "gcs",
        "default-storage-prefix": f"gs://{bucket}/wf",
        "storage-gcs-project": PROJECT,
        **extra,
    }
    directory = workdir / "profiles" / executor
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return str(directory)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_failing_rule_is_reported_failed(executor, executor_workdir, emulator, tmp_path):
    """Upstream: the job's exit status is the trailing `pip install`'s, so Batch says SUCCEEDED."""
    profile = executor_profile(executor_workdir, executor, f"rffm-fail-{executor}")
    result, report = run_fake_batch(executor_workdir, tmp_path / "state", emulator, "--profile", profile, "fail.txt")
    [job] = report["jobs"]
    assert result.returncode != 0
    assert job["state"] == "FAILED", output(result)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_successful_rule_succeeds_on_a_vm_without_pypi_egress(executor, executor_workdir, emulator, tmp_path):
    """Upstream pip-installs the storage plugin (and pins boto3) on every VM; the image has all of it."""
    profile = executor_profile(executor_workdir, executor, f"rffm-offline-{executor}")
    result, report = run_fake_batch(
        executor_workdir, tmp_path / "state", emulator, "--profile", profile, "ok.txt", env={"FAKE_BATCH_PYPI": "offline"}
    )
    assert result.returncode == 0, output(result)
    assert bucket_objects(emulator, f"rffm-offline-{executor}")["wf/ok.txt"].download_as_text() == "$(echo not expanded on the host)\n"


@pytest.mark.parametrize("executor", EXECUTORS)
def test_transient_status_errors_neither_abort_the_run_nor_abandon_the_vm(executor, executor_workdir, emulator, tmp_path):
    """Upstream: one 503 while polling aborts Snakemake and leaves the Batch job (a VM) running."""
    profile = executor_profile(executor_workdir, executor, f"rffm-flaky-{executor}")
    faults = {"get_job": ["ServiceUnavailable", "DeadlineExceeded", "ServiceUnavailable"]}
    result, report = run_fake_batch(
        executor_workdir, tmp_path / "state", emulator, "--profile", profile, "ok.txt", env={"FAKE_BATCH_FAULTS": json.dumps(faults)}
    )
    [job] = report["jobs"]
    assert not job["running_at_exit"], "the run ended while its Batch job was still running"
    assert result.returncode == 0 and job["state"] == "SUCCEEDED", output(result)
    assert report["faults_raised"] == ["get_job: ServiceUnavailable", "get_job: DeadlineExceeded", "get_job: ServiceUnavailable"]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_job_whose_status_cannot_be_read_is_deleted_not_abandoned(executor, executor_workdir, emulator, tmp_path):
    """A non-transient status error (lost permission): the step fails and its VM is deleted."""
    profile = executor_profile(executor_workdir, executor, f"rffm-denied-{executor}")
    faults = {"get_job": ["PermissionDenied"]}
    result, report = run_fake_batch(
        executor_workdir, tmp_path / "state", emulator, "--profile", profile, "ok.txt", env={"FAKE_BATCH_FAULTS": json.dumps(faults)}
    )
    [job] = report["jobs"]
    assert result.returncode != 0
    assert job["deleted"] and not job["running_at_exit"], output(result)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_transient_error_on_submission_is_retried(executor, executor_workdir, emulator, tmp_path):
    """Upstream: a 503 from create_job ends the run."""
    profile = executor_profile(executor_workdir, executor, f"rffm-submit-{executor}")
    faults = {"create_job": ["ServiceUnavailable"]}
    result, report = run_fake_batch(
        executor_workdir, tmp_path / "state", emulator, "--profile", profile, "ok.txt", env={"FAKE_BATCH_FAULTS": json.dumps(faults)}
    )
    assert report["faults_raised"] == ["create_job: ServiceUnavailable"]
    assert result.returncode == 0 and [job["state"] for job in report["jobs"]] == ["SUCCEEDED"], output(result)


@pytest.fixture(scope="module")
def captured(emulator, tmp_path_factory):
    """Capture mode, once per executor: the job `ok` as submitted (spot, g2 type, boot disk size, local SSD)."""
    runs = {}

    def capture(executor: str) -> dict:
        if executor not in runs:
            workdir = tmp_path_factory.mktemp(f"capture-{executor}")
            (workdir / "Snakefile").write_text(EXECUTOR_SNAKEFILE + EOF_RULE)
            extra = {
                "preemptible-rules": ["ok"],
                f"{executor}-boot-disk-gb": 100,  # no boot-disk-image: the family must be kept
                "set-resources": {"ok": {"googlebatch_local_ssd_gb": 375, "googlebatch_machine_type": "g2-standard-8"}},
                "config": {"scratch": "cache"},
            }
            profile = executor_profile(workdir, executor, f"rffm-capture-{executor}", **extra)
            result, report = run_fake_batch(
                workdir, workdir / "state", emulator, "--profile", profile, "ok.txt", env={"FAKE_BATCH_MODE": "capture"}
            )
            assert len(report["jobs"]) == 1, output(result)
            runs[executor] = {"job": report["jobs"][0], "snakefile": (workdir / "Snakefile").read_text()}
        return runs[executor]

    return capture


@pytest.mark.parametrize("executor", EXECUTORS)
def test_spot_rules_request_spot_vms(executor, captured):
    """Upstream asks for legacy PREEMPTIBLE VMs."""
    assert instance(captured(executor)["job"])["policy"]["provisioning_model"] == "SPOT"


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_gpu_machine_type_gets_the_gpu_driver(executor, captured):
    """Upstream installs the driver only with the `nvidia_gpu` resource, not for a g2 machine type alone."""
    job = captured(executor)["job"]
    assert instance(job)["policy"]["machine_type"] == "g2-standard-8"
    assert instance(job)["install_gpu_drivers"] is True


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_boot_disk_size_keeps_the_boot_image(executor, captured):
    """Upstream drops the image family when only the boot disk size or type is set."""
    disk = instance(captured(executor)["job"])["policy"]["boot_disk"]
    assert disk["size_gb"] == "100"
    assert disk.get("image") == "projects/batch-custom-image/global/images/family/batch-cos-stable-official"


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_local_ssd_is_attached_and_mounted_at_the_cache_directory(executor, captured):
    """Upstream has no way to attach a local SSD."""
    job = captured(executor)["job"]
    assert [d["device_name"] for d in instance(job)["policy"]["disks"]] == ["rffm-scratch"]
    assert [v["mount_path"] for v in task_spec(job)["volumes"]] == ["/mnt/disks/rffm-scratch"]
    assert "/mnt/disks/rffm-scratch:/tmp/workdir/cache" in container(job)["volumes"]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_snakefile_reaches_the_vm_verbatim(executor, captured):
    """Upstream writes it through an unquoted heredoc: $(...) runs on the host, a line EOF cuts it."""
    run = captured(executor)
    written = Path(run["job"]["sandbox"]) / "host" / "tmp" / "workdir" / "Snakefile"
    assert written.read_text() == run["snakefile"]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_job_ids_are_valid_for_any_rule_name(executor, executor_workdir, emulator, tmp_path):
    """Upstream keeps upper case (rule trainModel): Batch rejects the job id."""
    profile = executor_profile(executor_workdir, executor, f"rffm-ids-{executor}")
    result, report = run_fake_batch(
        executor_workdir, tmp_path / "state", emulator, "--profile", profile, "model.txt", env={"FAKE_BATCH_MODE": "capture"}
    )
    assert report["rejected"] == [], output(result)
    [job] = report["jobs"]
    assert JOB_ID.match(job["job_id"]) and job["job_id"].startswith("trainmodel-")
