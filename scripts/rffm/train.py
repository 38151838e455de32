"""One training epoch of the head on cached hidden states, resuming exactly from the previous epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rffm import provenance, tensorboard
from rffm.cache import CacheSplit, open_cache, prefetched
from rffm.errors import IntegrityError
from rffm.files import atomic_torch_save, atomic_write_json, sha256_json
from rffm.head import AttentionPoolHead, HeadConfig
from rffm.metrics import confusion_matrix, macro_f1
from rffm.profiling import BatchTracer, PhaseTimes
from rffm.progress import Progress
from rffm.sentinel import file_record, require_intact, upstream, write_sentinel

DEFAULT_TRAIN = {"weight_decay": 0.01, "warmup_steps": 50, "lr_decay_per_epoch": 0.9, "label_smoothing": 0.0, "head": {}}


def train_options(spec: dict[str, Any]) -> dict[str, Any]:
    """A run's train block with defaults, without `epochs` (no epoch may depend on the total)."""
    options = {**DEFAULT_TRAIN, **spec["train"]}
    options.pop("epochs", None)
    return options


def lr_factor(step: int, steps_per_epoch: int, warmup_steps: int, decay: float) -> float:
    """Linear warmup, then a fixed decay per completed epoch; independent of the epoch count."""
    return min(1.0, (step + 1) / max(1, warmup_steps)) * decay ** (step // steps_per_epoch)


def make_head(meta: dict[str, Any], options: dict[str, Any]) -> AttentionPoolHead:
    config = HeadConfig(dim=meta["shapes"]["train"][2], classes=len(meta["classes"]), **options["head"])
    return AttentionPoolHead(config)


def make_optimizer(head: AttentionPoolHead, options: dict[str, Any], steps_per_epoch: int):
    optimizer = torch.optim.AdamW(head.parameters(), lr=options["lr"], weight_decay=options["weight_decay"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, steps_per_epoch, options["warmup_steps"], options["lr_decay_per_epoch"])
    )
    return optimizer, scheduler


def evaluate(
    head: AttentionPoolHead,
    split: CacheSplit,
    batch_size: int,
    device: torch.device | None = None,
    phases: PhaseTimes | None = None,
    tracer: BatchTracer | None = None,
) -> dict[str, float]:
    """Loss, accuracy and macro-F1 of the head on a cached split, in file order."""
    device = device or torch.device("cpu")
    phases = phases or PhaseTimes()
    head.eval()
    total_loss, predictions = 0.0, []
    batches = [np.arange(start, min(start + batch_size, len(split))) for start in range(0, len(split), batch_size)]
    with torch.no_grad():
        for hidden, labels in prefetched(split, batches, device, phases):
            with phases.phase("head"):
                logits = head(hidden)
                total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
                predictions.append(logits.argmax(dim=1).cpu().numpy())
            if tracer is not None:
                tracer.step()
    predicted = np.concatenate(predictions)
    confusion = confusion_matrix(split.labels, predicted, head.config.classes)
    return {
        "loss": total_loss / len(split),
        "accuracy": float((predicted == split.labels).mean()),
        "macro_f1": macro_f1(confusion),
    }


def run_epoch(
    spec: dict[str, Any],
    cache_dir: str | Path,
    epoch: int,
    previous_dir: str | Path | None,
    out_dir: str | Path,
    device: str = "cpu",
    profile_dir: str | Path | None = None,
    profile_batches: int = 0,
) -> Path:
    """Train epoch `epoch` (1-based) and write checkpoint.pt, metrics.json and the sentinel."""
    out_dir, cache_dir = Path(out_dir), Path(cache_dir)
    started = provenance.start()
    device = torch.device(device)
    phases = PhaseTimes()
    options = train_options(spec)
    params_digest = sha256_json({"run": spec["run"], "train": options})
    splits, meta = open_cache(cache_dir, "train_epoch")
    train, val = splits["train"], splits["val"]
    batch_size = int(options["batch_size"])
    steps_per_epoch = -(-len(train) // batch_size)
    inputs = {"cache": upstream(cache_dir / "sentinel.json", out_dir, scratch_root=cache_dir.parent)}

    if epoch == 1:
        torch.manual_seed(int(options["seed"]))
    head = make_head(meta, options).to(device)
    optimizer, scheduler = make_optimizer(head, options, steps_per_epoch)
    if epoch > 1:
        previous_dir = Path(previous_dir)
        require_intact(previous_dir / "sentinel.json", ["checkpoint.pt"], "train_epoch")
        inputs["previous_epoch"] = upstream(previous_dir / "sentinel.json", out_dir)
        state = torch.load(previous_dir / "checkpoint.pt", map_location=device, weights_only=True)
        if state["params_sha256"] != params_digest or state["epoch"] != epoch - 1:
            raise IntegrityError(
                f"{previous_dir}/checkpoint.pt is epoch {state['epoch']} of different training params; "
                f"epoch {epoch} must resume from epoch {epoch - 1} of the same run. Fix: rerun snakemake, which retrains from epoch 1."
            )
        if state["backbone_fingerprint"] != meta["backbone_fingerprint"]:
            raise IntegrityError(f"{previous_dir}/checkpoint.pt was trained on another backbone than the cache in {cache_dir}")
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"].cpu())

    order = np.random.default_rng([int(options["seed"]), epoch]).permutation(len(train))
    batches = [order[start : start + batch_size] for start in range(0, len(train), batch_size)]
    head.train()
    total_loss, correct = 0.0, 0
    profile_dir = Path(profile_dir) if profile_dir and profile_batches else None
    tracer = BatchTracer(profile_dir / f"epoch{epoch}_train.trace.json" if profile_dir else None, profile_batches, phases)
    progress = Progress(f"train_epoch {spec['run']}/{epoch}", total=steps_per_epoch, unit="batch")
    for hidden, labels in prefetched(train, batches, device, phases):
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
    validation = evaluate(head, val, max(batch_size, 512), device, phases, val_tracer)
    val_tracer.close()
    metrics = {
        "epoch": epoch,
        "train_loss": total_loss / len(train),
        "train_accuracy": correct / len(train),
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
    outputs = {name: file_record(out_dir / name) for name in ("checkpoint.pt", "metrics.json")}
    timings = phases.as_dict()
    provenance.finish(out_dir / "provenance.json", "train_epoch", started, device=device, extra={"epoch": epoch, "phases": timings})
    extra = {"backbone_fingerprint": meta["backbone_fingerprint"], "metrics": metrics}
    key = {"run": spec["run"], "epoch": epoch}
    sentinel = write_sentinel(out_dir, "train_epoch", key, outputs, inputs, {"run": spec["run"], "train": options}, "train", extra)
    tensorboard.log_epoch(spec["run"], metrics)  # optional side output, after the epoch is complete
    return sentinel
