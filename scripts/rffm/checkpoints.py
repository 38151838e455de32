"""An epoch checkpoint store outside the results tree, so a relaunch after preemption resumes from completed epochs.

When RFFM_CHECKPOINT_STORE names a directory (rffm posttrain sets it from AIP_CHECKPOINT_DIR),
every completed epoch is mirrored to <store>/runs/<run>/epochs/<epoch>/ (files first, sentinel
last). A relaunch on a fresh machine has lost the node-local cache, so Snakemake rebuilds it and
reruns every epoch after it; an epoch whose stored sentinel names the same cache, previous epoch,
params and code as this one is then restored from the store instead of trained. Epochs are
deterministic, so restored and retrained bytes are the same; any mismatch means "train".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rffm import provenance
from rffm.errors import IntegrityError
from rffm.files import atomic_write_bytes, read_json, sha256_json
from rffm.sentinel import SENTINEL_NAME, code_digest, read_sentinel, sentinel_problems, upstream

STORE_ENV = "RFFM_CHECKPOINT_STORE"
EPOCH_FILES = ("checkpoint.pt", "metrics.json", "provenance.json")
# Sentinel fields that identify what an epoch computed from (everything but its outputs and results).
IDENTITY = ("stage", "key", "inputs", "params_sha256", "code_sha256")


def store_from_env() -> Path | None:
    """The checkpoint store named by RFFM_CHECKPOINT_STORE, if any."""
    value = os.environ.get(STORE_ENV)
    return Path(value) if value else None


def stored_epoch(store: str | Path, run: str, epoch: int) -> Path:
    """Where an epoch lives in the store."""
    return Path(store) / "runs" / run / "epochs" / str(epoch)


def expected_identity(
    spec: dict[str, Any], cache_dir: str | Path, epoch: int, previous_dir: str | Path | None, out_dir: str | Path
) -> dict:
    """The identity fields rffm.train.run_epoch would write into this epoch's sentinel."""
    from rffm.train import train_options

    cache_dir = Path(cache_dir)
    inputs = {"cache": upstream(cache_dir / SENTINEL_NAME, out_dir, scratch_root=cache_dir.parent)}
    if epoch > 1:
        inputs["previous_epoch"] = upstream(Path(previous_dir) / SENTINEL_NAME, out_dir)
    return {
        "stage": "train_epoch",
        "key": {"run": spec["run"], "epoch": epoch},
        "inputs": dict(sorted(inputs.items())),
        "params_sha256": sha256_json({"run": spec["run"], "train": train_options(spec)}),
        "code_sha256": code_digest("train"),
    }


def _copy(source: Path, target: Path) -> None:
    atomic_write_bytes(target, source.read_bytes())


def restore(store: str | Path, spec: dict[str, Any], cache_dir, epoch: int, previous_dir, out_dir) -> bool:
    """Restore this epoch from the store when the stored one was computed from the same inputs; True if restored."""
    started = provenance.start()
    source, out_dir = stored_epoch(store, spec["run"], epoch), Path(out_dir)
    try:
        body = read_sentinel(source / SENTINEL_NAME)
    except IntegrityError:
        return False  # nothing (complete) stored for this epoch
    expected = expected_identity(spec, cache_dir, epoch, previous_dir, out_dir)
    if {field: body.get(field) for field in IDENTITY} != expected or sentinel_problems(source / SENTINEL_NAME):
        return False
    for name in ("checkpoint.pt", "metrics.json"):
        _copy(source / name, out_dir / name)
    computed = read_json(source / "provenance.json") if (source / "provenance.json").exists() else None
    extra = {"epoch": epoch, "restored_from": str(source), "computed_by": computed}
    provenance.finish(out_dir / "provenance.json", "train_epoch", started, extra=extra)
    _copy(source / SENTINEL_NAME, out_dir / SENTINEL_NAME)  # the sentinel last, byte-identical to a retrained one
    print(f"train_epoch {spec['run']}/{epoch}: restored from {source} (same cache, previous epoch, params and code)")
    return True


def mirror(out_dir: str | Path, store: str | Path, run: str, epoch: int) -> Path:
    """Copy a completed epoch into the store: its files first, its sentinel last."""
    out_dir, target = Path(out_dir), stored_epoch(store, run, epoch)
    target.mkdir(parents=True, exist_ok=True)
    (target / SENTINEL_NAME).unlink(missing_ok=True)  # an entry being replaced is never complete-looking
    for name in EPOCH_FILES:
        _copy(out_dir / name, target / name)
    _copy(out_dir / SENTINEL_NAME, target / SENTINEL_NAME)
    return target
