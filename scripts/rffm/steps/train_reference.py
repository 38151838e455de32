"""train_reference: an end-to-end supervised CNN trained from scratch on a staged train split, its epoch chosen on val.

The reference the frozen backbone has to beat (rffm.model.cnn). One job trains every epoch, scores each on
the val split, keeps the best by the configured metric (ties: the earliest epoch) and publishes it like
select_checkpoint does: create-only under artifacts/ in the results store, named by its sha256. The test
split is never read here; qualify_reference evaluates the artifact once.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rffm.data.splits import read_split
from rffm.errors import ConfigError
from rffm.model import cnn
from rffm.model.metrics import confusion_matrix, macro_f1
from rffm.records.files import atomic_write_json
from rffm.records.layout import SENTINEL_NAME, split_file
from rffm.records.step import Step
from rffm.records.store import given_store
from rffm.runtime.progress import Progress
from rffm.training.selection import choose, evidence, publish_artifact

RULE = "train_reference"
EVAL_BATCH = 1024


def evaluate(model: cnn.RadioMLCNN, iq: torch.Tensor, labels: np.ndarray) -> dict[str, float]:
    """val_loss, val_accuracy and val_macro_f1 of the model, in file order."""
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(iq[start : start + EVAL_BATCH]) for start in range(0, len(iq), EVAL_BATCH)])
    loss = float(F.cross_entropy(logits, torch.from_numpy(labels), reduction="mean"))
    predicted = logits.argmax(dim=1).numpy()
    return {
        "val_loss": loss,
        "val_accuracy": float((predicted == labels).mean()),
        "val_macro_f1": macro_f1(confusion_matrix(labels, predicted, model.config.classes)),
    }


def train(spec: dict[str, Any], train_split: dict[str, np.ndarray], val_split: dict[str, np.ndarray], classes: list[str]):
    """Every epoch's val metrics and the state of each epoch; deterministic from the seed on CPU."""
    options = spec["train"]
    iq = torch.from_numpy(np.ascontiguousarray(train_split["iq"], np.float32))
    labels = torch.from_numpy(train_split["label"].astype(np.int64))
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
    progress = Progress(RULE, total=options["epochs"] * steps, unit="batch")
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
        metrics = {"epoch": epoch, "train_loss": running / len(iq), **evaluate(model, val_iq, val_split["label"].astype(np.int64))}
        if not all(math.isfinite(v) for v in metrics.values()):
            raise ConfigError(
                f"references.{spec['run']}: epoch {epoch} has non-finite metrics ({metrics}); a diverged model is never selected"
            )
        history.append(metrics)
        states[epoch] = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        progress.note(f"epoch {epoch}/{options['epochs']}: val accuracy {metrics['val_accuracy']:.4f}")
    progress.close()
    return config, history, states


def run(spec: dict[str, Any], dataset_dir: str | Path, out_dir: str | Path, *, store: str | Path | None = None) -> Path:
    """Train, select on val, publish artifacts/sha256-<hex>.pt; write selection.json (runs/<id>/selection)."""
    dataset_dir = Path(dataset_dir)
    params = {key: spec[key] for key in ("dataset", "model", "train", "selection")}
    with Step(RULE, out_dir, key={"run": spec["run"]}, params=params) as step:
        results = given_store(store, RULE)
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME, [split_file("train"), split_file("val")])
        classes = dataset["dataset"]["classes"]
        splits = {name: read_split(dataset_dir / split_file(name)) for name in ("train", "val")}
        config, history, states = train(spec, splits["train"], splits["val"], classes)
        rule = spec["selection"]
        best = choose(history, rule["metric"], rule["mode"])
        weights = {
            "format": "rffm-reference-artifact/1",
            "classes": classes,
            "cnn_config": config.__dict__,
            "state_dict": states[best["epoch"]],
        }
        published = publish_artifact(results, weights)
        artifact, digest = published["key"], published["sha256"]
        selection = {
            **evidence(best, history, rule["metric"], rule["mode"]),
            "run": spec["run"],
            "kind": "end_to_end",
            "artifact_sha256": digest,
            "artifact_path": artifact,
        }
        atomic_write_json(step.out_dir / "selection.json", selection)
        atomic_write_json(step.out_dir / "history.json", {"epochs": history, "cnn_config": config.__dict__})
        step.output("selection.json")
        step.output("history.json")
        step.facts.update({"selection": selection, "artifact": published})
    return step.sentinel
