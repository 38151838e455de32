"""An epoch checkpoint store outside the results tree, so a relaunch after preemption resumes from completed epochs.

When `rffm posttrain` runs with AIP_CHECKPOINT_DIR, every completed epoch is mirrored to
<store>/runs/<run>/epochs/<epoch>/ (files first, sentinel last). A relaunch on a fresh machine
has lost the node-local cache, so Snakemake rebuilds it and reruns every epoch after it; an
epoch whose stored sentinel has the same identity (cache, previous epoch, params and code) as
this one is then restored from the store instead of trained. Epochs are deterministic, so
restored and retrained bytes are the same; any mismatch means "train".
"""

from __future__ import annotations

from pathlib import Path

from rffm.errors import IntegrityError
from rffm.records.files import atomic_write_bytes, read_json
from rffm.records.layout import PROVENANCE_NAME, SENTINEL_NAME
from rffm.records.sentinel import read_sentinel, sentinel_problems
from rffm.records.step import Step


def stored_epoch(store: str | Path, run: str, epoch: int) -> Path:
    """Where an epoch lives in the store."""
    return Path(store) / "runs" / run / "epochs" / str(epoch)


def _copy(source: Path, target: Path) -> None:
    atomic_write_bytes(target, source.read_bytes())


def restore(store: str | Path, step: Step, names: tuple[str, ...]) -> bool:
    """Restore the step's outputs from the store when the stored epoch has this step's identity; True if restored."""
    source = stored_epoch(store, step.key["run"], step.key["epoch"])
    try:
        body = read_sentinel(source / SENTINEL_NAME)
    except IntegrityError:
        return False  # nothing (complete) stored for this epoch
    identity = step.identity()
    if {field: body.get(field) for field in identity} != identity or sentinel_problems(source / SENTINEL_NAME):
        return False
    for name in names:
        _copy(source / name, step.out_dir / name)
        step.output(name, body["outputs"][name])
    step.facts.update({key: value for key, value in body.items() if key not in identity and key != "outputs"})
    computed = read_json(source / PROVENANCE_NAME) if (source / PROVENANCE_NAME).exists() else None
    step.details = {"epoch": step.key["epoch"], "restored_from": str(source), "computed_by": computed}
    print(f"{step.rule} {step.key['run']}/{step.key['epoch']}: restored from {source} (same cache, previous epoch, params and code)")
    return True


def mirror(out_dir: str | Path, store: str | Path, run: str, epoch: int) -> Path:
    """Copy a completed epoch into the store: its files first, its sentinel last."""
    out_dir, target = Path(out_dir), stored_epoch(store, run, epoch)
    target.mkdir(parents=True, exist_ok=True)
    (target / SENTINEL_NAME).unlink(missing_ok=True)  # an entry being replaced is never complete-looking
    for name in ("checkpoint.pt", "metrics.json", PROVENANCE_NAME):
        _copy(out_dir / name, target / name)
    _copy(out_dir / SENTINEL_NAME, target / SENTINEL_NAME)
    return target
