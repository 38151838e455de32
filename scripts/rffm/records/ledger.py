"""The test-split ledger: every (run, artifact) ever qualified on a split, beside the split."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rffm.errors import ExposureError
from rffm.records.files import atomic_write_json, read_json

LEDGER_NAME = "test_ledger.json"


@contextmanager
def locked(dataset_dir: str | Path) -> Iterator[Path]:
    """Hold an exclusive lock on the split's ledger while reading and updating it."""
    dataset_dir = Path(dataset_dir)
    with open(dataset_dir / ".test_ledger.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield dataset_dir / LEDGER_NAME
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def entries(path: Path, split_digest: str) -> list[dict[str, Any]]:
    """Ledger entries for this exact test split."""
    if not path.exists():
        return []
    return [entry for entry in read_json(path)["entries"] if entry["split_digest"] == split_digest]


def exposure_count(path: Path, split_digest: str) -> int:
    """Distinct artifacts evaluated on this split so far."""
    return len({entry["artifact_sha256"] for entry in entries(path, split_digest)})


def recorded(path: Path, split_digest: str, run: str, artifact_sha256: str) -> dict[str, Any] | None:
    """The recorded result of this run's qualification, refusing a different artifact for the same run."""
    for entry in entries(path, split_digest):
        if entry["run"] != run:
            continue
        if entry["artifact_sha256"] == artifact_sha256:
            return entry
        raise ExposureError(
            f"run {run!r} already spent its test exposure: artifact {entry['artifact_sha256'][:16]}… was qualified on this "
            f"test split ({path}); the selected artifact is now {artifact_sha256[:16]}…. Evaluating a second artifact on the same "
            "test data would turn the test split into a validation set. Fix: keep the run's settings as they were, or copy the "
            "run under a new id in config (runs: <new-id>: ...) and qualify that; every run's manifest reports the exposure count."
        )
    return None


def record(path: Path, split_digest: str, run: str, artifact_sha256: str, metrics: dict[str, Any]) -> None:
    """Append an entry (call under `locked`)."""
    ledger = read_json(path) if path.exists() else {"schema_version": 1, "entries": []}
    ledger["entries"].append({"split_digest": split_digest, "run": run, "artifact_sha256": artifact_sha256, "metrics": metrics})
    atomic_write_json(path, ledger)
