"""`rffm mlflow`: the tiny run's qualified result in a temporary MLflow file store, once (issue 24)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO, copy_workdir

pytestmark = pytest.mark.workflow


def logged(store: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"}
    return subprocess.run(
        [str(BIN / "rffm"), "mlflow", "results", "--tracking-uri", store.as_uri()],
        cwd=store.parent / "work",
        env=env,
        capture_output=True,
        text=True,
    )


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_runs_metrics_and_the_model_appear_once(exported_workdir: Path, tmp_path: Path):
    import mlflow

    workdir = copy_workdir(exported_workdir, tmp_path / "work")  # the exported model is logged too
    store = workdir.parent / "mlruns"
    first = logged(store)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.startswith("base: logged ")
    before = files_under(store)

    second = logged(store)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.strip() == f"base: already logged {first.stdout.split()[-1]}"
    assert files_under(store) == before  # nothing new: no run, metric, artifact or model

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(store.as_uri())  # models:/ URIs resolve against the current tracking store
    client = mlflow.MlflowClient(tracking_uri=store.as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("rffm").experiment_id])
    manifest = json.loads((workdir / "results/runs/base/qualification/run_manifest.json").read_text())
    assert run.info.run_name == "base"
    assert run.data.params["selection.epoch"] == str(manifest["selection"]["epoch"])
    assert run.data.params["backbone.fingerprint"] == manifest["backbone"]["fingerprint"]
    assert run.data.params["train.lr"] == "0.01"
    history = client.get_metric_history(run.info.run_id, "val_accuracy")
    assert [(m.step, m.value) for m in history] == [(e["epoch"], e["val_accuracy"]) for e in manifest["training"]["epochs"]]
    assert run.data.metrics["test.accuracy"] == manifest["qualification"]["accuracy"]
    assert run.data.metrics["test.exposure_count"] == manifest["qualification"]["exposure_count"] == 1
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "qualification")}
    assert {"qualification/accuracy_vs_snr.png", "qualification/confusion_matrix.png", "qualification/run_manifest.json"} <= artifacts
    assert {a.path for a in client.list_artifacts(run.info.run_id, "export")} == {"export/model.pt2", "export/model_card.json"}
    [model] = client.search_logged_models([run.info.experiment_id])
    assert model.source_run_id == run.info.run_id
    info = mlflow.models.get_model_info(f"models:/{model.model_id}")
    [iq], [logits] = info.signature.inputs.inputs, info.signature.outputs.inputs
    assert (iq.name, str(iq.type), iq.shape) == ("iq", "float32", (-1, 2, 64))
    assert (logits.name, str(logits.type), logits.shape) == ("logits", "float32", (-1, 4))


def test_the_default_store_beside_the_checkouts_results_is_git_ignored():
    """Issue 34: `rffm mlflow results` from the checkout writes mlruns/ beside results/, which git listed as new files."""
    written = ["results/runs/base/sentinel.json", "mlruns/1/meta.yaml", "mlruns/models/rffm/meta.yaml"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=REPO, capture_output=True, text=True)
    assert ignored.stdout.splitlines() == written, ignored.stderr
