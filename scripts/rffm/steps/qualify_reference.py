"""qualify_reference: an end-to-end reference's selected CNN, evaluated once on the untouched test split; its manifest.

The same once-only protocol as qualify (rffm.training.qualification): the ledger entry (test split,
reference id) is claimed before any output is written and every output is computed from it, so a rerun
recalls the recorded result and a different artifact under the same id is refused (its test exposure is spent).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from rffm.records import ledger, manifest
from rffm.records.layout import HISTORY_NAME, SELECTION_NAME, SENTINEL_NAME, split_file
from rffm.records.sentinel import record_digest
from rffm.records.step import Step
from rffm.records.store import given_store
from rffm.training.artifact import load_cnn
from rffm.training.evaluation import predict_cnn, qualification_metrics
from rffm.training.qualification import qualify_once, write_results

RULE = "qualify_reference"


def run(
    spec: dict[str, Any],
    selection_dir: str | Path,
    dataset_dir: str | Path,
    out_dir: str | Path,
    *,
    source: dict[str, Any],
    store: str | Path | None = None,
    threads: int | None = None,
) -> Path:
    """Qualify the reference's selected CNN once (or recall the recorded result) and write its manifest."""
    selection_dir, dataset_dir = Path(selection_dir), Path(dataset_dir)
    name = spec["run"]
    # what an earlier qualification recorded of its ledger entry (read first: starting removes the old sentinel)
    recorded, recorded_in = ledger.recorded_link_in(out_dir)
    with Step(RULE, out_dir, key={"run": name}, params=spec, threads=threads) as step:
        out_dir = step.out_dir
        results = given_store(store, RULE)
        chosen = step.consume("selection", selection_dir / SENTINEL_NAME, [SELECTION_NAME, HISTORY_NAME])
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME)  # test.h5 is checked only if it is read
        selection = chosen["selection"]
        model, blob = load_cnn(results, selection, RULE)
        qualified = qualify_once(
            results,
            split_digest=record_digest(dataset["outputs"][split_file("test")]),
            dataset=dataset["key"]["dataset"],
            run=name,
            artifact_sha256=selection["artifact_sha256"],
            source=source,
            recorded=recorded,
            recorded_in=f"{out_dir}/{recorded_in}",
            rule=RULE,
            evaluate=lambda: qualification_metrics(dataset_dir, blob["classes"], spec["high_snr_db"], partial(predict_cnn, model), RULE),
        )
        if qualified["recalled"]:
            step.details["recalled_from_ledger"] = qualified["recalled"]
        step.device = "cpu"
        steps = manifest.collect_steps(manifest.END_TO_END, {"dataset": dataset_dir, "selection": selection_dir})
        steps[RULE] = step.provenance_record()
        body = manifest.build(manifest.END_TO_END, spec, dataset, selection, qualified, steps, model=blob["cnn_config"])
        write_results(step, qualified, body, name, model=" (end-to-end CNN)", per_class=False)
        step.facts["kind"] = "end_to_end"
    return step.sentinel
