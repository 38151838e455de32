"""train_epoch: one epoch of the head on cached hidden states, resuming exactly from the previous epoch."""

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
from rffm.records.files import atomic_torch_save, atomic_write_json
from rffm.records.layout import SENTINEL_NAME
from rffm.records.step import Step
from rffm.records.store import open_store, publish_trace
from rffm.runtime import tensorboard
from rffm.runtime.profiling import BatchTracer, PhaseTimes
from rffm.runtime.progress import Progress
from rffm.training.epoch import evaluate, make_head, make_optimizer, train_options

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
    """Train epoch `epoch` (1-based) and write checkpoint.pt, metrics.json and the sentinel.

    An epoch kept in the memo (rffm.records.memo) with this identity is restored instead of trained;
    a trained one is kept there. The cache is read from this node's memo, built first if missing.
    """
    cache_record_dir = Path(cache_record_dir)
    results = open_store(store) if store else None
    kept = open_store(memo_store) if memo_store else results
    options = train_options(spec)
    with Step(RULE, out_dir, key={"run": spec["run"], "epoch": epoch}, params={"run": spec["run"], "train": options}) as step:
        step.details["epoch"] = epoch
        record = step.consume("cache", cache_record_dir / SENTINEL_NAME)
        if epoch > 1:
            step.consume("previous_epoch", Path(previous_dir) / SENTINEL_NAME, ["checkpoint.pt"])
        restored = kept is not None and memo.restore(kept, step, OUTPUTS)
        if not restored:
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
                metrics = train(spec, options, splits, meta, epoch, previous_dir, step, step.device, trace_dir, profile_batches, phases)
                for trace in sorted(Path(traces).glob("*.trace.json")):
                    publish_trace(results or open_store(step.out_dir.parents[3]), spec["run"], trace)
            step.facts.update({"backbone_fingerprint": meta["backbone_fingerprint"], "metrics": metrics})
    if not restored:
        if kept is not None:
            memo.save(kept, step, OUTPUTS)
        tensorboard.log_epoch(spec["run"], metrics)  # optional side output, after the epoch is complete
    return step.sentinel


def train(spec, options, splits, meta, epoch, previous_dir, step: Step, device, profile_dir, profile_batches, phases) -> dict[str, Any]:
    """The epoch itself: resume the head, optimizer, schedule and RNG; train; validate; save."""
    out_dir = step.out_dir
    train_split, val_split = splits["train"], splits["val"]
    batch_size = int(options["batch_size"])
    steps_per_epoch = -(-len(train_split) // batch_size)
    params_digest = step.identity()["params_sha256"]
    if epoch == 1:
        torch.manual_seed(int(options["seed"]))
    head = make_head(meta, options).to(device)
    optimizer, scheduler = make_optimizer(head, options, steps_per_epoch)
    if epoch > 1:
        previous_dir = Path(previous_dir)
        state = torch.load(previous_dir / "checkpoint.pt", map_location=device, weights_only=True)
        if state["params_sha256"] != params_digest or state["epoch"] != epoch - 1:
            raise IntegrityError(
                f"{previous_dir}/checkpoint.pt is epoch {state['epoch']} of different training params; "
                f"epoch {epoch} must resume from epoch {epoch - 1} of the same run. Fix: rerun snakemake, which retrains from epoch 1."
            )
        if state["backbone_fingerprint"] != meta["backbone_fingerprint"]:
            raise IntegrityError(f"{previous_dir}/checkpoint.pt was trained on another backbone than the cache it reads")
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"].cpu())

    order = np.random.default_rng([int(options["seed"]), epoch]).permutation(len(train_split))
    batches = [order[start : start + batch_size] for start in range(0, len(train_split), batch_size)]
    head.train()
    total_loss, correct = 0.0, 0
    profile_dir = Path(profile_dir) if profile_dir and profile_batches else None
    tracer = BatchTracer(profile_dir / f"epoch{epoch}_train.trace.json" if profile_dir else None, profile_batches, phases)
    progress = Progress(f"{RULE} {spec['run']}/{epoch}", total=steps_per_epoch, unit="batch")
    for hidden, labels in prefetched(train_split, batches, device, phases):
        with phases.phase("head"):
            logits = head(hidden)
            loss = F.cross_entropy(logits, labels, label_smoothing=options["label_smoothing"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total_loss += loss.item() * len(labels)
            correct += int((logits.argmax(dim=1) == labels).sum())
        tracer.step()
        progress.update(1, loss=f"{loss.item():.4f}")
    tracer.close()
    progress.close()
    if not math.isfinite(total_loss) or not all(bool(torch.isfinite(p).all()) for p in head.parameters()):
        raise ConfigError(
            f"runs.{spec['run']}.train: epoch {epoch} diverged (train loss {total_loss / len(train_split)}, non-finite weights); "
            f"nothing of it is kept, so it can never be selected or qualified. Fix: lower runs.{spec['run']}.train.lr "
            "(or raise warmup_steps) and rerun snakemake."
        )
    val_tracer = BatchTracer(profile_dir / f"epoch{epoch}_val.trace.json" if profile_dir else None, profile_batches, phases)
    validation = evaluate(head, val_split, max(batch_size, 512), device, phases, val_tracer)
    val_tracer.close()
    metrics = {
        "epoch": epoch,
        "train_loss": total_loss / len(train_split),
        "train_accuracy": correct / len(train_split),
        "val_loss": validation["loss"],
        "val_accuracy": validation["accuracy"],
        "val_macro_f1": validation["macro_f1"],
        "lr": scheduler.get_last_lr()[0],
        "global_step": scheduler.last_epoch,
    }
    checkpoint = {
        "epoch": epoch,
        "run": spec["run"],
        "params_sha256": params_digest,
        "backbone_fingerprint": meta["backbone_fingerprint"],
        "classes": meta["classes"],
        "head_config": head_model.config_record(head.config),
        "head": {name: tensor.cpu() for name, tensor in head.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    atomic_torch_save(out_dir / "checkpoint.pt", checkpoint)
    atomic_write_json(out_dir / "metrics.json", metrics)
    for name in OUTPUTS:
        step.output(name)
    step.details["phases"] = phases.as_dict()
    return metrics
