"""train_reference: an end-to-end supervised CNN trained from scratch on a staged train split, its epoch chosen on val.

The reference the frozen backbone has to beat (rffm.model.cnn, its loop rffm.training.reference). One job
trains every epoch, scores each on the val split, keeps the best by the configured metric (ties: the
earliest epoch) and publishes it like select_checkpoint does: create-only under artifacts/ in the results
store, named by its sha256. The test split is never read here; qualify_reference evaluates the artifact once.

A reference with a sweep (references.<id>.sweep, rffm.training.sweep) trains each member in grid order, each
exactly the plain reference of its settings (same id, no sweep: its history and states are those bytes), and
keeps the best (member, epoch) by the same rule as a run's sweep (ties: the earliest epoch, then the first member
in grid order): one artifact, named with its member in selection.json and history.json (the member's settings,
every member and the whole validation table, as a run's model card records them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm.data.splits import read_split
from rffm.records.files import atomic_write_json
from rffm.records.layout import HISTORY_NAME, SELECTION_NAME, SENTINEL_NAME, split_file
from rffm.records.step import Step
from rffm.records.store import given_store
from rffm.training import sweep
from rffm.training.labels import options_rows, subset_facts
from rffm.training.reference import train_cnn
from rffm.training.selection import choose, evidence, publish_artifact, sweep_record

RULE = "train_reference"


def run(
    spec: dict[str, Any], dataset_dir: str | Path, out_dir: str | Path, *, store: str | Path | None = None, threads: int | None = None
) -> Path:
    """Train (each member of a sweep), select on val, publish artifacts/sha256-<hex>.pt; write selection.json (runs/<id>/selection)."""
    dataset_dir = Path(dataset_dir)
    params = {key: spec[key] for key in ("dataset", "model", "train", "selection", "sweep") if key in spec}
    members = sweep.members(spec, "references")
    names = [m["name"] for m in members] if len(members) > 1 else None
    with Step(RULE, out_dir, key={"run": spec["run"]}, params=params, threads=threads) as step:
        results = given_store(store, RULE)
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME, [split_file("train"), split_file("val")])
        classes = dataset["dataset"]["classes"]
        splits = {name: read_split(dataset_dir / split_file(name)) for name in ("train", "val")}
        train = splits["train"]
        rows = options_rows(spec["train"], train["label"], train["snr_db"])  # the labelled subset (all rows by default)
        rule = spec["selection"]
        trained = [kept(train_cnn(sweep.member_spec(spec, m), train, splits["val"], classes, rows), rule) for m in members]
        if names:  # every (member, epoch) is a candidate: epochs ascending, members in grid order
            candidates = [
                {**m, "member": name}
                for epoch in sorted({m["epoch"] for _, history, _ in trained for m in history})
                for name, (_, history, _) in zip(names, trained, strict=True)
                for m in history
                if m["epoch"] == epoch
            ]
        else:
            candidates = trained[0][1]
        best = choose(candidates, rule["metric"], rule["mode"])
        index = names.index(best["member"]) if names else 0
        config, history, states = trained[index]
        weights = {
            "format": "rffm-reference-artifact/1",
            "classes": classes,
            "cnn_config": config.__dict__,
            "state_dict": states[best["epoch"]],
        }
        published = publish_artifact(results, weights)
        artifact, digest = published["key"], published["sha256"]
        selection = {
            **evidence(best, candidates, rule["metric"], rule["mode"]),
            "run": spec["run"],
            "kind": "end_to_end",
            "artifact_sha256": digest,
            "artifact_path": artifact,
        }
        record = {"epochs": history, "cnn_config": config.__dict__}  # of a sweep: the chosen member's
        if names:
            chosen = members[index]
            selection["settings"] = chosen["settings"]
            record["training"] = sweep.member_train(spec["train"], chosen["settings"])
            histories = {name: member_history for name, (_, member_history, _) in zip(names, trained, strict=True)}
            record["sweep"] = {**sweep_record(chosen, members, candidates), "histories": histories}
        atomic_write_json(step.out_dir / SELECTION_NAME, selection)
        atomic_write_json(step.out_dir / HISTORY_NAME, record)
        step.output(SELECTION_NAME)
        step.output(HISTORY_NAME)
        step.facts.update({"selection": selection, "artifact": published})
        if spec["train"].get("labels_per_class_snr") is not None:  # label-scarce: the rows it read labels of
            step.facts["labels"] = subset_facts(spec["train"], rows, len(train["label"]))
    return step.sentinel


def kept(trained: tuple, rule: dict[str, str]) -> tuple:
    """A member's (config, history, states) with only its own best epoch's state: the one the sweep can choose (the best
    (member, epoch) is its member's best epoch, ties alike), so K members hold K states, not K x epochs."""
    config, history, states = trained
    epoch = choose(history, rule["metric"], rule["mode"])["epoch"]
    return config, history, {epoch: states[epoch]}
