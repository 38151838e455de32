"""qualify: the selected artifact, evaluated once on the untouched test split; the run manifest."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from rffm.errors import IntegrityError
from rffm.model import encoder as encoders
from rffm.model import head as head_model
from rffm.model.head import AttentionPoolHead
from rffm.model.metrics import summarize
from rffm.records import launch, ledger, manifest
from rffm.records.files import atomic_write_json, sha256_bytes
from rffm.records.layout import SENTINEL_NAME, split_file
from rffm.records.sentinel import json_record, record_digest, require_intact
from rffm.records.step import Step
from rffm.records.store import Store, given_store
from rffm.report import qualification as plots
from rffm.runtime import batching
from rffm.runtime.progress import Progress

RULE = "qualify"
OUTPUTS = ("metrics.json", "accuracy_vs_snr.png", "confusion_matrix.png", "run_manifest.json")


def load_artifact(store: Store, artifact: dict[str, Any]) -> tuple[AttentionPoolHead, dict[str, Any]]:
    """The head and its metadata from the selected artifact in the results store, checked against its sha256."""
    where = store.where(artifact["key"])
    data = store.read(artifact["key"])
    if data is None:
        raise IntegrityError(f"{RULE} refuses to start: {where}: the selected artifact is missing from the results store. Fix: restore it.")
    if sha256_bytes(data) != artifact["sha256"]:
        raise IntegrityError(f"{RULE} refuses to start: {where}: sha256 differs from its name and the selection record. Fix: restore it.")
    try:
        blob = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        head = head_model.from_record(blob["head_config"])
        head.load_state_dict(blob["head"])
    except Exception as error:  # a hostile or foreign file: never unpickled with code, one line either way
        kind = type(error).__name__
        raise IntegrityError(f"{RULE} refuses to start: {where}: not an rffm head artifact ({kind}). Fix: restore it.") from None
    return head.eval(), blob


def predict(
    model: encoders.Encoder,
    head: AttentionPoolHead,
    test_path: Path,
    batch_size: int = 512,
    batch_profile: str | Path | None = None,
    device: torch.device | str = "cpu",
) -> tuple[np.ndarray, dict[str, int]]:
    """Class predictions for the test split (hidden states rounded to BF16 exactly as in training)."""
    device = torch.device(device)
    head = head.to(device)
    with h5py.File(test_path, "r") as handle:
        iq = handle["iq"]
        predictions = np.empty(iq.shape[0], dtype=np.int64)
        profile = batching.BatchProfile(batch_profile)
        key = batching.profile_key(model.identity, tuple(iq.shape[1:]), "float32", batching.device_context(device))
        controller = batching.AdaptiveBatch(maximum=batch_size)
        profile.seed(key, controller)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)

        def step(start: int, stop: int) -> None:
            with torch.no_grad():
                with autocast:
                    hidden = encoders.as_row(model.features(torch.from_numpy(iq[start:stop]).to(device)))
                hidden = hidden.to(torch.bfloat16).float()
                predictions[start:stop] = head(hidden).argmax(dim=1).cpu().numpy()

        progress = Progress("qualify (test split)", total=iq.shape[0], unit="example")

        def tracked(start: int, stop: int) -> None:
            step(start, stop)
            progress.update(stop - start)

        stats = batching.run_adaptive(iq.shape[0], controller, tracked)
        progress.close()
        if controller.largest_good:
            profile.remember(
                key, controller, controller.largest_good, {"input_shape": list(iq.shape[1:]), **batching.device_context(device)}
            )
    return predictions, stats


def run(
    spec: dict[str, Any],
    selection_dir: str | Path,
    dataset_dir: str | Path,
    backbone_dir: str | Path,
    cache_record_dir: str | Path,
    epoch_dirs: list[str | Path],
    out_dir: str | Path,
    *,
    source: dict[str, Any],
    batch_size: int,
    store: str | Path | None = None,
    batch_profile: str | Path | None = None,
    device: str = "cpu",
    launch_profile: str | None = None,
) -> Path:
    """Evaluate the run's selected artifact on the test split once (or return the recorded result) and write the manifest.

    The ledger entry is claimed before any output is written, and every output is computed from
    the entry: a kill at any point resumes to the same files, and a forced rerun changes nothing.
    """
    selection_dir, dataset_dir, backbone_dir = map(Path, (selection_dir, dataset_dir, backbone_dir))
    run_name = spec["run"]
    # what an earlier qualification recorded of its ledger entry (read first: starting removes the old sentinel)
    recorded, recorded_in = ledger.recorded_link_in(out_dir)
    with Step(RULE, out_dir, key={"run": run_name}, params=spec) as step:
        out_dir = step.out_dir
        results = given_store(store, RULE)
        chosen = step.consume("selection", selection_dir / SENTINEL_NAME, ["selection.json"])
        weights = step.consume("backbone", backbone_dir / SENTINEL_NAME, ["backbone.pt"])
        cached = step.consume("cache", Path(cache_record_dir) / SENTINEL_NAME)  # the encoder the head was trained behind
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME)  # test.h5 is checked only if it is read
        selection = chosen["selection"]
        split = record_digest(dataset["outputs"][split_file("test")])
        head, blob = load_artifact(results, chosen["artifact"])
        if blob["backbone_fingerprint"] != weights["backbone"]["fingerprint"]:
            raise IntegrityError(f"{results.where(chosen['artifact']['key'])} was trained on another backbone than {backbone_dir}")
        key, entry = ledger.recall(results, split, run_name, selection["artifact_sha256"], recorded, f"{out_dir}/{recorded_in}", RULE)
        if entry is not None:
            step.details["recalled_from_ledger"] = results.where(key)
        else:
            metrics = evaluate(head, blob, dataset_dir, backbone_dir, cached, spec, batch_size, batch_profile, device, step)
            ledger.claim(
                results,
                {
                    "schema_version": ledger.SCHEMA_VERSION,
                    "split_digest": split,
                    "dataset": dataset["key"]["dataset"],
                    "run": run_name,
                    "artifact_sha256": selection["artifact_sha256"],
                    "metrics": metrics,
                    "selection_source": source,
                },
            )
            entry = ledger.read(results, key)  # every output comes from the entry as stored: a recall writes the same bytes
        link = {"key": key, "sha256": ledger.entry_digest(results, key)}
        metrics = {**entry["metrics"], "exposure_count": ledger.exposure_count(results, split)}
        atomic_write_json(out_dir / "metrics.json", metrics)
        title = f"{run_name}: test accuracy {metrics['accuracy']:.3f}"
        plots.accuracy_vs_snr(metrics, out_dir / "accuracy_vs_snr.png", title, metrics.get("accuracy_by_class_and_snr"))
        plots.confusion(metrics, out_dir / "confusion_matrix.png", f"{run_name}: normalized confusion (test)")
        steps = manifest.collect_steps(dataset_dir, backbone_dir, Path(cache_record_dir), epoch_dirs, selection_dir)
        step.device = device
        steps[RULE] = step.provenance_record()
        launch_record = launch.recorded(results, run_name, launch_profile)
        body = manifest.build(spec, dataset, weights, epoch_dirs, selection, metrics, steps, launch_record, link)
        atomic_write_json(out_dir / "run_manifest.json", body)
        for name in OUTPUTS[:-1]:
            step.output(name)
        # the manifest's provenance names hosts and job ids; the sentinel vouches for the rest of it
        step.output("run_manifest.json", json_record(out_dir / "run_manifest.json", ["provenance"]))
        summary = {name: metrics[name] for name in ("accuracy", "macro_f1", "accuracy_high_snr", "exposure_count")}
        step.facts.update({"backbone_fingerprint": blob["backbone_fingerprint"], "qualification": summary, "ledger_entry": link})
    return step.sentinel


def evaluate(head, blob, dataset_dir: Path, backbone_dir: Path, cached, spec, batch_size, batch_profile, device, step) -> dict[str, Any]:
    """The test metrics of the artifact: the one read of the test split, through the encoder the cache was built with."""
    require_intact(dataset_dir / SENTINEL_NAME, [split_file("test")], RULE)
    test_path = dataset_dir / split_file("test")
    with h5py.File(test_path, "r") as handle:
        test = {"label": handle["label"][()], "snr_db": handle["snr_db"][()]}
    encoder = cached["encoder"]
    model = encoders.load(cached["backbone"], backbone_dir / "backbone.pt", encoder["spec"], encoder["where"], device)
    if model.identity != encoder["fingerprint"]:
        raise IntegrityError(f"{RULE} refuses to start: {backbone_dir}: not the encoder the cache record names. Fix: rerun snakemake.")
    predictions, step.details["batch_stats"] = predict(model, head, test_path, batch_size, batch_profile, device)
    return summarize(test["label"], predictions, test["snr_db"], blob["classes"], spec["high_snr_db"])
