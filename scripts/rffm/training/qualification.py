"""The once-only qualification protocol, the same for every model kind: recall -> evaluate -> claim -> re-read -> exposure.

A run's test exposure is one ledger entry (split digest, run id) in the results store. qualify_once
recalls it when it exists (the test split is not read again; a different artifact under the same run
is refused), else evaluates, claims the entry create-only and reads it back: every output a step
writes comes from the entry as stored, so a recall writes the same bytes as the first qualification.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rffm.records import ledger
from rffm.records.files import atomic_write_json
from rffm.records.layout import ACCURACY_FIGURE, CONFUSION_FIGURE, MANIFEST_NAME, METRICS_NAME
from rffm.records.sentinel import json_record
from rffm.records.step import Step
from rffm.records.store import Store
from rffm.report import qualification as plots

SUMMARY_KEYS = ("accuracy", "macro_f1", "accuracy_high_snr", "exposure_count")  # what a qualification's sentinel carries
FIGURES = (ACCURACY_FIGURE, CONFUSION_FIGURE)


def qualify_once(
    results: Store,
    *,
    split_digest: str,
    dataset: str,
    run: str,
    artifact_sha256: str,
    source: dict[str, Any],
    recorded: dict[str, str] | None,
    recorded_in: str,
    rule: str,
    evaluate: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """{metrics (with exposure_count), link (the ledger entry's key and sha256), recalled (where, or None)}.

    `evaluate` is called only when the ledger holds no entry for this run on this split; `recorded` is
    what an earlier qualification in the step's folder recorded of its entry (ledger.recorded_link_in).
    """
    key, entry = ledger.recall(results, split_digest, run, artifact_sha256, recorded, recorded_in, rule)
    recalled = results.where(key) if entry is not None else None
    if entry is None:
        ledger.claim(
            results,
            {
                "schema_version": ledger.SCHEMA_VERSION,
                "split_digest": split_digest,
                "dataset": dataset,
                "run": run,
                "artifact_sha256": artifact_sha256,
                "metrics": evaluate(),
                "selection_source": source,
            },
        )
        entry = ledger.read(results, key)  # every output comes from the entry as stored
    return {
        "metrics": {**entry["metrics"], "exposure_count": ledger.exposure_count(results, split_digest)},
        "link": {"key": key, "sha256": ledger.entry_digest(results, key)},
        "recalled": recalled,
    }


def write_results(
    step: Step, qualified: dict[str, Any], manifest: dict[str, Any], run: str, model: str = "", per_class: bool = True
) -> None:
    """Write a qualification's metrics, figures and run manifest (every model kind alike) and record them in its step,
    with the summary and ledger entry its sentinel carries. `model` names the model kind in the accuracy figure's title;
    `per_class` draws a curve per class there (a frozen-backbone run's figure; a reference's has the overall curve)."""
    out, metrics = step.out_dir, qualified["metrics"]
    atomic_write_json(out / METRICS_NAME, metrics)
    title = f"{run}{model}: test accuracy {metrics['accuracy']:.3f}"
    plots.accuracy_vs_snr(metrics, out / FIGURES[0], title, metrics.get("accuracy_by_class_and_snr") if per_class else None)
    plots.confusion(metrics, out / FIGURES[1], f"{run}: normalized confusion (test)")
    atomic_write_json(out / MANIFEST_NAME, manifest)
    for output in (METRICS_NAME, *FIGURES):
        step.output(output)
    # the manifest's provenance names hosts and job ids; the sentinel vouches for the rest of it
    step.output(MANIFEST_NAME, json_record(out / MANIFEST_NAME, ["provenance"]))
    step.facts.update({"qualification": {key: metrics[key] for key in SUMMARY_KEYS}, "ledger_entry": qualified["link"]})
