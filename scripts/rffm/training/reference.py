"""The end-to-end reference's loop: a CNN trained from scratch on a staged split's IQ, each epoch scored on val."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rffm.errors import ConfigError
from rffm.model import cnn
from rffm.model.metrics import sentinel_metrics
from rffm.runtime.progress import Progress
from rffm.training.evaluation import validate_cnn


def train_cnn(
    spec: dict[str, Any], train_split: dict[str, np.ndarray], val_split: dict[str, np.ndarray], classes: list[str], rows: np.ndarray
) -> tuple[cnn.CNNConfig, list[dict[str, Any]], dict[int, dict[str, torch.Tensor]]]:
    """(config, every epoch's metrics, every epoch's state) of a reference `spec` trained on the train `rows` (the
    labelled subset: rffm.training.labels.options_rows); deterministic from the seed on CPU."""
    options = spec["train"]
    iq = torch.from_numpy(np.ascontiguousarray(train_split["iq"][rows], np.float32))
    labels = torch.from_numpy(train_split["label"][rows].astype(np.int64))
    val_iq = torch.from_numpy(np.ascontiguousarray(val_split["iq"], np.float32))
    config = cnn.CNNConfig(classes=len(classes), length=int(iq.shape[-1]), **spec["model"])
    if config.input == "rf" and config.length % config.symbol_period:
        raise ConfigError(
            f"references.{spec['run']}.model.symbol_period: {config.symbol_period} does not divide the length {config.length}"
        )
    model = cnn.build(config, options["seed"])
    torch.manual_seed(options["seed"])  # dropout
    optimizer = torch.optim.AdamW(model.parameters(), lr=options["lr"], weight_decay=options["weight_decay"])
    steps = math.ceil(len(iq) / options["batch_size"])
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=options["lr"], total_steps=options["epochs"] * steps)
    progress = Progress("train_reference", total=options["epochs"] * steps, unit="batch")
    history, states = [], {}
    for epoch in range(1, options["epochs"] + 1):
        model.train()
        order = np.random.default_rng([options["seed"], epoch]).permutation(len(iq))
        running = 0.0
        for start in range(0, len(iq), options["batch_size"]):
            rows = torch.from_numpy(order[start : start + options["batch_size"]])
            loss = F.cross_entropy(model(iq[rows]), labels[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            running += loss.item() * len(rows)
            progress.update(1, loss=f"{loss.item():.4f}")
        metrics = {"epoch": epoch, "train_loss": running / len(iq), **validate_cnn(model, val_iq, val_split["label"].astype(np.int64))}
        if not all(math.isfinite(v) for v in metrics.values() if isinstance(v, float)):
            raise ConfigError(
                f"references.{spec['run']}: epoch {epoch} has non-finite metrics ({sentinel_metrics(metrics)}); a diverged model "
                "is never selected"
            )
        history.append(metrics)
        states[epoch] = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        progress.note(f"epoch {epoch}/{options['epochs']}: val accuracy {metrics['val_accuracy']:.4f}")
    progress.close()
    return config, history, states
