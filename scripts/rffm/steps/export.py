"""export: the qualified classifier (normalisation, frozen backbone, selected head) as one deployable program.

Writes runs/<run>/export/: model.pt2 (a torch.export program, dynamic batch >= 1), model.onnx (the same
graph for ONNX runtimes), weights.safetensors (every weight of the classifier) and model_card.json.
Each file is also published create-only under its sha256 in the results store's exports/ folder
(like the selected artifacts: no rule's output, so Snakemake never deletes an exported model a
deployment names). The programs are checked, never assumed (rffm.training.export_check), and the
figures go into the model card. Everything runs on the CPU, so two clean runs write the same bytes.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from rffm.backbone_kinds import NATIVE
from rffm.errors import IntegrityError
from rffm.model import encoder as encoders
from rffm.model.classifier import LAYOUT, Classifier, normalisation
from rffm.model.programs import ONNX_OPSET, onnx_bytes, save_program, torch_program, weights_bytes
from rffm.records.files import atomic_write_bytes, canonical_json, sha256_bytes
from rffm.records.layout import (
    BACKBONE_NAME,
    EXPORT_ONNX,
    EXPORT_PROGRAM,
    EXPORT_WEIGHTS,
    MANIFEST_NAME,
    MODEL_CARD,
    SELECTION_NAME,
    SENTINEL_NAME,
    export_name,
    split_file,
)
from rffm.records.step import Step
from rffm.records.store import Store, create_addressed, given_store
from rffm.training.artifact import load_head as load_artifact
from rffm.training.export_check import ONNX_LOGIT_TOLERANCE, check

RULE = "export"


def classifier_module(
    backbone_dir: str | Path, cached: dict[str, Any], results: Store, artifact: dict[str, Any], length: int
) -> tuple[Classifier, dict[str, Any]]:
    """The one place the classifier is built from rffm's classes: (IQ [B, 2, L] -> logits module, the artifact's metadata).

    `cached` is the cache record (the encoder the head was trained behind, as qualify rebuilds it);
    `artifact` the selection's record of the head ({key, sha256} in the results store); the metadata
    gains `length`, the IQ window the backbone reads (the staged examples' when the backbone does not say).
    """
    head, blob = load_artifact(results, artifact)
    recorded = cached["encoder"]  # {fingerprint, spec: how the backbone is read, where}
    encoder = encoders.load(cached["backbone"], Path(backbone_dir) / BACKBONE_NAME, recorded["spec"], recorded["where"], "cpu")
    if encoder.identity != recorded["fingerprint"] or blob["backbone_fingerprint"] != encoder.fingerprint:
        raise IntegrityError(f"{results.where(artifact['key'])}: trained behind another encoder than {backbone_dir}. Fix: rerun selection.")
    module = Classifier(encoder, head.eval())
    module.training = False  # not .eval(): a torch.export backbone refuses train(); every kind is loaded in eval mode
    module.requires_grad_(False)
    how = "inside the program: " + normalisation(recorded["spec"]["adapter"], cached["backbone"]["source"] in NATIVE)
    return module, {**blob, "length": encoder.length or length, "normalisation": how}


def publish(results: Store, out_dir: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Put each file create-only under its sha256 in the store's exports/ folder: {name: {key, bytes, sha256}}."""
    published = {}
    for name in names:
        data = (out_dir / name).read_bytes()
        published[name] = create_addressed(results, export_name(sha256_bytes(data), Path(name).suffix), data, "file")
    return published


def run(
    spec: dict[str, Any],
    qualification_dir: str | Path,
    selection_dir: str | Path,
    dataset_dir: str | Path,
    backbone_dir: str | Path,
    cache_record_dir: str | Path,
    out_dir: str | Path,
    *,
    store: str | Path | None = None,
    threads: int | None = None,
) -> Path:
    """Export the run's qualified classifier, check it on the validation split and publish it."""
    qualification_dir, selection_dir, dataset_dir, backbone_dir = map(Path, (qualification_dir, selection_dir, dataset_dir, backbone_dir))
    params = {"onnx_opset": ONNX_OPSET, "onnx_logit_tolerance": ONNX_LOGIT_TOLERANCE}
    with Step(RULE, out_dir, key={"run": spec["run"]}, params=params, threads=threads) as step:
        out_dir = step.out_dir
        results = given_store(store, RULE)
        qualified = step.consume("qualification", qualification_dir / SENTINEL_NAME, [MANIFEST_NAME])
        chosen = step.consume("selection", selection_dir / SENTINEL_NAME, [SELECTION_NAME, MODEL_CARD])
        weights = step.consume("backbone", backbone_dir / SENTINEL_NAME, [BACKBONE_NAME])
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME, [split_file("val")])["dataset"]  # never the test split
        cached = step.consume("cache", Path(cache_record_dir) / SENTINEL_NAME)  # the encoder the head was trained behind
        staged = staged_facts(dataset_dir / split_file("val"))
        module, blob = classifier_module(backbone_dir, cached, results, chosen["artifact"], staged["length"])
        selection = chosen["selection"]
        signature = signature_of(blob, staged["sample_rate"])
        save_program(torch_program(module, blob["length"]), out_dir / EXPORT_PROGRAM, signature)
        atomic_write_bytes(out_dir / EXPORT_ONNX, onnx_bytes(module, blob["length"]))
        # one metadata key: safetensors keeps metadata in a hash map, so several keys come out in a per-process order
        tags = {"rffm": canonical_json({"format": signature["format"], "classes": blob["classes"]})}
        atomic_write_bytes(out_dir / EXPORT_WEIGHTS, weights_bytes(module, tags))
        recorded = recorded_val_accuracy(qualification_dir / MANIFEST_NAME, selection["epoch"])
        figures = check(dataset_dir, module, out_dir / EXPORT_PROGRAM, out_dir / EXPORT_ONNX, recorded, run=spec["run"])
        files = publish(results, out_dir, [EXPORT_PROGRAM, EXPORT_ONNX, EXPORT_WEIGHTS])
        card = {
            **signature,
            "run": spec["run"],
            "dataset": {"name": dataset["name"], "source": staged["source"], "sentinel_sha256": step.inputs["dataset"]["sha256"]},
            "backbone": {"name": spec["backbone"], "fingerprint": weights["backbone"]["fingerprint"]},
            "artifact": {"key": chosen["artifact"]["key"], "sha256": selection["artifact_sha256"]},
            "head_config": blob["head_config"],
            "selection": {k: selection[k] for k in ("metric", "mode", "epoch", "value", "rule")},
            "validation_check": figures,
            "qualification": qualified.get("qualification"),
            "files": files,
        }
        atomic_write_bytes(out_dir / MODEL_CARD, canonical_json(card).encode(), mode=0o444)
        for name in (EXPORT_PROGRAM, EXPORT_ONNX, EXPORT_WEIGHTS, MODEL_CARD):
            step.output(name)
        step.facts.update({"backbone_fingerprint": weights["backbone"]["fingerprint"], "exported": files, "validation_check": figures})
    return step.sentinel


def staged_facts(split: Path) -> dict[str, Any]:
    """What a staged split says of its data: {length, sample_rate, source} (the source's JSON parsed where it is JSON)."""
    with h5py.File(split, "r") as handle:
        rate, origin = (decode(handle.attrs.get(name)) for name in ("sample_rate", "source"))
        length = int(handle["iq"].shape[-1])
    with contextlib.suppress(TypeError, ValueError):
        origin = json.loads(origin)
    return {"length": length, "sample_rate": rate, "source": origin}


def signature_of(blob: dict[str, Any], rate: Any) -> dict[str, Any]:
    """The exported program's own description (inside the .pt2, and the start of its model card)."""
    return {
        "format": "rffm-classifier/1",
        "classes": blob["classes"],
        "input": {"name": "iq", "layout": LAYOUT, "length": blob["length"], "normalisation": blob["normalisation"]},
        "output": {"name": "logits", "layout": "float32 [batch, classes]; softmax gives class probabilities"},
        "sample_rate_hz": rate if isinstance(rate, float) and np.isfinite(rate) and rate > 0 else None,
    }


def recorded_val_accuracy(manifest: Path, epoch: int) -> float | None:
    """The validation accuracy train_epoch recorded for the selected epoch (the manifest lists every epoch's)."""
    epochs = json.loads(manifest.read_text())["training"]["epochs"]
    return next((e.get("val_accuracy") for e in epochs if e["epoch"] == epoch), None)


def decode(value: Any) -> Any:
    """An HDF5 attribute as a plain value (bytes as text, numpy scalars as Python numbers)."""
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if isinstance(value, np.generic) else value
