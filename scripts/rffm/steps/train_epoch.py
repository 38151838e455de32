"""train_epoch: one epoch of every member of a run's sweep on cached hidden states, resuming exactly.

A run without `sweep` is one member and its epoch folder is a plain epoch (checkpoint.pt,
metrics.json). A sweep of K > 1 members (rffm.training.sweep) trains them together from one pass
over the cache: each batch is gathered and restored to FP32 once and fed to every head in grid
order; each member keeps its own init, dropout stream (the torch RNG state is switched per member),
optimizer and schedule. Each member is also a step of its own (its identity is the one the same
member would have as a plain run): its memo entry is restored when it exists, so a grid that gains
a value trains only the new members, and the epoch's checkpoint.pt bundles every member's files.
The loop itself is rffm.training.epoch.train_heads; this step restores, saves and records.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from rffm.data.cache_format import recipe
from rffm.data.cache_local import ensure
from rffm.data.cache_reader import open_cache
from rffm.errors import ConfigError, IntegrityError
from rffm.records import memo
from rffm.records.files import atomic_torch_save, atomic_write_bytes, atomic_write_json, sha256_bytes
from rffm.records.layout import SENTINEL_NAME
from rffm.records.step import Step
from rffm.records.store import given_store, open_store, publish_trace
from rffm.runtime import tensorboard
from rffm.runtime.profiling import PhaseTimes
from rffm.training import sweep
from rffm.training.epoch import train_heads, train_options

RULE = "train_epoch"
OUTPUTS = ("checkpoint.pt", "metrics.json")


def run(
    spec: dict[str, Any],
    cache_record_dir: str | Path,
    epoch: int,
    previous_dir: str | Path | None,
    out_dir: str | Path,
    *,
    scratch: str | Path,
    cache_options: dict[str, Any],
    device: str = "cpu",
    store: str | Path | None = None,
    memo_store: str | Path | None = None,
    profile_batches: int = 0,
) -> Path:
    """Train epoch `epoch` (1-based) of every member and write checkpoint.pt, metrics.json and the sentinel.

    An epoch (or a member's epoch) kept in the memo (rffm.records.memo) with this identity is restored
    instead of trained; a trained one is kept there. The hidden-state cache is read from this node's scratch, built first if missing.
    """
    members = sweep.members(spec)
    if len(members) == 1:  # the plain epoch: one member, its own folder
        spec = sweep.member_spec(spec, members[0])
    bundle = len(members) > 1
    cache_record_dir = Path(cache_record_dir)
    results = open_store(store) if store else None
    kept = open_store(memo_store) if memo_store else results
    options = train_options(spec)
    params = {"run": spec["run"], "train": options, **({"sweep": sweep.grid(spec)} if bundle else {})}
    with Step(RULE, out_dir, key={"run": spec["run"], "epoch": epoch}, params=params) as step:
        step.details["epoch"] = epoch
        record = step.consume("cache", cache_record_dir / SENTINEL_NAME)
        if epoch > 1:
            step.consume("previous_epoch", Path(previous_dir) / SENTINEL_NAME, ["checkpoint.pt"])
        restored = kept is not None and memo.restore(kept, step, OUTPUTS)
        if not restored:
            with tempfile.TemporaryDirectory(prefix="rffm-members-") as scratch_dir:
                group = member_steps(spec, members, step, epoch, previous_dir, Path(scratch_dir), bundle)
                # a plain epoch's one member is the step itself, whose memo entry was looked up above
                todo = [m for m in group if not (bundle and kept is not None and memo.restore(kept, m["step"], OUTPUTS))]
                for m in group:
                    if m not in todo:
                        step.details.setdefault("members_restored", []).append(m["name"])
                for m in group if bundle else ():
                    print(f"{RULE} {spec['run']}/{epoch}: member {m['name']} {'trained' if m in todo else 'restored from the memo'}")
                if todo:
                    step.details["members_trained"] = [m["name"] for m in todo]
                    where = {"record": record, "record_dir": cache_record_dir, "scratch": scratch, "cache_options": cache_options}
                    train_members(spec, todo, where, epoch, step, device, results, profile_batches)
                for m in group:
                    m["step"].__exit__(None, None, None)  # the member's provenance and sentinel
                    if bundle and m in todo and kept is not None:
                        memo.save(kept, m["step"], OUTPUTS)
                if bundle:
                    write_bundle(step, group, epoch)
                else:
                    for name in OUTPUTS:
                        atomic_write_bytes(step.out_dir / name, (group[0]["step"].out_dir / name).read_bytes())
                        step.output(name, group[0]["step"].outputs[name])
                    step.facts.update(group[0]["step"].facts)
                    step.details.update({k: v for k, v in group[0]["step"].details.items() if k not in step.details})
    if not restored:
        if kept is not None:
            memo.save(kept, step, OUTPUTS)
        for m in group:  # optional side output, after the epoch is complete
            if m in todo:
                tensorboard.log_epoch(spec["run"] if not bundle else f"{spec['run']}/{m['name']}", m["step"].facts["metrics"])
    return step.sentinel


def check_planned_members(spec: dict[str, Any], planned: str) -> None:
    """Stop when the plan named other members than this code computes from the spec (a planner of other code)."""
    computed = sweep.plan_label(spec)
    if planned != computed:
        raise ConfigError(f"runs.{spec['run']}.sweep: planned members {planned!r}, computed {computed!r}. Fix: rerun snakemake.")


def member_steps(spec, members, step: Step, epoch: int, previous_dir, scratch_dir: Path, bundle: bool) -> list[dict[str, Any]]:
    """Each member as the step its plain run would be: same key, params, code and input paths, its own previous epoch."""
    group = []
    for member in members:
        plain = sweep.member_spec(spec, member)
        options = train_options(plain)
        member_step = Step(RULE, scratch_dir / f"m{len(group)}", key=dict(step.key), params={"run": spec["run"], "train": options})
        member_step.__enter__()
        member_step.device = step.device
        member_step.inputs = {"cache": step.inputs["cache"]}
        previous = None
        if epoch > 1:
            checkpoint = Path(previous_dir) / "checkpoint.pt"
            if bundle:
                previous_sentinel = sweep.read_member(checkpoint, member["name"], SENTINEL_NAME)
                previous = sweep.read_member(checkpoint, member["name"], "checkpoint.pt")
            else:
                previous_sentinel = (Path(previous_dir) / SENTINEL_NAME).read_bytes()
                previous = checkpoint.read_bytes()
            path = step.inputs["previous_epoch"]["path"]
            member_step.inputs["previous_epoch"] = {"path": path, "sha256": sha256_bytes(previous_sentinel)}
        member_step.details["epoch"] = epoch
        where = f"{previous_dir}/checkpoint.pt" + (f" (member {member['name']})" if bundle else "")
        resumed = {
            "previous": previous,
            "previous_path": where,
            "previous_sentinel": Path(previous_dir) / SENTINEL_NAME if epoch > 1 else None,
        }
        group.append({**member, "spec": plain, "options": options, "step": member_step, **resumed})
    return group


def write_bundle(step: Step, group: list[dict[str, Any]], epoch: int) -> None:
    """checkpoint.pt: every member's files (as its plain epoch has them); metrics.json: every member's metrics."""
    files = {m["name"]: {name: (m["step"].out_dir / name).read_bytes() for name in sweep.MEMBER_FILES} for m in group}
    atomic_write_bytes(step.out_dir / "checkpoint.pt", sweep.write_bundle(files))
    table = {"epoch": epoch, "members": {m["name"]: m["step"].facts["metrics"] for m in group}}
    atomic_write_json(step.out_dir / "metrics.json", table)
    for name in OUTPUTS:
        step.output(name)
    if "labels" in group[0]["step"].facts:  # members share the labelled subset
        step.facts["labels"] = group[0]["step"].facts["labels"]
    step.facts.update(
        {
            "backbone_fingerprint": group[0]["step"].facts["backbone_fingerprint"],
            "members": {
                m["name"]: {
                    "settings": m["settings"],
                    "metrics": m["step"].facts["metrics"],
                    "sentinel_sha256": sha256_bytes(files[m["name"]][SENTINEL_NAME]),
                }
                for m in group
            },
        }
    )


def train_members(spec, todo, where: dict[str, Any], epoch, step: Step, device, results, profile_batches) -> None:
    """Open the cache (built first when this node has none), train the members that were not restored, save each."""
    record, cache_record_dir = where["record"], where["record_dir"]
    scratch, cache_options = where["scratch"], where["cache_options"]
    step.device = torch.device(device)
    phases = PhaseTimes()
    directory, built = ensure(record, cache_record_dir, scratch, {**cache_options, "device": device}, phases)
    if built:
        step.details["cache_build"] = {key: value for key, value in built.items() if key != "meta"}
    splits, meta = open_cache(directory, recipe(record), RULE)
    if meta["backbone_fingerprint"] != record["backbone_fingerprint"]:
        raise IntegrityError(f"{directory}/meta.json: backbone fingerprint disagrees with the cache record {cache_record_dir}")
    members = [
        {key: m[key] for key in ("name", "options", "previous", "previous_path", "previous_sentinel")}
        | {"params_sha256": m["step"].identity()["params_sha256"]}
        for m in todo
    ]
    with tempfile.TemporaryDirectory() as traces:
        trace_dir = Path(traces) if profile_batches else None
        trained, details = train_heads(
            members,
            splits,
            meta,
            epoch,
            step.device,
            run=spec["run"],
            sweep_run=sweep.is_bundle(spec),
            phases=phases,
            trace_dir=trace_dir,
            profile_batches=profile_batches,
        )
        step.details.update(details)
        for m, result in zip(todo, trained, strict=True):
            atomic_torch_save(m["step"].out_dir / "checkpoint.pt", result["checkpoint"])
            atomic_write_json(m["step"].out_dir / "metrics.json", result["metrics"])
            for name in OUTPUTS:
                m["step"].output(name)
            m["metrics"] = result["metrics"]
        for trace in sorted(Path(traces).glob("*.trace.json")):
            publish_trace(given_store(results, RULE), spec["run"], trace)
    for m in todo:
        m["step"].device = step.device
        m["step"].facts.update({"backbone_fingerprint": meta["backbone_fingerprint"], "metrics": m["metrics"]})
        m["step"].details["phases"] = step.details["phases"]
        if details["labels"]["labels_per_class_snr"] is not None:  # label-scarce: the rows it read labels of
            m["step"].facts["labels"] = details["labels"]
