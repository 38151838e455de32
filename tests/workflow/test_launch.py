"""Launch records: the profile a launch names (config `launch_profile`), kept create-only under runs/<run>/launch/."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from conftest import REPO, snakemake
from rffm.errors import RffmError
from rffm.records import launch
from rffm.records.files import read_json
from rffm.records.store import PosixStore


def profile(root: Path, name: str, text: str = "printshellcmds: true\n") -> Path:
    path = root / name / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_shipped_cluster_profiles_name_themselves():
    for name in ("slurm", "gcp-batch"):
        text = (REPO / "profiles" / name / "config.yaml").read_text()
        assert yaml.safe_load(text)["config"]["launch_profile"] == name
    assert "config" not in yaml.safe_load((REPO / "profiles/default/config.yaml").read_text())  # it would replace theirs


def test_a_profile_name_means_what_it_means_to_snakemake(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here = profile(tmp_path, "mine")
    assert launch.profile_file("mine", REPO / "workflow").resolve() == here  # Snakemake looks in the current directory first
    assert launch.profile_file("slurm", REPO / "workflow") == REPO / "profiles/slurm/config.yaml"  # then the checkout
    with pytest.raises(RffmError, match="names no Snakemake profile"):
        launch.profile_file("nowhere", REPO / "workflow")


def test_a_profile_is_recorded_create_only_with_its_sha256(tmp_path: Path):
    source = profile(tmp_path / "profiles", "slurm", "executor: slurm\n")
    store = PosixStore(tmp_path / "results")
    record = launch.record_profile(store, "base", "slurm", source)
    kept = tmp_path / "results/runs/base/launch/slurm/config.yaml"
    assert kept.read_bytes() == source.read_bytes() and not kept.stat().st_mode & 0o222
    digest = hashlib.sha256(b"executor: slurm\n").hexdigest()
    assert record == {"name": "slurm", "path": str(source), "sha256": digest, "file": "launch/slurm/config.yaml"}
    assert launch.recorded(store, "base", "slurm") == record
    assert launch.record_profile(store, "base", "slurm", source) == record  # the same file again is fine
    assert launch.recorded(store, "base", None)["sha256"] is None


def test_a_differing_profile_is_an_error_and_the_record_is_kept(tmp_path: Path):
    source = profile(tmp_path / "profiles", "slurm", "executor: slurm\n")
    store = PosixStore(tmp_path / "results")
    launch.record_profile(store, "base", "slurm", source)
    source.write_text("executor: slurm\njobs: 3\n")
    with pytest.raises(launch.LaunchProfileChanged) as error:
        launch.record_profile(store, "base", "slurm", source)
    message = str(error.value)
    kept = tmp_path / "results/runs/base/launch/slurm/config.yaml"
    assert str(kept) in message and "Fix:" in message
    assert hashlib.sha256(b"executor: slurm\n").hexdigest() in message
    assert hashlib.sha256(source.read_bytes()).hexdigest() in message
    assert kept.read_text() == "executor: slurm\n"


def test_every_run_is_checked_before_any_record_is_written(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = profile(tmp_path, "slurm", "executor: slurm\n")
    store = PosixStore(tmp_path / "results")
    launch.record_profile(store, "b", "slurm", source)
    source.write_text("executor: slurm\njobs: 3\n")
    with pytest.raises(launch.LaunchProfileChanged):
        launch.record_launch("slurm", REPO / "workflow", store, ["a", "b"])
    assert not (tmp_path / "results/runs/a").exists()
    assert launch.record_launch(None, REPO / "workflow", store, ["a"]) is None


@pytest.mark.workflow
def test_changing_the_profile_between_launches_is_refused_not_overwritten(workdir: Path):
    source = profile(workdir, "myprofile", "printshellcmds: true\nconfig:\n  launch_profile: myprofile\n")
    snakemake(workdir, "--profile", "myprofile", "--forcerun", "qualify")
    kept = workdir / "results/runs/base/launch/myprofile/config.yaml"
    manifest_path = workdir / "results/runs/base/qualification/run_manifest.json"
    launched = read_json(manifest_path)["provenance"]["launch_profile"]
    assert kept.read_bytes() == source.read_bytes()
    assert launched["name"] == "myprofile" and launched["file"] == "launch/myprofile/config.yaml"
    assert launched["path"] == "myprofile/config.yaml"  # as Snakemake found it, from the working directory
    assert launched["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    manifest = manifest_path.read_bytes()

    source.write_text(source.read_text() + "keep-going: true\n")
    result = snakemake(workdir, "--profile", "myprofile", "--forcerun", "qualify", check=False)
    assert result.returncode != 0
    assert "differs from the one run 'base' was launched with, recorded in" in result.stderr
    assert "Traceback" not in result.stderr and 'File "' not in result.stderr
    assert kept.read_text() == "printshellcmds: true\nconfig:\n  launch_profile: myprofile\n"
    assert manifest_path.read_bytes() == manifest
