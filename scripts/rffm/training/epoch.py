"""A head epoch: the head, its optimizer and schedule, and the epoch loop of every member of a run's sweep.

train_heads is the loop: each member resumes (fresh from its seed at epoch 1, else from its previous
checkpoint's bytes), one pass over the cached train split feeds every batch, gathered once, to all
heads in grid order (each with its own RNG stream), then one pass validates them all. It returns each
member's metrics and checkpoint state; saving and recording them is the caller's (steps/train_epoch).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rffm.data.cache_reader import CacheSplit, prefetched
from rffm.errors import ConfigError, IntegrityError
from rffm.model import head as head_model
from rffm.model.head import AttentionPoolHead
from rffm.records.rebuild import rebuild_command
from rffm.runtime.profiling import BatchTracer, PhaseTimes
from rffm.runtime.progress import Progress
from rffm.training import sweep
from rffm.training.evaluation import validate_heads
from rffm.training.labels import options_rows, subset_facts


def train_options(spec: dict[str, Any]) -> dict[str, Any]:
    """A run's train block without `epochs`: no epoch may depend on the total."""
    return {key: value for key, value in spec["train"].items() if key != "epochs"}


def lr_factor(step: int, steps_per_epoch: int, warmup_steps: int, decay: float) -> float:
    """Linear warmup, then a fixed decay per completed epoch; independent of the epoch count."""
    return min(1.0, (step + 1) / max(1, warmup_steps)) * decay ** (step // steps_per_epoch)


def make_head(meta: dict[str, Any], options: dict[str, Any]) -> AttentionPoolHead:
    """The head for a cache's rows (rffm.model.head.build)."""
    return head_model.build(options["head"], meta)


def tail_shape(meta: dict[str, Any], tail: dict[str, Any], arch: Any, where: str) -> tuple[int, int, int, int]:
    """(blocks, row tap, heads, mlp_ratio) of a tail of the backbone's last `tail.blocks` blocks: the tap of the row that
    is the cached input of the first of them (the cache holds the last output_layers of embedding + each block)."""
    blocks, taps = int(tail["blocks"]), meta["taps"]
    source = arch.output_layers - 1 - blocks
    fix = f"set the backbone's arch.output_layers to at least {blocks + 1} (and keep: all), or train fewer blocks"
    if blocks > arch.depth or source < 0 or len(taps) != arch.output_layers:
        raise ConfigError(
            f"{where}.tail.blocks: {blocks} block(s) of a depth-{arch.depth} backbone need the input of block "
            f"{arch.depth - blocks + 1} in the cache, which holds the last {len(taps)} of its {arch.depth + 1} layers. Fix: {fix}"
        )
    if any(int(tap["tokens"]) != arch.tokens for tap in taps):
        kept = taps[0]["tokens"]
        raise ConfigError(f"{where}.tail: the cache keeps {kept} of {arch.tokens} tokens per tap; the tail runs on all. Fix: {fix}")
    return blocks, source, arch.heads, arch.mlp_ratio


def adapt_tail(head: AttentionPoolHead, backbone: Any) -> None:
    """Start the head's tail from the backbone's weights: its last blocks and its final norm."""
    blocks = len(head.tail)
    for mine, theirs in zip(head.tail, backbone.blocks[-blocks:], strict=True):
        mine.load_state_dict(theirs.state_dict())
    head.tail_norm.load_state_dict(backbone.norm.state_dict())


def tail_head(meta: dict[str, Any], options: dict[str, Any], backbone_file: Path | None, where: str) -> AttentionPoolHead:
    """A fresh head with a tail copied from the backbone the cache was built with (epoch 1 of tail adaptation)."""
    from rffm.model import backbone as native

    if backbone_file is None:
        raise ConfigError(f"{where}.tail: tail adaptation runs rffm's own backbone blocks; this backbone has none. Fix: drop {where}.tail")
    model = native.load(backbone_file)
    if model.fingerprint != meta["backbone_fingerprint"]:
        raise IntegrityError(f"{backbone_file}: not the backbone the cache was built with (fingerprint {model.fingerprint[:16]}…)")
    head = head_model.build(options["head"], meta, tail_shape(meta, options["tail"], model.arch, where))
    adapt_tail(head, model)
    return head


def parameter_groups(head: AttentionPoolHead, options: dict[str, Any]) -> list[dict[str, Any]]:
    """The head's parameters at train.lr and, with a tail, the tail's at train.tail.lr."""
    if not head.config.tail:
        return [{"params": list(head.parameters())}]
    tail = [*head.tail.parameters(), *head.tail_norm.parameters()]
    ids = {id(p) for p in tail}
    return [{"params": [p for p in head.parameters() if id(p) not in ids]}, {"params": tail, "lr": options["tail"]["lr"]}]


def make_optimizer(head: AttentionPoolHead, options: dict[str, Any], steps_per_epoch: int):
    optimizer = torch.optim.AdamW(parameter_groups(head, options), lr=options["lr"], weight_decay=options["weight_decay"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, steps_per_epoch, options["warmup_steps"], options["lr_decay_per_epoch"])
    )
    return optimizer, scheduler


def available_memory(device: torch.device) -> int | None:
    """Free bytes where the heads live (None when unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:  # MemAvailable counts reclaimable page cache (the cache's own mapped pages among it), unlike free pages
        meminfo = Path("/proc/meminfo").read_text()
        return int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemAvailable:"))) * 1024
    except (OSError, StopIteration, ValueError):
        return None


def resume(
    member: dict[str, Any],
    meta: dict[str, Any],
    epoch: int,
    steps_per_epoch: int,
    device: torch.device,
    backbone_file: Path | None,
    where: str,
) -> dict[str, Any]:
    """A member's head, optimizer, schedule and RNG state: fresh from its seed at epoch 1, else its previous checkpoint."""
    options = member["options"]
    previous = None if epoch == 1 else torch.load(io.BytesIO(member["previous"]), map_location=device, weights_only=True)
    if epoch == 1:
        torch.manual_seed(int(options["seed"]))
    if options.get("tail") and epoch == 1:
        head = tail_head(meta, options, backbone_file, where).to(device)
    elif options.get("tail"):  # the tail's shape is the previous checkpoint's (its weights follow)
        head = head_model.from_record(previous["head_config"]).to(device)
    else:
        head = make_head(meta, options).to(device)
    optimizer, scheduler = make_optimizer(head, options, steps_per_epoch)
    state = {**member, "head": head, "optimizer": optimizer, "scheduler": scheduler}
    if epoch == 1:
        state["rng"] = torch.get_rng_state()
    else:
        if previous["params_sha256"] != member["params_sha256"] or previous["epoch"] != epoch - 1:
            # Rerunning this epoch would read the same foreign checkpoint: the previous epoch itself is rebuilt (from
            # the memo, or trained again from its own previous one), its bytes those this run's plan makes.
            raise IntegrityError(
                f"{member['previous_path']} is epoch {previous['epoch']} of different training params; "
                f"epoch {epoch} must resume from epoch {epoch - 1} of the same run (was that folder replaced?); rebuild "
                f"epoch {epoch - 1}, then run snakemake again. Fix: {rebuild_command(member['previous_sentinel'], remove=True)}"
            )
        if previous["backbone_fingerprint"] != meta["backbone_fingerprint"]:
            raise IntegrityError(f"{member['previous_path']} was trained on another backbone than the cache it reads")
        head.load_state_dict(previous["head"])
        optimizer.load_state_dict(previous["optimizer"])
        scheduler.load_state_dict(previous["scheduler"])
        state["rng"] = previous["torch_rng"].cpu()
    if device.type == "cuda":  # CUDA dropout draws from the device generator: one stream per member, from its seed and the epoch
        with torch.random.fork_rng(devices=[device]):
            torch.cuda.manual_seed(int(options["seed"]) * 100003 + epoch)
            state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return state


def train_heads(
    members: list[dict[str, Any]],
    splits: dict[str, CacheSplit],
    meta: dict[str, Any],
    epoch: int,
    device: torch.device,
    *,
    run: str,
    sweep_run: bool = False,
    phases: PhaseTimes | None = None,
    trace_dir: Path | None = None,
    profile_batches: int = 0,
    backbone_file: Path | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Epoch `epoch` of every member: ([{metrics, checkpoint}] in the members' order, details).

    A member is {name, options (train_options), params_sha256, previous (its epoch-1 checkpoint bytes, None
    at epoch 1), previous_path and previous_sentinel (for messages)}; members share batch_size, seed and the
    labelled subset (not sweepable).
    `sweep_run` names the member in a divergence message; details: memory_bytes, cache_bytes_read (the bytes the
    reader copied out of the mapped cache), process_io (this process's I/O counters), phases. `backbone_file`: the
    backbone.pt the cache was built with, where it is rffm's own (a tail starts from its blocks).
    """
    phases = phases or PhaseTimes()
    train_split, val_split = splits["train"], splits["val"]
    copied_before = train_split.bytes_copied + val_split.bytes_copied
    batch_size = int(members[0]["options"]["batch_size"])
    seed = int(members[0]["options"]["seed"])
    rows = options_rows(members[0]["options"], train_split.labels, train_split.snr_db)
    steps_per_epoch = -(-len(rows) // batch_size)
    states = [resume(member, meta, epoch, steps_per_epoch, device, backbone_file, f"runs.{run}.train") for member in members]
    head_params = max(sum(p.numel() for p in m["head"].parameters()) for m in states)
    batch_bytes = batch_size * train_split.row_bytes * 2
    details = {"memory_bytes": sweep.check_memory(len(states), head_params, batch_bytes, available_memory(device), f"runs.{run}.sweep")}

    order = rows[np.random.default_rng([seed, epoch]).permutation(len(rows))]  # every row: the permutation itself
    batches = [order[start : start + batch_size] for start in range(0, len(rows), batch_size)]
    for m in states:
        m["head"].train()
        m["total_loss"], m["correct"] = 0.0, 0
    trace_dir = Path(trace_dir) if trace_dir and profile_batches else None
    tracer = BatchTracer(trace_dir / f"epoch{epoch}_train.trace.json" if trace_dir else None, profile_batches, phases)
    progress = Progress(f"train_epoch {run}/{epoch}", total=steps_per_epoch, unit="batch")
    for hidden, labels in prefetched(train_split, batches, device, phases):
        with phases.phase("head"):
            loss = step_heads(states, hidden, labels, device)
        tracer.step()
        progress.update(1, loss=f"{loss:.4f}")
    tracer.close()
    progress.close()
    for m in states:
        refuse_divergence(m, run, epoch, len(rows), sweep_run)
    val_tracer = BatchTracer(trace_dir / f"epoch{epoch}_val.trace.json" if trace_dir else None, profile_batches, phases)
    validations = validate_heads([m["head"] for m in states], val_split, max(batch_size, 512), device, phases, val_tracer)
    val_tracer.close()
    details["cache_bytes_read"] = train_split.bytes_copied + val_split.bytes_copied - copied_before
    details["process_io"] = process_io()
    details["phases"] = phases.as_dict()
    details["labels"] = subset_facts(members[0]["options"], rows, len(train_split))
    trained = [finish(m, validation, meta, epoch, run, len(rows)) for m, validation in zip(states, validations, strict=True)]
    return trained, details


def process_io() -> dict[str, int]:
    """This process's I/O counters so far (Linux's /proc/self/io): rchar (bytes read by read() and the like, the cache's
    check included) and read_bytes (bytes fetched from storage, page faults on the mapped cache included); {} elsewhere."""
    try:
        lines = Path("/proc/self/io").read_text().splitlines()
    except OSError:
        return {}
    return {key: int(value) for key, _, value in (line.partition(": ") for line in lines) if key in ("rchar", "read_bytes")}


def step_heads(states: list[dict[str, Any]], hidden: torch.Tensor, labels: torch.Tensor, device: torch.device) -> float:
    """One optimizer step of every head on one gathered batch, in grid order, each on its own RNG stream; the last loss."""
    for m in states:
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
    return loss.item()


def refuse_divergence(m: dict[str, Any], run: str, epoch: int, train_count: int, sweep_run: bool) -> None:
    """Stop on a member whose epoch diverged (non-finite loss or weights): nothing of it is kept."""
    head, total_loss = m["head"], m["total_loss"]
    if not math.isfinite(total_loss) or not all(bool(torch.isfinite(p).all()) for p in head.parameters()):
        where = f"runs.{run}.train" + (f" (sweep member {m['name']})" if sweep_run else "")
        raise ConfigError(
            f"{where}: epoch {epoch} diverged (train loss {total_loss / train_count}, non-finite weights); "
            f"nothing of it is kept, so it can never be selected or qualified. Fix: lower runs.{run}.train.lr "
            "(or raise warmup_steps, or drop that sweep value) and rerun snakemake."
        )


def finish(m: dict[str, Any], validation: dict[str, float], meta: dict[str, Any], epoch: int, run: str, train_count: int) -> dict[str, Any]:
    """One member's epoch metrics and checkpoint state, exactly as its plain run saves them."""
    head, optimizer, scheduler = m["head"], m["optimizer"], m["scheduler"]
    metrics = {
        "epoch": epoch,
        "train_loss": m["total_loss"] / train_count,
        "train_accuracy": m["correct"] / train_count,
        **validation,
        "lr": scheduler.get_last_lr()[0],
        "global_step": scheduler.last_epoch,
    }
    checkpoint = {
        "epoch": epoch,
        "run": run,
        "params_sha256": m["params_sha256"],
        "backbone_fingerprint": meta["backbone_fingerprint"],
        "classes": meta["classes"],
        "head_config": head_model.config_record(head.config),
        "head": {name: tensor.cpu() for name, tensor in head.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "torch_rng": m["rng"],
    }
    return {"metrics": metrics, "checkpoint": checkpoint}
