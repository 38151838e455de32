"""qualify_reference: an end-to-end reference's selected CNN, evaluated once on the untouched test split; its manifest.

The same once-only rule as qualify: the ledger entry (test split, reference id) is claimed before any
output is written and every output is computed from it, so a rerun recalls the recorded result and a
different artifact under the same id is refused (its test exposure is spent).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from rffm.errors import IntegrityError
from rffm.model import cnn
from rffm.model.metrics import summarize
from rffm.records import ledger, manifest
from rffm.records.files import atomic_write_json, sha256_bytes, sha256_json
from rffm.records.layout import SENTINEL_NAME, split_file
from rffm.records.sentinel import json_record, record_digest, require_intact
from rffm.records.step import Step
from rffm.records.store import Store, given_store
from rffm.report import qualification as plots

RULE = "qualify_reference"
OUTPUTS = ("metrics.json", "accuracy_vs_snr.png", "confusion_matrix.png", "run_manifest.json")
BATCH = 1024


def load_artifact(store: Store, selection: dict[str, Any]) -> tuple[cnn.RadioMLCNN, dict[str, Any]]:
    """The selected CNN from the results store, checked against its sha256."""
    key, where = selection["artifact_path"], store.where(selection["artifact_path"])
    data = store.read(key)
    if data is None or sha256_bytes(data) != selection["artifact_sha256"]:
        raise IntegrityError(
            f"{RULE} refuses to start: {where}: missing, or its sha256 differs from the selection record. Fix: restore it."
        )
    try:
        blob = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        model = cnn.RadioMLCNN(cnn.CNNConfig(**blob["cnn_config"]))
        model.load_state_dict(blob["state_dict"])
    except Exception as error:  # never unpickled with code; one line either way
        raise IntegrityError(f"{RULE} refuses to start: {where}: not an rffm reference artifact ({type(error).__name__}).") from None
    return model.eval(), blob


def evaluate(model: cnn.RadioMLCNN, classes: list[str], dataset_dir: Path, high_snr_db: float) -> dict[str, Any]:
    """The test metrics: the one read of the test split."""
    require_intact(dataset_dir / SENTINEL_NAME, [split_file("test")], RULE)
    with h5py.File(dataset_dir / split_file("test"), "r") as handle:
        iq, labels, snr_db = handle["iq"], handle["label"][()], handle["snr_db"][()]
        predictions = np.empty(len(labels), dtype=np.int64)
        with torch.no_grad():
            for start in range(0, len(labels), BATCH):
                batch = torch.from_numpy(np.ascontiguousarray(iq[start : start + BATCH], np.float32))
                predictions[start : start + BATCH] = model(batch).argmax(dim=1).numpy()
    return summarize(labels, predictions, snr_db, classes, high_snr_db)


def run(
    spec: dict[str, Any],
    selection_dir: str | Path,
    dataset_dir: str | Path,
    out_dir: str | Path,
    *,
    source: dict[str, Any],
    store: str | Path | None = None,
) -> Path:
    """Qualify the reference's selected CNN once (or recall the recorded result) and write its manifest."""
    selection_dir, dataset_dir = Path(selection_dir), Path(dataset_dir)
    name = spec["run"]
    # what an earlier qualification recorded of its ledger entry (read first: starting removes the old sentinel)
    recorded, recorded_in = ledger.recorded_link_in(out_dir)
    with Step(RULE, out_dir, key={"run": name}, params=spec) as step:
        out_dir = step.out_dir
        results = given_store(store, RULE)
        chosen = step.consume("selection", selection_dir / SENTINEL_NAME, ["selection.json", "history.json"])
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME)  # test.h5 is checked only if it is read
        selection = chosen["selection"]
        split = record_digest(dataset["outputs"][split_file("test")])
        model, blob = load_artifact(results, selection)
        key, entry = ledger.recall(results, split, name, selection["artifact_sha256"], recorded, f"{out_dir}/{recorded_in}", RULE)
        if entry is not None:
            step.details["recalled_from_ledger"] = results.where(key)
        else:
            metrics = evaluate(model, blob["classes"], dataset_dir, spec["high_snr_db"])
            entry = {
                "schema_version": ledger.SCHEMA_VERSION,
                "split_digest": split,
                "dataset": dataset["key"]["dataset"],
                "run": name,
                "artifact_sha256": selection["artifact_sha256"],
                "metrics": metrics,
                "selection_source": source,
            }
            ledger.claim(results, entry)
            entry = ledger.read(results, key)
        link = {"key": key, "sha256": ledger.entry_digest(results, key)}
        metrics = {**entry["metrics"], "exposure_count": ledger.exposure_count(results, split)}
        atomic_write_json(out_dir / "metrics.json", metrics)
        plots.accuracy_vs_snr(metrics, out_dir / "accuracy_vs_snr.png", f"{name} (end-to-end CNN): test accuracy {metrics['accuracy']:.3f}")
        plots.confusion(metrics, out_dir / "confusion_matrix.png", f"{name}: normalized confusion (test)")
        step.device = "cpu"
        steps = {"stage_dataset": manifest._provenance(dataset_dir), "train_reference": manifest._provenance(selection_dir)}
        steps[RULE] = step.provenance_record()
        info = dataset["dataset"]
        body = {
            "schema_version": manifest.SCHEMA_VERSION,
            "run_id": name,
            "kind": "end_to_end",
            "procedure": manifest.PROCEDURE,
            "dataset": {
                "name": info["name"],
                "source": info["source"],
                "sentinel_sha256": sha256_json(dataset),
                "splits": {file: record_digest(record) for file, record in dataset["outputs"].items()},
                "classes": info["classes"],
                "counts": info["counts"],
            },
            "model": blob["cnn_config"],
            "training": {"params": spec["train"]},
            "selection": {key: selection[key] for key in ("epoch", "metric", "mode", "value", "artifact_sha256", "artifact_path")},
            "qualification": {
                **{key: metrics[key] for key in ("accuracy", "macro_f1", "accuracy_high_snr", "accuracy_by_snr", "accuracy_by_class")},
                "exposure_count": metrics["exposure_count"],
                "test_count": metrics["count"],
                "ledger_entry": link,
            },
            "provenance": {
                "versions": manifest.versions(),
                "steps": {rule: {key: record.get(key) for key in (*manifest.STEP_KEYS, "duration_s")} for rule, record in steps.items()},
            },
        }
        atomic_write_json(out_dir / "run_manifest.json", body)
        for output in OUTPUTS[:-1]:
            step.output(output)
        step.output("run_manifest.json", json_record(out_dir / "run_manifest.json", ["provenance"]))
        summary = {key: metrics[key] for key in ("accuracy", "macro_f1", "accuracy_high_snr", "exposure_count")}
        step.facts.update({"kind": "end_to_end", "qualification": summary, "ledger_entry": link})
    return step.sentinel
