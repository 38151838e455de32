"""The members of one epoch: who they are, where each resumes from, which the memo restores, how they are trained
together from one pass over the cache, and how a sweep's members are bundled into the epoch's files.

A plain run is one member, and that member is the epoch's step itself. Each member of a sweep of K > 1 is the step its
plain run would be (same key, params, code and inputs, its own previous epoch) in a folder of its own, so a grid that
gains a value restores the old members from the memo and trains only the new ones.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rffm.backbone_kinds import NATIVE
from rffm.data.cache_format import recipe
from rffm.data.cache_local import ensure
from rffm.data.cache_reader import open_cache
from rffm.errors import IntegrityError
from rffm.model.classifier import normalisation
from rffm.model.metrics import sentinel_metrics
from rffm.records import memo
from rffm.records.files import atomic_torch_save, atomic_write_bytes, atomic_write_json, sha256_bytes
from rffm.records.layout import BACKBONE_NAME, CHECKPOINT_NAME, EPOCH_FILES, METRICS_NAME, SENTINEL_NAME
from rffm.records.step import Step
from rffm.records.store import Store, given_store, publish_trace
from rffm.runtime.profiling import PhaseTimes
from rffm.training import sweep
from rffm.training.epoch import train_heads, train_options


@dataclass
class NodeCache:
    """The hidden states an epoch reads: the consumed cache record, and this node's scratch with the options that
    build the cache there when the node has none."""

    record_dir: Path
    scratch: str | Path
    build_options: dict[str, Any]
    record: dict[str, Any] = field(default_factory=dict)


@dataclass
class Member:
    """One member's epoch: its settings, its step, and the epoch it resumes from (None at epoch 1)."""

    name: str
    settings: dict[str, Any]
    options: dict[str, Any]
    step: Step
    previous: bytes | None
    previous_path: str
    previous_sentinel: Path | None
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_train(self) -> dict[str, Any]:
        """The member as rffm.training.epoch.train_heads takes it."""
        fields = ("name", "options", "previous", "previous_path", "previous_sentinel")
        return {key: getattr(self, key) for key in fields} | {"params_sha256": self.step.identity()["params_sha256"]}


@dataclass
class Epoch:
    """What every member of one epoch shares: the run, the epoch number, the previous epoch's folder and the cache."""

    spec: dict[str, Any]
    number: int
    previous_dir: Path | None
    cache: NodeCache

    def previous_sentinel(self) -> Path | None:
        """The previous epoch's sentinel (None at epoch 1)."""
        return self.previous_dir / SENTINEL_NAME if self.number > 1 else None


def step_params(spec: dict[str, Any]) -> dict[str, Any]:
    """The epoch step's params: the run and its train options (a sweep's: also its grid)."""
    bundle = {"sweep": sweep.grid(spec)} if sweep.is_bundle(spec) else {}
    return {"run": spec["run"], "train": train_options(spec), **bundle}


def plain_member(epoch: Epoch, step: Step) -> Member:
    """A plain run's one member: the epoch's step itself, resuming from the previous epoch's checkpoint."""
    (only,) = sweep.members(epoch.spec)
    previous = (epoch.previous_dir / CHECKPOINT_NAME).read_bytes() if epoch.number > 1 else None
    where = f"{epoch.previous_dir}/{CHECKPOINT_NAME}"
    return Member(only["name"], only["settings"], train_options(epoch.spec), step, previous, where, epoch.previous_sentinel())


def sweep_member(epoch: Epoch, step: Step, member: dict[str, Any], folder: Path) -> Member:
    """A sweep member ({name, settings}) as the step its plain run would be, in `folder`, resuming from its part of the
    previous epoch's bundle."""
    name = member["name"]
    options = train_options(sweep.member_spec(epoch.spec, member))
    member_step = step.child(folder, {"run": epoch.spec["run"], "train": options})
    member_step.details["epoch"] = epoch.number
    previous = None
    if epoch.number > 1:
        bundle = epoch.previous_dir / CHECKPOINT_NAME
        previous = sweep.read_member(bundle, name, CHECKPOINT_NAME)
        path = step.inputs["previous_epoch"]["path"]
        member_step.inputs["previous_epoch"] = {"path": path, "sha256": sha256_bytes(sweep.read_member(bundle, name, SENTINEL_NAME))}
    where = f"{epoch.previous_dir}/{CHECKPOINT_NAME} (member {name})"
    return Member(name, member["settings"], options, member_step, previous, where, epoch.previous_sentinel())


def train_plain(epoch: Epoch, step: Step, device: str, results: Store | None, profile_batches: int) -> list[Member]:
    """Train a plain run's epoch into its step's folder; the one member trained."""
    member = plain_member(epoch, step)
    train(epoch, [member], step, device, results, profile_batches)
    return [member]


def train_sweep(
    epoch: Epoch, step: Step, memo_store: Store | None, device: str, results: Store | None, profile_batches: int
) -> list[Member]:
    """A sweep's epoch: restore each member the memo holds, train the others together, keep them, bundle them all into
    the step's files; the members trained."""
    run = epoch.spec["run"]
    with tempfile.TemporaryDirectory(prefix="rffm-members-") as folder:
        group = [sweep_member(epoch, step, m, Path(folder) / f"m{i}") for i, m in enumerate(sweep.members(epoch.spec))]
        todo = [m for m in group if not (memo_store is not None and memo.restore(memo_store, m.step, EPOCH_FILES))]
        for m in group:
            print(f"{step.rule} {run}/{epoch.number}: member {m.name} {'trained' if m in todo else 'restored from the memo'}")
        restored = [m.name for m in group if m not in todo]
        step.details.update({"members_restored": restored} if restored else {})
        if todo:
            step.details["members_trained"] = [m.name for m in todo]
            train(epoch, todo, step, device, results, profile_batches)
        for m in group:
            m.step.close()
            if m in todo and memo_store is not None:
                memo.save(memo_store, m.step, EPOCH_FILES)
        write_bundle(step, group, epoch.number)
    return todo


def train(epoch: Epoch, todo: list[Member], step: Step, device: str, results: Store | None, profile_batches: int) -> None:
    """Open the cache (built first when this node has none), train the members in one pass over it, save each."""
    cache = epoch.cache
    step.device = torch.device(device)
    phases = PhaseTimes()
    directory, built = ensure(cache.record, cache.record_dir, cache.scratch, {**cache.build_options, "device": device}, phases)
    if built:
        step.details["cache_build"] = {key: value for key, value in built.items() if key != "meta"}
    splits, meta = open_cache(directory, recipe(cache.record), step.rule)
    if meta["backbone_fingerprint"] != cache.record["backbone_fingerprint"]:
        raise IntegrityError(f"{directory}/meta.json: backbone fingerprint disagrees with the cache record {cache.record_dir}")
    native = cache.record["backbone"]["source"] in NATIVE
    normalised = normalisation(cache.record["encoder"]["spec"]["adapter"], native)  # the model card states it
    with tempfile.TemporaryDirectory() as traces:
        trained, details = train_heads(
            [m.to_train() for m in todo],
            splits,
            meta,
            epoch.number,
            step.device,
            run=epoch.spec["run"],
            sweep_run=sweep.is_bundle(epoch.spec),
            phases=phases,
            trace_dir=Path(traces) if profile_batches else None,
            profile_batches=profile_batches,
            backbone_file=(cache.record_dir / cache.record["inputs"]["backbone"]["path"]).parent / BACKBONE_NAME if native else None,
        )
        step.details.update(details)
        for m, result in zip(todo, trained, strict=True):
            save(m, result, meta["backbone_fingerprint"], step)
            m.step.facts["input_normalisation"] = normalised
        for trace in sorted(Path(traces).glob("*.trace.json")):
            publish_trace(given_store(results, step.rule), epoch.spec["run"], trace)
    for m in todo:
        if details["labels"]["labels_per_class_snr"] is not None:  # label-scarce: the rows it read labels of
            m.step.facts["labels"] = details["labels"]


def save(member: Member, result: dict[str, Any], backbone_fingerprint: str, step: Step) -> None:
    """Write a trained member's checkpoint and metrics into its step and record them there."""
    out = member.step
    atomic_torch_save(out.out_dir / CHECKPOINT_NAME, result["checkpoint"])
    atomic_write_json(out.out_dir / METRICS_NAME, result["metrics"])
    for name in EPOCH_FILES:
        out.output(name)
    member.metrics = result["metrics"]
    out.device = step.device
    out.facts.update({"backbone_fingerprint": backbone_fingerprint, "metrics": sentinel_metrics(result["metrics"])})
    out.details["phases"] = step.details["phases"]


def write_bundle(step: Step, group: list[Member], epoch: int) -> None:
    """checkpoint.pt: every member's files (as its plain epoch has them); metrics.json: every member's metrics."""
    files = {m.name: {name: (m.step.out_dir / name).read_bytes() for name in sweep.MEMBER_FILES} for m in group}
    atomic_write_bytes(step.out_dir / CHECKPOINT_NAME, sweep.write_bundle(files))
    every = {m.name: json.loads(files[m.name][METRICS_NAME]) for m in group}  # as each member wrote them (or the memo kept)
    atomic_write_json(step.out_dir / METRICS_NAME, {"epoch": epoch, "members": every})
    for name in EPOCH_FILES:
        step.output(name)
    if "labels" in group[0].step.facts:  # members share the labelled subset
        step.facts["labels"] = group[0].step.facts["labels"]
    members = {
        m.name: {"settings": m.settings, "metrics": m.step.facts["metrics"], "sentinel_sha256": sha256_bytes(files[m.name][SENTINEL_NAME])}
        for m in group
    }
    first = group[0].step.facts
    step.facts.update({"backbone_fingerprint": first["backbone_fingerprint"], "input_normalisation": first["input_normalisation"]})
    step.facts["members"] = members
