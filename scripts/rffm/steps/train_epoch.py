"""train_epoch: one epoch of every member of a run's sweep on cached hidden states, resuming exactly.

A run without `sweep` is one member and its epoch folder is a plain epoch (checkpoint.pt,
metrics.json). A sweep of K > 1 members (rffm.training.sweep) trains them together from one pass
over the cache: each batch is gathered and restored to FP32 once and fed to every head in grid
order; each member keeps its own init, dropout stream (the torch RNG state is switched per member),
optimizer and schedule. Each member is also a step of its own (its identity is the one the same
member would have as a plain run): its memo entry is restored when it exists, so a grid that gains
a value trains only the new members, and the epoch's checkpoint.pt bundles every member's files.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rffm.data import cache
from rffm.data.cache import prefetched
from rffm.errors import ConfigError, IntegrityError
from rffm.model import head as head_model
from rffm.records import memo
from rffm.records.files import atomic_torch_save, atomic_write_bytes, atomic_write_json, sha256_bytes
from rffm.records.layout import SENTINEL_NAME
from rffm.records.step import Step
from rffm.records.store import given_store, open_store, publish_trace
from rffm.runtime import tensorboard
from rffm.runtime.profiling import BatchTracer, PhaseTimes
from rffm.runtime.progress import Progress
from rffm.training import sweep
from rffm.training.epoch import evaluate_members, make_head, make_optimizer, train_options

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
    instead of trained; a trained one is kept there. The cache is read from this node's memo, built first if missing.
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
        group.append({**member, "spec": plain, "options": options, "step": member_step, "previous": previous, "previous_path": where})
    return group


def write_bundle(step: Step, group: list[dict[str, Any]], epoch: int) -> None:
    """checkpoint.pt: every member's files (as its plain epoch has them); metrics.json: every member's metrics."""
    files = {m["name"]: {name: (m["step"].out_dir / name).read_bytes() for name in sweep.MEMBER_FILES} for m in group}
    atomic_write_bytes(step.out_dir / "checkpoint.pt", sweep.write_bundle(files))
    table = {"epoch": epoch, "members": {m["name"]: m["step"].facts["metrics"] for m in group}}
    atomic_write_json(step.out_dir / "metrics.json", table)
    for name in OUTPUTS:
        step.output(name)
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
    """Open the cache (built first when this node has none) and train the members that were not restored."""
    record, cache_record_dir = where["record"], where["record_dir"]
    scratch, cache_options = where["scratch"], where["cache_options"]
    step.device = torch.device(device)
    phases = PhaseTimes()
    directory, built = cache.ensure(record, cache_record_dir, scratch, {**cache_options, "device": device}, phases)
    if built:
        step.details["cache_build"] = {key: value for key, value in built.items() if key != "meta"}
    splits, meta = cache.open_memo(directory, cache.recipe(record), RULE)
    if meta["backbone_fingerprint"] != record["backbone_fingerprint"]:
        raise IntegrityError(f"{directory}/meta.json: backbone fingerprint disagrees with the cache record {cache_record_dir}")
    with tempfile.TemporaryDirectory() as traces:
        trace_dir = Path(traces) if profile_batches else None
        train(spec, todo, splits, meta, epoch, step, step.device, trace_dir, profile_batches, phases)
        for trace in sorted(Path(traces).glob("*.trace.json")):
            publish_trace(given_store(results, RULE), spec["run"], trace)
    for m in todo:
        m["step"].device = step.device
        m["step"].facts.update({"backbone_fingerprint": meta["backbone_fingerprint"], "metrics": m["metrics"]})
        m["step"].details["phases"] = step.details["phases"]


def resume(m: dict[str, Any], meta, epoch: int, steps_per_epoch: int, device) -> None:
    """A member's head, optimizer, schedule and RNG state: fresh from its seed at epoch 1, else its previous checkpoint."""
    options = m["options"]
    m["params_sha256"] = m["step"].identity()["params_sha256"]
    if epoch == 1:
        torch.manual_seed(int(options["seed"]))
    m["head"] = make_head(meta, options).to(device)
    m["optimizer"], m["scheduler"] = make_optimizer(m["head"], options, steps_per_epoch)
    if epoch == 1:
        m["rng"] = torch.get_rng_state()
    else:
        state = torch.load(_bytes_io(m["previous"]), map_location=device, weights_only=True)
        if state["params_sha256"] != m["params_sha256"] or state["epoch"] != epoch - 1:
            raise IntegrityError(
                f"{m['previous_path']} is epoch {state['epoch']} of different training params; "
                f"epoch {epoch} must resume from epoch {epoch - 1} of the same run. Fix: rerun snakemake, which retrains from epoch 1."
            )
        if state["backbone_fingerprint"] != meta["backbone_fingerprint"]:
            raise IntegrityError(f"{m['previous_path']} was trained on another backbone than the cache it reads")
        m["head"].load_state_dict(state["head"])
        m["optimizer"].load_state_dict(state["optimizer"])
        m["scheduler"].load_state_dict(state["scheduler"])
        m["rng"] = state["torch_rng"].cpu()
    if device.type == "cuda":  # CUDA dropout draws from the device generator: one stream per member, from its seed and the epoch
        with torch.random.fork_rng(devices=[device]):
            torch.cuda.manual_seed(int(options["seed"]) * 100003 + epoch)
            m["cuda_rng"] = torch.cuda.get_rng_state(device)


def _bytes_io(data: bytes):
    import io

    return io.BytesIO(data)


def available_memory(device) -> int | None:
    """Free bytes where the heads live (None when unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:  # MemAvailable counts reclaimable page cache (the cache's own mapped pages among it), unlike free pages
        meminfo = Path("/proc/meminfo").read_text()
        return int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemAvailable:"))) * 1024
    except (OSError, StopIteration, ValueError):
        return None


def train(spec, todo, splits, meta, epoch, step: Step, device, profile_dir, profile_batches, phases) -> None:
    """The epoch itself: resume every member; one pass over the train split feeding each batch to all; validate; save."""
    train_split, val_split = splits["train"], splits["val"]
    batch_size = int(todo[0]["options"]["batch_size"])
    seed = int(todo[0]["options"]["seed"])  # the run's: members share batch_size and seed (not sweepable)
    steps_per_epoch = -(-len(train_split) // batch_size)
    for m in todo:
        resume(m, meta, epoch, steps_per_epoch, device)
    head_params = max(sum(p.numel() for p in m["head"].parameters()) for m in todo)
    step.details["memory_bytes"] = sweep.check_memory(
        len(todo), head_params, batch_size * train_split.row_bytes * 2, available_memory(device), f"runs.{spec['run']}.sweep"
    )

    order = np.random.default_rng([seed, epoch]).permutation(len(train_split))
    batches = [order[start : start + batch_size] for start in range(0, len(train_split), batch_size)]
    for m in todo:
        m["head"].train()
        m["total_loss"], m["correct"] = 0.0, 0
    profile_dir = Path(profile_dir) if profile_dir and profile_batches else None
    tracer = BatchTracer(profile_dir / f"epoch{epoch}_train.trace.json" if profile_dir else None, profile_batches, phases)
    progress = Progress(f"{RULE} {spec['run']}/{epoch}", total=steps_per_epoch, unit="batch")
    bytes_read = 0
    for hidden, labels in prefetched(train_split, batches, device, phases):
        bytes_read += len(labels) * train_split.row_bytes
        with phases.phase("head"):
            for m in todo:  # one gathered batch, every head in grid order, each with its own RNG stream
                torch.set_rng_state(m["rng"])
                if device.type == "cuda":
                    torch.cuda.set_rng_state(m["cuda_rng"], device)
                logits = m["head"](hidden)
                loss = F.cross_entropy(logits, labels, label_smoothing=m["options"]["label_smoothing"])
                m["optimizer"].zero_grad(set_to_none=True)
                loss.backward()
                m["optimizer"].step()
                m["scheduler"].step()
                m["total_loss"] += loss.item() * len(labels)
                m["correct"] += int((logits.argmax(dim=1) == labels).sum())
                m["rng"] = torch.get_rng_state()
                if device.type == "cuda":
                    m["cuda_rng"] = torch.cuda.get_rng_state(device)
        tracer.step()
        progress.update(1, loss=f"{loss.item():.4f}")
    tracer.close()
    progress.close()
    for m in todo:
        head, total_loss = m["head"], m["total_loss"]
        if not math.isfinite(total_loss) or not all(bool(torch.isfinite(p).all()) for p in head.parameters()):
            where = f"runs.{spec['run']}.train" + (f" (sweep member {m['name']})" if len(sweep.members(spec)) > 1 else "")
            raise ConfigError(
                f"{where}: epoch {epoch} diverged (train loss {total_loss / len(train_split)}, non-finite weights); "
                f"nothing of it is kept, so it can never be selected or qualified. Fix: lower runs.{spec['run']}.train.lr "
                "(or raise warmup_steps, or drop that sweep value) and rerun snakemake."
            )
    val_tracer = BatchTracer(profile_dir / f"epoch{epoch}_val.trace.json" if profile_dir else None, profile_batches, phases)
    validations = evaluate_members([m["head"] for m in todo], val_split, max(batch_size, 512), device, phases, val_tracer)
    val_tracer.close()
    step.details["cache_bytes_read"] = bytes_read + len(val_split) * val_split.row_bytes
    step.details["phases"] = phases.as_dict()
    for m, validation in zip(todo, validations, strict=True):
        save_member(m, validation, meta, epoch, len(train_split))


def save_member(m: dict[str, Any], validation: dict[str, float], meta, epoch: int, train_count: int) -> None:
    """One member's checkpoint.pt and metrics.json, exactly as its plain run writes them."""
    head, optimizer, scheduler, out_dir = m["head"], m["optimizer"], m["scheduler"], m["step"].out_dir
    m["metrics"] = {
        "epoch": epoch,
        "train_loss": m["total_loss"] / train_count,
        "train_accuracy": m["correct"] / train_count,
        "val_loss": validation["loss"],
        "val_accuracy": validation["accuracy"],
        "val_macro_f1": validation["macro_f1"],
        "lr": scheduler.get_last_lr()[0],
        "global_step": scheduler.last_epoch,
    }
    checkpoint = {
        "epoch": epoch,
        "run": m["spec"]["run"],
        "params_sha256": m["params_sha256"],
        "backbone_fingerprint": meta["backbone_fingerprint"],
        "classes": meta["classes"],
        "head_config": head_model.config_record(head.config),
        "head": {name: tensor.cpu() for name, tensor in head.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "torch_rng": m["rng"],
    }
    atomic_torch_save(out_dir / "checkpoint.pt", checkpoint)
    atomic_write_json(out_dir / "metrics.json", m["metrics"])
    for name in OUTPUTS:
        m["step"].output(name)
