"""A run's sweep: the grid of head-training settings its members are, their names, and the epoch bundle.

`runs.<run>.sweep: {train.lr: [0.003, 0.01], train.weight_decay: [0.0, 0.01]}` declares members = the
grid's points in a stable order: itertools.product over the keys in the order written, each key's
values in the order written (the last key varies fastest). A member is named by its settings
("lr=0.003,weight_decay=0.0"), never by its position, and everything it computes (init, dropout,
optimizer, memo entry) derives from its own train settings, so adding or removing grid values
changes no other member. A run without `sweep` is the one-member sweep of its own `train` block,
and its epoch folder is exactly a plain run's (checkpoint.pt, metrics.json).

An epoch of a sweep of K > 1 members writes checkpoint.pt as an uncompressed zip (the bundle):
`<member>/checkpoint.pt`, `<member>/metrics.json` and `<member>/sentinel.json` per member, each the
exact bytes the member's epoch would have as a plain run of the same name (`unzip -p` + `cmp`).
"""

from __future__ import annotations

import copy
import io
import itertools
import zipfile
from pathlib import Path
from typing import Any

from rffm.errors import ConfigError
from rffm.records.layout import CHECKPOINT_NAME, METRICS_NAME, SENTINEL_NAME

# Keys a sweep may vary: those each head owns. Not batch_size or seed: members share the batches
# (one gather feeds every head) and the batch order comes from the run's seed.
SWEEP_KEYS = (
    "train.lr",
    "train.tail.lr",
    "train.weight_decay",
    "train.label_smoothing",
    "train.warmup_steps",
    "train.lr_decay_per_epoch",
    "train.head.hidden",
    "train.head.dropout",
    "train.head.taps",
)
# Keys a reference's sweep may vary (references.<id>.sweep): those of the CNN's train block that a run's sweep varies,
# and its epochs (each member trains alone, its one-cycle schedule over its own epochs). Not batch_size or seed, as runs.
REFERENCE_SWEEP_KEYS = ("train.lr", "train.weight_decay", "train.epochs")
ORDER_TEXT = "itertools.product over the sweep's keys in the order written, values in the order written (last key fastest)"
BUNDLE_FORMAT = "rffm-sweep-epoch/1"
MEMBER_FILES = (CHECKPOINT_NAME, METRICS_NAME, SENTINEL_NAME)
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed: the bundle's bytes depend on its content only


def grid(spec: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """The sweep as (dotted key, values) pairs in the order written (a spec carries it as a list of pairs)."""
    sweep = spec.get("sweep") or []
    return [(key, list(values)) for key, values in (sweep.items() if isinstance(sweep, dict) else sweep)]


def member_name(settings: dict[str, Any]) -> str:
    """A member's readable, stable name: its swept settings without the `train.` prefix (a list of taps joined by +)."""
    shown = {key: "+".join(map(str, value)) if isinstance(value, list) else value for key, value in settings.items()}
    return ",".join(f"{key.removeprefix('train.')}={value}" for key, value in shown.items()) or "default"


def members(spec: dict[str, Any], section: str = "runs") -> list[dict[str, Any]]:
    """The sweep's members in grid order: [{name, settings: {dotted key: value}}]; one member without a sweep.
    `section`: runs, or references (whose sweep varies REFERENCE_SWEEP_KEYS)."""
    pairs = grid(spec)
    allowed = REFERENCE_SWEEP_KEYS if section == "references" else SWEEP_KEYS
    where = f"{section}.{spec['run']}.sweep"
    for key, values in pairs:
        if key not in allowed:
            raise ConfigError(f"{where}: {key!r} cannot be swept. Fix: use one of {', '.join(allowed)}.")
        if not values:
            raise ConfigError(f"{where}.{key}: no values. Fix: list at least one value, or drop the key.")
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"{where}.{key}: a value is listed twice. Fix: list each value once.")
    keys = [key for key, _ in pairs]
    points = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(values for _, values in pairs))]
    return [{"name": member_name(point), "settings": point} for point in points]


def member_train(train: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """A run's train block with one member's settings in place (`train.head.hidden` sets train["head"]["hidden"])."""
    train = copy.deepcopy(train)
    for key, value in settings.items():
        *path, last = key.split(".")[1:]
        target = train
        for part in path:
            target = target.setdefault(part, {})
        target[last] = value
    return train


def member_spec(spec: dict[str, Any], member: dict[str, Any]) -> dict[str, Any]:
    """The spec of the plain (sweep-less) run that is this member: same name, the member's train block."""
    plain = {key: value for key, value in spec.items() if key != "sweep"}
    return {**plain, "train": member_train(spec["train"], member["settings"])}


def is_bundle(spec: dict[str, Any]) -> bool:
    """Whether the run's epochs write the sweep bundle (K > 1) rather than a plain epoch folder."""
    return len(members(spec)) > 1


def plan_label(spec: dict[str, Any], section: str = "runs") -> str:
    """The members as `snakemake -n` shows them in the epoch (or train_reference) job's params (empty for a plain run)."""
    found = members(spec, section)
    return " ".join(f"[{m['name']}]" for m in found) if len(found) > 1 else ""


def check_planned(spec: dict[str, Any], planned: str, section: str) -> None:
    """Stop when the plan named other members than this code computes from the spec (a planner of other code)."""
    computed = plan_label(spec, section)
    if planned != computed:
        raise ConfigError(f"{section}.{spec['run']}.sweep: planned members {planned!r}, computed {computed!r}. Fix: rerun snakemake.")


# ---- the bundle: one zip, per member the files of its plain epoch ----


def write_bundle(files: dict[str, dict[str, bytes]]) -> bytes:
    """The bundle's bytes for {member: {file name: bytes}} (members in the order given)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as bundle:
        bundle.comment = BUNDLE_FORMAT.encode()
        for member, named in files.items():
            for name in MEMBER_FILES:
                info = zipfile.ZipInfo(f"{member}/{name}", date_time=_ZIP_TIME)
                info.external_attr = 0o644 << 16
                bundle.writestr(info, named[name])
    return buffer.getvalue()


def read_member(path: str | Path, member: str, name: str) -> bytes:
    """One file of one member from an epoch's checkpoint.pt bundle."""
    with zipfile.ZipFile(path) as bundle:
        try:
            return bundle.read(f"{member}/{name}")
        except KeyError:
            raise ConfigError(f"{path}: holds no member {member!r} (it holds {bundle_members(path)})") from None


def bundle_members(path: str | Path) -> list[str]:
    """The member names a bundle holds, in its order."""
    with zipfile.ZipFile(path) as bundle:
        return list(dict.fromkeys(name.split("/")[0] for name in bundle.namelist()))


# ---- memory: K heads side by side ----


def check_memory(k: int, head_params: int, batch_bytes: int, available: int | None, where: str) -> int:
    """Bytes the members need (per head: weights, gradients, two AdamW moments, FP32; one shared batch); refuse if over `available`."""
    needed = k * head_params * 4 * 4 + batch_bytes
    if available is not None and needed > available:
        raise ConfigError(
            f"{where}: {k} heads x {head_params} parameters x 16 bytes + a {batch_bytes} byte batch = {needed} bytes, "
            f"more than the {available} bytes available. Fix: fewer sweep values, a smaller train.head.hidden or train.batch_size."
        )
    return needed
