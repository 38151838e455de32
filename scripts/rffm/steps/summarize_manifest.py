"""summarize_manifest: the run manifest as a readable, self-contained HTML page of tables."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from rffm.errors import IntegrityError
from rffm.records import provenance
from rffm.records.files import atomic_write_bytes, read_json
from rffm.records.layout import MANIFEST_NAME, MANIFEST_SUMMARY, PROVENANCE_NAME, SENTINEL_NAME
from rffm.records.step import Step

RULE = "summarize_manifest"
TABLE = MANIFEST_SUMMARY


def _table(rows: list[list[Any]], header: list[str] | None = None, highlight: int | None = None) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4f}"
        return html.escape("-" if value is None else str(value))

    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join(
        f"<tr{' class=sel' if i == highlight else ''}>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
        for i, row in enumerate(rows)
    )
    return f"<table>{head}{body}</table>"


STYLE = (
    "body{font-family:sans-serif;font-size:14px;margin:1em}h1{font-size:20px}h2{font-size:16px;margin-top:1.2em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
    "th{background:#f0f0f0}tr.sel{background:#e3f5e1;font-weight:bold}code{font-size:12px}"
)


def restored_epochs(restored: list[dict[str, Any]]) -> str:
    """Which epochs a run restored (after a preemption, a lost node) and where each was trained."""
    return "; ".join(f"{r['epoch']} (trained on {r['trained_by'].get('host')}, entry {r['memo_entry']})" for r in restored) or "none"


def manifest_html(manifest: dict[str, Any]) -> str:
    """The run manifest as a readable, self-contained HTML page of tables."""
    dataset, backbone, selection = manifest["dataset"], manifest["backbone"], manifest["selection"]
    qualification, prov = manifest["qualification"], manifest["provenance"]
    high = qualification.get("accuracy_high_snr") or {}
    overview = [
        ["run", manifest["run_id"]],
        ["procedure", manifest["procedure"]],
        ["dataset", f"{dataset.get('name', '')} ({dataset['source']}), {len(dataset['classes'])} classes"],
        ["examples train / val / test", " / ".join(str(dataset["counts"][s]) for s in ("train", "val", "test"))],
        ["backbone", f"{backbone.get('name', '')} ({backbone['source']}), fingerprint {backbone['fingerprint'][:16]}…"],
        ["selected epoch", f"{selection['epoch']} by {selection['mode']} {selection['metric']} = {selection['value']:.4f}"],
        ["artifact", selection["artifact_path"]],
        ["test accuracy", qualification["accuracy"]],
        [f"test accuracy at ≥ {high.get('min_snr_db', '?')} dB SNR", high.get("accuracy")],
        ["test macro-F1", qualification["macro_f1"]],
        ["test-split exposure count", f"{qualification['exposure_count']} distinct artifact(s) evaluated on this test split"],
        ["result recalled from the ledger", qualification.get("recalled_from_ledger")],
        ["source revision", f"{prov.get('source_revision')} (dirty: {prov.get('dirty')})"],
        ["versions", ", ".join(f"{k} {v}" for k, v in sorted(prov.get("versions", {}).items()))],
        ["launch profile", prov.get("launch_profile", {}).get("path")],
        ["epochs restored from the memo (not trained by this run)", restored_epochs(prov.get("restored_epochs") or [])],
    ]
    epochs = manifest["training"]["epochs"]
    columns = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "val_macro_f1")
    epoch_keys = [k for k in columns if epochs and k in epochs[0]]
    chosen = next((i for i, e in enumerate(epochs) if e["epoch"] == selection["epoch"]), None)
    # the manifest's keys are sorted as text; show classes in dataset order and SNRs numerically
    by_class = [[name, qualification["accuracy_by_class"].get(name)] for name in dataset["classes"]]
    snrs = sorted(qualification["accuracy_by_snr"], key=lambda k: (k == "unknown", float(k) if k != "unknown" else 0.0))
    by_snr = [[snr, qualification["accuracy_by_snr"][snr]] for snr in snrs]
    steps = [
        [rule, step.get("executor"), step.get("job_id"), step.get("host"), step.get("device"), step.get("image")]
        for rule, step in prov.get("steps", {}).items()
    ]
    params = [[key, json.dumps(value)] for key, value in sorted(manifest["training"]["params"].items())]  # 3e-05, not 0.0000
    sections = [
        f"<h1>Run manifest: {html.escape(manifest['run_id'])}</h1>",
        _table(overview),
        "<h2>Epochs (validation split; the selected epoch is highlighted)</h2>",
        _table([[e[k] for k in epoch_keys] for e in epochs], epoch_keys, highlight=chosen),
        "<h2>Test accuracy per class</h2>",
        _table(by_class, ["class", "accuracy"]),
        "<h2>Test accuracy per SNR (dB)</h2>",
        _table(by_snr, ["SNR (dB)", "accuracy"]),
        "<h2>Training parameters</h2>",
        _table(params, ["param", "value"]),
        "<h2>Where each step ran</h2>",
        _table(steps, ["rule", "executor", "job id", "host", "device", "image"]),
    ]
    body = "\n".join(sections)
    title = html.escape(manifest["run_id"])
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>rffm run {title}</title><style>{STYLE}</style></head>'
        f"<body>\n{body}\n</body></html>\n"
    )


def run(run_name: str, qualification_dir: str | Path, out_dir: str | Path) -> Path:
    """Render the run manifest (checked against the qualification sentinel) as an HTML table."""
    qualification_dir = Path(qualification_dir)
    with Step(RULE, out_dir, key={"run": run_name}, params={"run": run_name}) as step:
        sentinel = qualification_dir / SENTINEL_NAME
        body = step.consume("qualification", sentinel, [MANIFEST_NAME])
        # the sentinel vouches for the manifest without its provenance; the provenance file beside it, for the rest
        record = provenance.read(qualification_dir / PROVENANCE_NAME, sentinel)
        if problems := provenance.partial_output_problems(qualification_dir, body, record, [MANIFEST_NAME]):
            raise IntegrityError(f"{RULE} refuses to start: {problems[0]}. Fix: restore it, or delete {sentinel} and rerun snakemake.")
        manifest = read_json(qualification_dir / MANIFEST_NAME)
        atomic_write_bytes(step.out_dir / TABLE, manifest_html(manifest).encode())
        step.output(TABLE)
    return step.sentinel
