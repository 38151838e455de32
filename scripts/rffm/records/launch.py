"""Launch records: which Snakemake profile started a run, kept create-only under runs/<run>/launch/<profile>/.

Each cluster profile names itself in its `config:` block (`launch_profile: gcp-batch`); Snakemake
passes that value to the workflow and to every job. When the workflow starts (its `onstart`
handler), the profile file that name means to Snakemake (its own lookup, snakemake.cli.get_profile_dir,
else the checkout's profiles/<name>) is copied into each run's launch folder with its sha256, and
never overwritten: launching the run again with an edited profile is refused. qualify reads the
record back into the run manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm.errors import RffmError
from rffm.records.files import atomic_write_bytes, canonical_json, read_json, sha256_bytes

LAUNCH_DIR = "launch"
RECORD_NAME = "launch.json"
READ_ONLY = 0o444


class LaunchProfileChanged(RffmError):
    """The profile file of this launch differs from the one recorded for the run."""


def profile_file(name: str, workflow_dir: str | Path) -> Path:
    """The file a profile name means: Snakemake's lookup from here, else <checkout>/profiles/<name>."""
    from snakemake.cli import get_profile_dir

    found = get_profile_dir(name) or get_profile_dir(str(Path(workflow_dir).resolve().parent / "profiles" / name))
    if found is None:
        raise RffmError(f"config launch_profile: {name!r} names no Snakemake profile here. Fix: use --profile {name}, or drop the key.")
    return Path(found[1])


def _create_only(path: Path, data: bytes) -> bool:
    """Write bytes to a new file atomically; False (and nothing written) when the path already exists."""
    try:
        atomic_write_bytes(path, data, mode=READ_ONLY, create_only=True)
    except FileExistsError:
        return False
    return True


def check_profile(name: str, profile: str | Path, launch_dir: str | Path) -> None:
    """Raise LaunchProfileChanged when launch_dir already records a different file for this profile name."""
    profile, folder = Path(profile), Path(launch_dir) / name
    kept_path = folder / profile.name
    if not kept_path.exists():
        return
    data, kept = profile.read_bytes(), kept_path.read_bytes()
    if kept != data:
        raise LaunchProfileChanged(
            f"the launch profile {profile} (sha256 {sha256_bytes(data)}) differs from the one this run was launched with, "
            f"recorded in {kept_path} (sha256 {sha256_bytes(kept)}). The record is kept as it is. "
            "Fix: restore the profile file (compare the two files), or launch these changes as a new run id "
            f"(copy the run under a new name in the config), or delete {folder} to record the new profile for this run."
        )


def record_profile(name: str, profile: str | Path, launch_dir: str | Path) -> dict[str, Any]:
    """Copy a profile file create-only into launch_dir/<name>/ with its sha256; a differing earlier record is an error."""
    profile, folder = Path(profile), Path(launch_dir) / name
    check_profile(name, profile, launch_dir)
    data = profile.read_bytes()
    record = {"name": name, "path": str(profile), "sha256": sha256_bytes(data), "file": f"{LAUNCH_DIR}/{name}/{profile.name}"}
    _create_only(folder / profile.name, data)
    _create_only(folder / RECORD_NAME, canonical_json(record).encode())
    return record


def record_launch(name: str | None, workflow_dir: str | Path, launch_dirs: list[str | Path]) -> dict[str, Any] | None:
    """Record the named profile in every run's launch folder (all checked before any is written); None without a name."""
    if not name:
        return None
    profile = profile_file(name, workflow_dir)
    for directory in launch_dirs:
        check_profile(name, profile, directory)
    records = [record_profile(name, profile, directory) for directory in launch_dirs]
    return records[0] if records else None


def recorded(run_dir: str | Path, name: str | None) -> dict[str, Any]:
    """The launch record a run holds for a profile name (what the manifest reports); nulls without one."""
    path = Path(run_dir) / LAUNCH_DIR / (name or "-") / RECORD_NAME
    if not name or not path.exists():
        return {"name": name, "path": None, "sha256": None, "file": None}
    return read_json(path)
