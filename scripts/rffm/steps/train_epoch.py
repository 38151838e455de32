"""train_epoch: one epoch of the head on cached hidden states, resuming exactly from the previous epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rffm.data.cache import open_cache, prefetched
from rffm.errors import IntegrityError
from rffm.ops import checkpoints
from rffm.records.files import atomic_torch_save, atomic_write_json
from rffm.records.layout import SENTINEL_NAME, cache_files
from rffm.records.step import Step
from rffm.runtime import tensorboard
from rffm.runtime.profiling import BatchTracer, PhaseTimes
from rffm.runtime.progress import Progress
from rffm.training.epoch import evaluate, make_head, make_optimizer, train_options

RULE = "train_epoch"
OUTPUTS = ("checkpoint.pt", "metrics.json")


def run(
    spec: dict[str, Any],
    cache_dir: str | Path,
    epoch: int,
    previous_dir: str | Path | None,
    out_dir: str | Path,
    *,
    device: str = "cpu",
    profile_dir: str | Path | None = None,
    profile_batches: int = 0,
    checkpoint_store: str | Path | None = None,
) -> Path:
    """Train epoch `epoch` (1-based) and write checkpoint.pt, metrics.json and the sentinel.

    With a checkpoint store, an epoch stored there with the same identity (cache, previous epoch,
    params, code) is restored instead of trained, and a trained one is mirrored there.
    """
    cache_dir = Path(cache_dir)
    device = torch.device(device)
    options = train_options(spec)
    with Step(RULE, out_dir, key={"run": spec["run"], "epoch": epoch}, params={"run": spec["run"], "train": options}) as step:
        step.consume("cache", cache_dir / SENTINEL_NAME, cache_files(), scratch_root=cache_dir.parent)
        if epoch > 1:
            step.consume("previous_epoch", Path(previous_dir) / SENTINEL_NAME, ["checkpoint.pt"])
        restored = checkpoint_store is not None and checkpoints.restore(checkpoint_store, step, OUTPUTS)
        if not restored:
            step.device = device
            splits, meta = open_cache(cache_dir, RULE)
            metrics = train(spec, options, splits, meta, epoch, previous_dir, step, device, profile_dir, profile_batches)
            step.facts.update({"backbone_fingerprint": meta["backbone_fingerprint"], "metrics": metrics})
    if not restored:
        tensorboard.log_epoch(spec["run"], metrics)  # optional side output, after the epoch is complete
        if checkpoint_store:
            checkpoints.mirror(step.out_dir, checkpoint_store, spec["run"], epoch)
    return step.sentinel


def train(spec, options, splits, meta, epoch, previous_dir, step: Step, device, profile_dir, profile_batches) -> dict[str, Any]:
    """The epoch itself: resume the head, optimizer, schedule and RNG; train; validate; save."""
    out_dir = step.out_dir
    phases = PhaseTimes()
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
        "head_config": head.config.__dict__,
        "head": {name: tensor.cpu() for name, tensor in head.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    atomic_torch_save(out_dir / "checkpoint.pt", checkpoint)
    atomic_write_json(out_dir / "metrics.json", metrics)
    for name in OUTPUTS:
        step.output(name)
    step.details = {"epoch": epoch, "phases": phases.as_dict()}
    return metrics
