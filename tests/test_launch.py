"""Launch records: which profile file started a run, kept create-only under runs/<run>/launch/."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from conftest import snakemake
from rffm import launch
from rffm.files import read_json

SNAKEMAKE = ["/venv/bin/snakemake"]


def profile(root: Path, name: str, text: str = "printshellcmds: true\n") -> Path:
    path = root / name / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_profile_files_follow_snakemakes_lookup(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    slurm = profile(tmp_path, "profiles/slurm")
    default = profile(tmp_path, "profiles/default")
    snakefile = tmp_path / "workflow" / "Snakefile"
    files = launch.profile_files(SNAKEMAKE + ["--profile", "profiles/slurm", "-n"], {}, snakefile)
    assert [f.resolve() for f in files] == [slurm, default]
    files = launch.profile_files(SNAKEMAKE + ["--profile=profiles/slurm", "--workflow-profile", "none"], {}, snakefile)
    assert [f.resolve() for f in files] == [slurm]
    assert [f.resolve() for f in launch.profile_files(SNAKEMAKE, {"SNAKEMAKE_PROFILE": "profiles/slurm"}, snakefile)] == [slurm, default]
    assert [f.resolve() for f in launch.profile_files(SNAKEMAKE, {}, snakefile)] == [default]


def test_api_callers_name_their_profile_explicitly(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    profile(tmp_path, "profiles/default")
    assert launch.profile_files(["/venv/bin/rffm", "posttrain"], {}, None) == []
    assert launch.profile_files(SNAKEMAKE, {launch.OVERRIDE_ENV: "none"}, None) == []
    assert launch.profile_files(["rffm"], {launch.OVERRIDE_ENV: "my/launch.yaml"}, None) == [Path("my/launch.yaml")]


def test_a_profile_is_recorded_create_only_with_its_sha256(tmp_path: Path):
    source = profile(tmp_path, "slurm", "executor: slurm\n")
    launch_dir = tmp_path / "runs/base/launch"
    record = launch.record_profile(source, launch_dir)
    kept = launch_dir / "slurm/config.yaml"
    assert kept.read_bytes() == source.read_bytes() and not kept.stat().st_mode & 0o222
    assert record == {"path": str(source), "sha256": hashlib.sha256(b"executor: slurm\n").hexdigest(), "record": "launch/slurm/config.yaml"}
    check = subprocess.run(["sha256sum", "-c", "config.yaml.sha256"], cwd=kept.parent, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert launch.record_profile(source, launch_dir) == record  # the same file again is fine


def test_a_differing_profile_is_an_error_and_the_record_is_kept(tmp_path: Path):
    source = profile(tmp_path, "slurm", "executor: slurm\n")
    launch.record_profile(source, tmp_path / "launch")
    source.write_text("executor: slurm\njobs: 3\n")
    with pytest.raises(launch.LaunchProfileChanged) as error:
        launch.record_profile(source, tmp_path / "launch")
    message = str(error.value)
    assert str(tmp_path / "launch/slurm/config.yaml") in message and "Fix:" in message
    assert hashlib.sha256(b"executor: slurm\n").hexdigest() in message
    assert hashlib.sha256(source.read_bytes()).hexdigest() in message
    assert (tmp_path / "launch/slurm/config.yaml").read_text() == "executor: slurm\n"


def test_every_run_is_checked_before_any_record_is_written(tmp_path: Path):
    source = profile(tmp_path, "slurm", "executor: slurm\n")
    launch.record_profile(source, tmp_path / "b/launch")
    source.write_text("executor: slurm\njobs: 3\n")
    with pytest.raises(launch.LaunchProfileChanged):
        launch.record_launch([source], [tmp_path / "a/launch", tmp_path / "b/launch"])
    assert not (tmp_path / "a/launch").exists()
    record = launch.record_launch([], [tmp_path / "a/launch"])
    assert record["path"] is None and record["profiles"] == []


@pytest.mark.workflow
def test_changing_the_profile_between_launches_is_reported_not_overwritten(workdir: Path):
    source = profile(workdir, "myprofile")
    snakemake(workdir, "--profile", "myprofile", "--forcerun", "qualify")
    kept = workdir / "results/runs/base/launch/myprofile/config.yaml"
    manifest_path = workdir / "results/runs/base/qualification/run_manifest.json"
    launched = read_json(manifest_path)["provenance"]["launch_profile"]
    assert kept.read_bytes() == source.read_bytes()
    assert launched["path"] == "myprofile/config.yaml" and launched["record"] == "launch/myprofile/config.yaml"
    assert launched["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    manifest = manifest_path.read_bytes()

    source.write_text("printshellcmds: true\nkeep-going: true\n")
    dry = snakemake(workdir, "--profile", "myprofile", "--forcerun", "qualify", "-n")
    assert "differs from the one this run was launched with" in dry.stdout + dry.stderr  # a warning: nothing is written
    result = snakemake(workdir, "--profile", "myprofile", "--forcerun", "qualify", check=False)
    assert result.returncode != 0
    assert f"differs from the one this run was launched with, recorded in {kept.relative_to(workdir)}" in result.stderr
    assert kept.read_text() == "printshellcmds: true\n"
    assert manifest_path.read_bytes() == manifest
