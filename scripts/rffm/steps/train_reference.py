"""train_reference: an end-to-end supervised CNN trained from scratch on a staged train split, its epoch chosen on val.

The reference the frozen backbone has to beat (rffm.model.cnn, its loop rffm.training.reference). One job
trains every epoch, scores each on the val split, keeps the best by the configured metric (ties: the
earliest epoch) and publishes it like select_checkpoint does: create-only under artifacts/ in the results
store, named by its sha256. The test split is never read here; qualify_reference evaluates the artifact once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm.data.splits import read_split
from rffm.records.files import atomic_write_json
from rffm.records.layout import HISTORY_NAME, SELECTION_NAME, SENTINEL_NAME, split_file
from rffm.records.step import Step
from rffm.records.store import given_store
from rffm.training.labels import options_rows, subset_facts
from rffm.training.reference import train_cnn
from rffm.training.selection import choose, evidence, publish_artifact

RULE = "train_reference"


def run(
    spec: dict[str, Any], dataset_dir: str | Path, out_dir: str | Path, *, store: str | Path | None = None, threads: int | None = None
) -> Path:
    """Train, select on val, publish artifacts/sha256-<hex>.pt; write selection.json (runs/<id>/selection)."""
    dataset_dir = Path(dataset_dir)
    params = {key: spec[key] for key in ("dataset", "model", "train", "selection")}
    with Step(RULE, out_dir, key={"run": spec["run"]}, params=params, threads=threads) as step:
        results = given_store(store, RULE)
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME, [split_file("train"), split_file("val")])
        classes = dataset["dataset"]["classes"]
        splits = {name: read_split(dataset_dir / split_file(name)) for name in ("train", "val")}
        train = splits["train"]
        rows = options_rows(spec["train"], train["label"], train["snr_db"])  # the labelled subset (all rows by default)
        config, history, states = train_cnn(spec, train, splits["val"], classes, rows)
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
        atomic_write_json(step.out_dir / SELECTION_NAME, selection)
        atomic_write_json(step.out_dir / HISTORY_NAME, {"epochs": history, "cnn_config": config.__dict__})
        step.output(SELECTION_NAME)
        step.output(HISTORY_NAME)
        step.facts.update({"selection": selection, "artifact": published})
        if spec["train"].get("labels_per_class_snr") is not None:  # label-scarce: the rows it read labels of
            step.facts["labels"] = subset_facts(spec["train"], rows, len(train["label"]))
    return step.sentinel
