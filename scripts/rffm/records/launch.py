"""Launch records: which Snakemake profile started a run, kept create-only under runs/<run>/launch/<profile>/.

Each cluster profile names itself in its `config:` block (`launch_profile: gcp-batch`); Snakemake
passes that value to the workflow and to every job. When the workflow starts (its `onstart`
handler), the profile file that name means to Snakemake (its own lookup, snakemake.cli.get_profile_dir,
else the checkout's profiles/<name>) is copied into each run's launch folder in the results store
(the bucket on Google Batch) with its sha256, create-only: launching the run again with an edited
profile is refused. qualify reads the record back into the run manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rffm.errors import RffmError
from rffm.records.files import canonical_json, sha256_bytes
from rffm.records.layout import LAUNCH, launch_folder
from rffm.records.store import Store

RECORD_NAME = "launch.json"


class LaunchProfileChanged(RffmError):
    """The profile file of this launch differs from the one recorded for the run."""


def profile_file(name: str, workflow_dir: str | Path) -> Path:
    """The file a profile name means: Snakemake's lookup from here, else <checkout>/profiles/<name>."""
    from snakemake.cli import get_profile_dir

    found = get_profile_dir(name) or get_profile_dir(str(Path(workflow_dir).resolve().parent / "profiles" / name))
    if found is None:
        raise RffmError(
            f"config launch_profile: {name!r} names no Snakemake profile here. Fix: put (or link) the profile where "
            f"`snakemake --profile {name}` finds it: a directory {name}/ here or in Snakemake's user profile directory "
            "(`rffm install_profiles` links the shipped ones there); or drop the key."
        )
    return Path(found[1])


def check_profile(store: Store, run: str, name: str, profile: str | Path) -> None:
    """Raise LaunchProfileChanged when the run already records a different file for this profile name."""
    profile = Path(profile)
    key = f"{folder(run, name)}/{profile.name}"
    kept, data = store.read(key), profile.read_bytes()
    if kept is not None and kept != data:
        raise LaunchProfileChanged(
            f"the launch profile {profile} (sha256 {sha256_bytes(data)}) differs from the one run {run!r} was launched with, "
            f"recorded in {store.where(key)} (sha256 {sha256_bytes(kept)}). The record is kept as it is. "
            "Fix: restore the profile file (compare the two files), or launch these changes as a new run id (rename the run "
            "in the config: a launch records its profile for every run there), or delete "
            f"{store.where(folder(run, name))} to record the new profile."
        )


def folder(run: str, name: str) -> str:
    """The store folder of a run's record of one profile."""
    return f"{launch_folder(run)}/{name}"


def record_profile(store: Store, run: str, name: str, profile: str | Path) -> dict[str, Any]:
    """Copy a profile file create-only into the run's launch folder with its sha256; a differing earlier record is an error."""
    profile = Path(profile)
    check_profile(store, run, name, profile)
    data = profile.read_bytes()
    record = {"name": name, "path": str(profile), "sha256": sha256_bytes(data), "file": f"{LAUNCH}/{name}/{profile.name}"}
    store.create(f"{folder(run, name)}/{profile.name}", data)
    store.create(f"{folder(run, name)}/{RECORD_NAME}", canonical_json(record).encode())
    return record


def record_launch(name: str | None, workflow_dir: str | Path, store: Store, runs: list[str]) -> dict[str, Any] | None:
    """Record the named profile for every run (all checked before any is written); None when the launch names none."""
    if not name:
        return None
    profile = profile_file(name, workflow_dir)
    for run in runs:
        check_profile(store, run, name, profile)
    records = [record_profile(store, run, name, profile) for run in runs]
    return records[0] if records else None


def recorded(store: Store, run: str, name: str | None) -> dict[str, Any]:
    """The launch record a run holds for a profile name (what the manifest reports); nulls without one."""
    data = store.read(f"{folder(run, name)}/{RECORD_NAME}") if name else None
    return json.loads(data) if data else {"name": name or None, "path": None, "sha256": None, "file": None}
