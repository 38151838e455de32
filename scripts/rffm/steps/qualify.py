"""qualify: the selected artifact, evaluated once on the untouched test split; the run manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from rffm.errors import IntegrityError
from rffm.model import backbone
from rffm.model.head import AttentionPoolHead, HeadConfig
from rffm.model.metrics import summarize
from rffm.records import launch, ledger, manifest
from rffm.records.files import atomic_write_json, read_json
from rffm.records.layout import SENTINEL_NAME, split_file
from rffm.records.sentinel import json_record, record_digest, require_intact
from rffm.records.step import Step
from rffm.report import qualification as plots
from rffm.runtime import batching
from rffm.runtime.progress import Progress

RULE = "qualify"
OUTPUTS = ("metrics.json", "accuracy_vs_snr.png", "confusion_matrix.png", "run_manifest.json")


def load_artifact(path: Path) -> tuple[AttentionPoolHead, dict[str, Any]]:
    """The head and its metadata from a selection artifact."""
    blob = torch.load(path, map_location="cpu", weights_only=True)
    head = AttentionPoolHead(HeadConfig(**blob["head_config"]))
    head.load_state_dict(blob["head"])
    return head.eval(), blob


def predict(
    model: backbone.IQPatchTransformer,
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
        key = batching.profile_key(model.fingerprint, tuple(iq.shape[1:]), "float32", batching.device_context(device))
        controller = batching.AdaptiveBatch(maximum=batch_size)
        profile.seed(key, controller)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)

        def step(start: int, stop: int) -> None:
            with torch.no_grad():
                with autocast:
                    hidden = model(torch.from_numpy(iq[start:stop]).to(device))
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
    epoch_dirs: list[str | Path],
    cache_provenance: str | Path,
    out_dir: str | Path,
    *,
    batch_size: int,
    batch_profile: str | Path | None = None,
    device: str = "cpu",
    launch_profile: str | None = None,
) -> Path:
    """Evaluate (or recall) the run's selected artifact on the test split and write the manifest."""
    selection_dir, dataset_dir, backbone_dir = map(Path, (selection_dir, dataset_dir, backbone_dir))
    with Step(RULE, out_dir, key={"run": spec["run"]}, params=spec) as step:
        out_dir = step.out_dir
        selection = read_json(selection_dir / SENTINEL_NAME)["selection"]
        artifact = selection["artifact_path"]
        step.consume("selection", selection_dir / SENTINEL_NAME, ["selection.json", artifact])
        backbone_sentinel = step.consume("backbone", backbone_dir / SENTINEL_NAME, ["backbone.pt"])
        dataset_sentinel = step.consume("dataset", dataset_dir / SENTINEL_NAME)  # test.h5 is checked only if it is read
        split_digest = record_digest(dataset_sentinel["outputs"][split_file("test")])
        head, blob = load_artifact(selection_dir / artifact)
        if blob["backbone_fingerprint"] != backbone_sentinel["backbone"]["fingerprint"]:
            trained_on = blob["backbone_fingerprint"][:16]
            raise IntegrityError(f"{selection_dir / artifact} was trained on backbone {trained_on}…, not {backbone_dir}")

        with ledger.locked(dataset_dir) as ledger_path:
            entry = ledger.recorded(ledger_path, split_digest, spec["run"], selection["artifact_sha256"])
            if entry is not None:
                metrics, reused, batch_stats = entry["metrics"], True, None
            else:
                require_intact(dataset_dir / SENTINEL_NAME, [split_file("test")], RULE)
                test_path = dataset_dir / split_file("test")
                with h5py.File(test_path, "r") as handle:
                    test = {"label": handle["label"][()], "snr_db": handle["snr_db"][()]}
                model = backbone.load(backbone_dir / "backbone.pt", device)
                predictions, batch_stats = predict(model, head, test_path, batch_size, batch_profile, device)
                metrics = summarize(test["label"], predictions, test["snr_db"], blob["classes"], spec["high_snr_db"])
                ledger.record(ledger_path, split_digest, spec["run"], selection["artifact_sha256"], metrics)
                reused = False
            exposure = ledger.exposure_count(ledger_path, split_digest)

        metrics = {**metrics, "exposure_count": exposure, "recalled_from_ledger": reused}
        atomic_write_json(out_dir / "metrics.json", metrics)
        title = f"{spec['run']}: test accuracy {metrics['accuracy']:.3f}"
        plots.accuracy_vs_snr(metrics, out_dir / "accuracy_vs_snr.png", title, metrics.get("accuracy_by_class_and_snr"))
        plots.confusion(metrics, out_dir / "confusion_matrix.png", f"{spec['run']}: normalized confusion (test)")
        steps = manifest.collect_steps(dataset_dir, backbone_dir, cache_provenance, epoch_dirs, selection_dir)
        step.device = device
        step.details = {"recalled_from_ledger": reused, "batch_stats": batch_stats}
        steps[RULE] = step.write_provenance()
        launch_record = launch.recorded(out_dir.parent, launch_profile)
        body = manifest.build(spec, dataset_sentinel, backbone_sentinel, epoch_dirs, selection, metrics, steps, launch_record)
        atomic_write_json(out_dir / "run_manifest.json", body)
        for name in OUTPUTS[:-1]:
            step.output(name)
        # the manifest's provenance names hosts and times; the sentinel vouches for the rest of it
        step.output("run_manifest.json", json_record(out_dir / "run_manifest.json", ["provenance"]))
        summary = {key: metrics[key] for key in ("accuracy", "macro_f1", "accuracy_high_snr", "exposure_count")}
        step.facts.update({"backbone_fingerprint": blob["backbone_fingerprint"], "qualification": summary})
    return step.sentinel
