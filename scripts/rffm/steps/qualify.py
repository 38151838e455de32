"""qualify: the selected artifact, evaluated once on the untouched test split; the run manifest.

The protocol (recall -> evaluate -> claim -> re-read -> exposure) is rffm.training.qualification's,
the evaluation rffm.training.evaluation's, the manifest rffm.records.manifest's (kind frozen_backbone).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm.errors import IntegrityError, checked_yet_disagree
from rffm.model import encoder as encoders
from rffm.records import launch, ledger, manifest
from rffm.records.layout import BACKBONE_NAME, SELECTION_NAME, SENTINEL_NAME, split_file
from rffm.records.sentinel import record_digest
from rffm.records.step import Step
from rffm.records.store import given_store
from rffm.training.artifact import load_head
from rffm.training.evaluation import predict_heads, qualification_metrics
from rffm.training.qualification import qualify_once, write_results

RULE = "qualify"


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
    threads: int | None = None,
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
    with Step(RULE, out_dir, key={"run": run_name}, params=spec, threads=threads) as step:
        out_dir = step.out_dir
        results = given_store(store, RULE)
        chosen = step.consume("selection", selection_dir / SENTINEL_NAME, [SELECTION_NAME])
        weights = step.consume("backbone", backbone_dir / SENTINEL_NAME, [BACKBONE_NAME])
        cached = step.consume("cache", Path(cache_record_dir) / SENTINEL_NAME)  # the encoder the head was trained behind
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME)  # test.h5 is checked only if it is read
        selection = chosen["selection"]
        head, blob = load_head(results, chosen["artifact"], RULE, selection_dir / SENTINEL_NAME)
        if blob["backbone_fingerprint"] != weights["backbone"]["fingerprint"]:
            raise IntegrityError(f"{results.where(chosen['artifact']['key'])} was trained on another backbone than {backbone_dir}")
        predict = predictor(cached, backbone_dir, head, step, batch_size, batch_profile, device)
        qualified = qualify_once(
            results,
            split_digest=record_digest(dataset["outputs"][split_file("test")]),
            dataset=dataset["key"]["dataset"],
            run=run_name,
            artifact_sha256=selection["artifact_sha256"],
            source=source,
            recorded=recorded,
            recorded_in=f"{out_dir}/{recorded_in}",
            rule=RULE,
            evaluate=lambda: qualification_metrics(dataset_dir, blob["classes"], spec["high_snr_db"], predict, RULE),
        )
        if qualified["recalled"]:
            step.details["recalled_from_ledger"] = qualified["recalled"]
        step.device = device
        consumed = {"dataset": dataset_dir, "backbone": backbone_dir, "cache": cache_record_dir}
        consumed |= {"epochs": epoch_dirs, "selection": selection_dir}
        upstream = {"dataset": dataset, "selection": selection, "backbone": weights}
        body = run_manifest(step, spec, upstream, qualified, consumed, launch.recorded(results, run_name, launch_profile))
        write_results(step, qualified, body, run_name)
        step.facts["backbone_fingerprint"] = blob["backbone_fingerprint"]
    return step.sentinel


def predictor(cached: dict, backbone_dir: Path, head, step: Step, batch_size: int, batch_profile, device: str):
    """Test-split predictions through the encoder the cache was built with (its identity checked first)."""

    def predict(test_path: Path):
        encoder = cached["encoder"]
        model = encoders.load(cached["backbone"], backbone_dir / BACKBONE_NAME, encoder["spec"], encoder["where"], device)
        if model.identity != encoder["fingerprint"]:
            raise checked_yet_disagree(f"{RULE} refuses to start: {backbone_dir}: not the encoder the cache record names")
        predictions, step.details["batch_stats"] = predict_heads(model, head, test_path, batch_size, batch_profile, device)
        return predictions

    return predict


def run_manifest(
    step: Step, spec: dict, upstream: dict[str, dict], qualified: dict, consumed: dict[str, Any], launch_record: dict | None
) -> dict[str, Any]:
    """The run manifest: the steps' provenance read from the folders the qualification consumed, and this step's own."""
    steps = manifest.collect_steps(manifest.FROZEN_BACKBONE, consumed)
    steps[RULE] = step.provenance_record()
    return manifest.build(
        manifest.FROZEN_BACKBONE,
        spec,
        upstream["dataset"],
        upstream["selection"],
        qualified,
        steps,
        backbone_sentinel=upstream["backbone"],
        epoch_dirs=consumed["epochs"],
        launch_record=launch_record,
    )
