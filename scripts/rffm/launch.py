"""Launch records: which Snakemake profile file started a run, kept create-only in runs/<run>/launch/.

Snakemake does not tell a workflow which profiles it applied, so `profile_files` re-reads the
Snakemake command line with Snakemake's own lookup (`snakemake.cli.get_profile_dir` and the
workflow-profile search of `snakemake.cli.parse_args`). Launchers that do not go through that
command line (a Python API caller, a wrapper script) name the file in RFFM_PROFILE_FILE instead.
The record of the launch in progress travels to the jobs in the RFFM_LAUNCH_PROFILE environment
variable (JSON), which the run manifest reports; the copies under launch/ are never overwritten.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rffm.errors import RffmError
from rffm.files import atomic_write_bytes, sha256_bytes

CURRENT_ENV = "RFFM_LAUNCH_PROFILE"
OVERRIDE_ENV = "RFFM_PROFILE_FILE"
LAUNCH_DIR = "launch"
READ_ONLY = 0o444


class LaunchProfileChanged(RffmError):
    """The profile file of this launch differs from the one recorded for the run."""


def _option_values(argv: Sequence[str], option: str) -> list[str]:
    """Values of a long option given as `--opt value` or `--opt=value`, in order."""
    values = []
    for index, token in enumerate(argv):
        if token == "--":
            break
        if token == option and index + 1 < len(argv):
            values.append(argv[index + 1])
        elif token.startswith(option + "="):
            values.append(token.split("=", 1)[1])
    return values


def is_snakemake_cli(argv: Sequence[str]) -> bool:
    """Whether this process is the `snakemake` command line (not an API caller such as rffm posttrain)."""
    if not argv:
        return False
    program = Path(argv[0])
    return program.name == "snakemake" or (program.name == "__main__.py" and program.parent.name == "snakemake")


def _profile_file(profile: str | Path) -> Path | None:
    from snakemake.cli import get_profile_dir

    found = get_profile_dir(str(profile))
    return None if found is None else Path(found[1])


def _workflow_profile(argv: Sequence[str], snakefile: str | Path | None) -> Path | None:
    """The workflow profile Snakemake applies (same search as snakemake.cli.parse_args)."""
    given = (_option_values(argv, "--workflow-profile") or [None])[-1]
    if given == "none":
        return None
    if given and Path(given).is_file():
        return Path(given)
    name = Path(given) if given else Path("default")
    candidates = [name, Path("profiles") / name]
    if snakefile is not None:
        candidates.append(Path(snakefile).parent / "profiles" / name)
    for candidate in candidates:
        if candidate.exists():
            return _profile_file(candidate)
    return None


def profile_files(argv: Sequence[str], environ: Mapping[str, str], snakefile: str | Path | None) -> list[Path]:
    """Profile files of this launch, the one the user chose first: `--profile`s last to first, then the workflow profile."""
    override = environ.get(OVERRIDE_ENV)
    if override is not None:
        return [] if override in ("", "none") else [Path(override)]
    if not is_snakemake_cli(argv):
        return []
    general = _option_values(argv, "--profile")
    if not general and environ.get("SNAKEMAKE_PROFILE"):
        general = [environ["SNAKEMAKE_PROFILE"]]
    files = [] if general == ["none"] else [f for f in map(_profile_file, reversed(general)) if f is not None]
    workflow_profile = _workflow_profile(argv, snakefile)
    if workflow_profile is not None:
        files.append(workflow_profile)
    return files


def record_name(profile: Path) -> Path:
    """Where a profile file is kept inside a launch folder: <profile folder name>/<file name>."""
    return Path(profile.resolve().parent.name or "profile") / profile.name


def _create_only(path: Path, data: bytes) -> bool:
    """Write bytes to a new file atomically; False (and nothing written) when the path already exists."""
    try:
        atomic_write_bytes(path, data, mode=READ_ONLY, create_only=True)
    except FileExistsError:
        return False
    return True


def check_profile(profile: str | Path, launch_dir: str | Path) -> str | None:
    """Describe how the profile differs from the copy recorded in launch_dir, or None when it does not."""
    profile, launch_dir = Path(profile), Path(launch_dir)
    recorded = launch_dir / record_name(profile)
    if not recorded.exists():
        return None
    data, kept = profile.read_bytes(), recorded.read_bytes()
    if data == kept:
        return None
    return (
        f"the launch profile {profile} (sha256 {sha256_bytes(data)}) differs from the one this run was "
        f"launched with, recorded in {recorded} (sha256 {sha256_bytes(kept)}). The record is kept as it is. "
        "Fix: restore the profile file (compare the two files), or launch these changes as a new run id "
        f"(copy the run under a new name in the config), or delete {recorded} to record the new profile for this run."
    )


def record_profile(profile: str | Path, launch_dir: str | Path) -> dict[str, Any]:
    """Copy a profile file create-only into launch_dir with its sha256; an identical copy is fine, a differing one an error."""
    profile, launch_dir = Path(profile), Path(launch_dir)
    data = profile.read_bytes()
    digest = sha256_bytes(data)
    recorded = launch_dir / record_name(profile)
    if not _create_only(recorded, data):
        problem = check_profile(profile, launch_dir)
        if problem:
            raise LaunchProfileChanged(problem)
    _create_only(recorded.with_name(recorded.name + ".sha256"), f"{digest}  {recorded.name}\n".encode())
    return describe(profile)


def describe(profile: str | Path) -> dict[str, Any]:
    """Path, sha256 and launch-folder name of a profile file."""
    profile = Path(profile)
    return {"path": str(profile), "sha256": sha256_bytes(profile.read_bytes()), "record": f"{LAUNCH_DIR}/{record_name(profile).as_posix()}"}


def record_launch(profiles: Sequence[str | Path], launch_dirs: Sequence[str | Path]) -> dict[str, Any]:
    """Record every profile file in every run's launch folder (all checked before any is written); return the launch record.

    The first profile is the primary one reported as the run's launch profile; all are listed under `profiles`.
    """
    problems = [problem for d in launch_dirs for f in profiles if (problem := check_profile(f, d))]
    if problems:
        raise LaunchProfileChanged("\n".join(problems))
    for directory in launch_dirs:
        for profile in profiles:
            record_profile(profile, directory)
    records = [describe(profile) for profile in profiles]
    primary = records[0] if records else {"path": None, "sha256": None, "record": None}
    return {**primary, "profiles": records}


def current() -> dict[str, Any]:
    """The launch record of the launch in progress (from RFFM_LAUNCH_PROFILE), or nulls when none was recorded."""
    text = os.environ.get(CURRENT_ENV)
    if not text:
        return {"path": None, "sha256": None, "record": None, "profiles": []}
    return json.loads(text)
