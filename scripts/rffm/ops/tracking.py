"""`rffm mlflow RESULTS`: every qualified run of a results tree, logged once to an MLflow tracking store.

Reads records only (the run manifest, the model card of the export, the figures): params (training,
dataset, backbone, selection rule), every epoch's validation metrics by step, the selection, the test
result and the split's exposure count, the figures and manifest as artifacts, and the exported ONNX
classifier as an MLflow model with its tensor signature (plus the .pt2 and the model card beside it).
Each MLflow run carries the tag `rffm.identity` (the sha256 of the qualification's and the export's
sentinels): a run already logged with that identity is skipped, so logging twice creates nothing new,
and a rerun that changed the result logs a new MLflow run. The default store is the file store
`mlruns/` beside the results tree (MLflow 3 keeps that backend in maintenance mode; rffm allows it
explicitly for its own default; pass `--tracking-uri sqlite:///mlflow.db` or a server for the rest).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rffm.errors import RffmError
from rffm.records.files import sha256_file
from rffm.records.layout import (
    EXPORT,
    EXPORT_ONNX,
    EXPORT_PROGRAM,
    HISTORY_NAME,
    MANIFEST_NAME,
    MODEL_CARD,
    QUALIFICATION,
    REPORT,
    RUNS,
    SELECTION,
    SENTINEL_NAME,
)
from rffm.records.manifest import END_TO_END

EXPERIMENT = "rffm"
IDENTITY_TAG = "rffm.identity"
FIGURES = (f"{QUALIFICATION}/accuracy_vs_snr.png", f"{QUALIFICATION}/confusion_matrix.png")
REPORTS = (f"{REPORT}/validation/training_curves.png", f"{REPORT}/validation/selection_evidence.png")


def qualified_runs(results: Path) -> list[Path]:
    """Run folders under results/runs that hold a qualification (a run manifest and its sentinel)."""
    return sorted(
        p.parent.parent for p in (results / RUNS).glob(f"*/{QUALIFICATION}/{SENTINEL_NAME}") if (p.parent / MANIFEST_NAME).is_file()
    )


def identity(run_dir: Path) -> str:
    """What an MLflow run of this rffm run stands for: the qualification's (and the export's) sentinel digests."""
    parts = [sha256_file(run_dir / QUALIFICATION / SENTINEL_NAME)]
    if (run_dir / EXPORT / SENTINEL_NAME).is_file():
        parts.append(sha256_file(run_dir / EXPORT / SENTINEL_NAME))
    return ":".join(parts)


def flat(prefix: str, value: Any) -> dict[str, str]:
    """Nested params as dotted keys with text values (MLflow params are strings)."""
    if isinstance(value, dict):
        return {k: v for key, item in sorted(value.items()) for k, v in flat(f"{prefix}.{key}" if prefix else key, item).items()}
    return {prefix: json.dumps(value) if isinstance(value, (list, bool)) or value is None else str(value)}


def params_of(manifest: dict[str, Any]) -> dict[str, str]:
    """The params an MLflow run gets: training, dataset, backbone (a reference: its CNN) and selection rule."""
    selection = manifest["selection"]
    model = (
        {"backbone.fingerprint": manifest["backbone"]["fingerprint"]} if "backbone" in manifest else flat("model", manifest.get("model"))
    )
    return {
        "kind": str(manifest.get("kind", "frozen_backbone")),
        **flat("train", manifest["training"]["params"]),
        "dataset.source": str(manifest["dataset"]["source"]),
        "dataset.classes": json.dumps(manifest["dataset"]["classes"]),
        **model,
        "selection.metric": selection["metric"],
        "selection.epoch": str(selection["epoch"]),
        **({"selection.member": str(selection["member"])} if selection.get("member") else {}),
        "artifact.sha256": selection["artifact_sha256"],
    }


def epoch_history(run_dir: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every epoch's metrics: a frozen run's manifest lists them; a reference's are its selection's history.json."""
    if manifest.get("kind") != END_TO_END:
        return manifest["training"]["epochs"]
    history = run_dir / SELECTION / HISTORY_NAME
    return json.loads(history.read_text())["epochs"] if history.is_file() else []


def metrics_of(manifest: dict[str, Any], history: list[dict[str, Any]]) -> tuple[list[tuple[str, float, int]], dict[str, float]]:
    """(per-epoch (name, value, epoch) metrics, single metrics: selection value, test result, exposure count)."""
    epochs = [
        (name, float(epoch[name]), int(epoch["epoch"]))
        for epoch in history
        for name in ("train_loss", "val_loss", "val_accuracy", "val_macro_f1")
        if isinstance(epoch.get(name), (int, float))
    ]
    test = manifest["qualification"]
    single = {"selection.value": float(manifest["selection"]["value"])}
    single |= {f"test.{name}": float(test[name]) for name in ("accuracy", "macro_f1", "exposure_count") if name in test}
    high = test.get("accuracy_high_snr")
    if isinstance(high, dict) and isinstance(high.get("accuracy"), (int, float)):
        single["test.accuracy_high_snr"] = float(high["accuracy"])
    return epochs, single


def log_results(results_dir: str | Path, tracking_uri: str | None = None, experiment: str = EXPERIMENT) -> dict[str, str]:
    """Log every qualified run not yet in the store; {run: "logged <id>" | "already logged <id>"}."""
    try:
        import mlflow
    except ImportError:
        raise RffmError("mlflow is not installed. Fix: pip install 'rffm[mlflow]'") from None
    results = Path(results_dir)
    runs = qualified_runs(results)
    if not runs:
        raise RffmError(f"{results}: no qualified run under runs/. Fix: run the workflow to final_qualification first.")
    uri = tracking_uri or (results.resolve().parent / "mlruns").as_uri()
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # rffm's default store; MLflow 3 otherwise refuses it
    client = mlflow.MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    done = {}
    for run_dir in runs:
        key = identity(run_dir)
        logged = client.search_runs([experiment_id], filter_string=f"tags.`{IDENTITY_TAG}` = '{key}'", max_results=1)
        if logged:
            done[run_dir.name] = f"already logged {logged[0].info.run_id}"
            continue
        done[run_dir.name] = f"logged {log_run(mlflow, uri, experiment_id, run_dir, key)}"
    return done


def log_run(mlflow, uri: str, experiment_id: str, run_dir: Path, key: str) -> str:
    """One rffm run as one MLflow run; its id."""
    manifest = json.loads((run_dir / QUALIFICATION / MANIFEST_NAME).read_text())
    mlflow.set_tracking_uri(uri)
    epochs, single = metrics_of(manifest, epoch_history(run_dir, manifest))
    tags = {IDENTITY_TAG: key, "rffm.run": run_dir.name, "rffm.procedure": str(manifest.get("procedure"))}
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_dir.name, tags=tags) as active:
        mlflow.log_params(params_of(manifest))
        for name, value, step in epochs:
            mlflow.log_metric(name, value, step=step)
        mlflow.log_metrics(single)
        for name in (*FIGURES, REPORTS[0], REPORTS[1], f"{QUALIFICATION}/{MANIFEST_NAME}"):
            if (run_dir / name).is_file():
                mlflow.log_artifact(str(run_dir / name), artifact_path=str(Path(name).parent))
        if (run_dir / EXPORT / EXPORT_ONNX).is_file():
            log_export(mlflow, run_dir / EXPORT)
    return active.info.run_id


def log_export(mlflow, export_dir: Path) -> None:
    """The exported classifier as an MLflow ONNX model with its signature; the .pt2 and the model card beside it."""
    import numpy as np
    import onnx
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    card = json.loads((export_dir / MODEL_CARD).read_text())
    length, classes = int(card["input"]["length"]), len(card["classes"])
    signature = ModelSignature(
        inputs=Schema([TensorSpec(np.dtype("float32"), (-1, 2, length), "iq")]),
        outputs=Schema([TensorSpec(np.dtype("float32"), (-1, classes), "logits")]),
    )
    model = onnx.load(str(export_dir / EXPORT_ONNX))
    requirements = [f"onnxruntime=={_version('onnxruntime')}"]
    mlflow.onnx.log_model(model, name="classifier", signature=signature, pip_requirements=requirements, save_as_external_data=False)
    for name in (EXPORT_PROGRAM, MODEL_CARD):
        mlflow.log_artifact(str(export_dir / name), artifact_path="export")


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)
