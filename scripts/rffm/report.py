"""Report figures and tables for `snakemake --report`: training curves, selection evidence,
the run manifest as a table, and cache lifecycle timings when profiling was on."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rffm import provenance  # noqa: E402
from rffm.errors import DataError  # noqa: E402
from rffm.files import atomic_write_bytes, read_json  # noqa: E402

# The qualification plots' PNG writer (deterministic bytes). These figures live here, not in
# rffm.plots, so that adding one never changes the code digest of qualify.
from rffm.plots import _save as save_png  # noqa: E402
from rffm.sentinel import file_record, read_sentinel, require_intact, upstream, write_sentinel  # noqa: E402

VALIDATION_FIGURES = ("training_curves.png", "selection_evidence.png")
MANIFEST_TABLE = "manifest_summary.html"
LIFECYCLE_FIGURE = "cache_lifecycle.png"


def training_curves(epochs: list[dict[str, Any]], path: str | Path, title: str, selected_epoch: int | None = None) -> None:
    """Loss and accuracy per epoch, train vs validation, with the selected epoch marked."""
    x = [m["epoch"] for m in epochs]
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((loss_ax, "loss", "cross-entropy loss"), (acc_ax, "accuracy", "accuracy")):
        ax.plot(x, [m[f"train_{key}"] for m in epochs], "-o", color="tab:blue", ms=3, label="train")
        ax.plot(x, [m[f"val_{key}"] for m in epochs], "-s", color="tab:orange", ms=3, label="validation")
        if selected_epoch is not None:
            ax.axvline(selected_epoch, color="tab:green", ls="--", lw=1.2, label=f"selected (epoch {selected_epoch})")
        ax.set(xlabel="epoch", ylabel=label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    acc_ax.set_ylim(0, 1.02)
    fig.suptitle(title)
    save_png(fig, path)


def selection_evidence(selection: dict[str, Any], path: str | Path, title: str) -> None:
    """The selection metric of every candidate epoch, the chosen one highlighted with the rule that chose it."""
    metric, chosen = selection["metric"], selection["epoch"]
    epochs = [c["epoch"] for c in selection["candidates"]]
    values = [c[metric] for c in selection["candidates"]]
    best = max(values) if selection["mode"] == "max" else min(values)
    tied = [e for e, v in zip(epochs, values, strict=True) if v == best and e != chosen]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(epochs, values, "-o", color="lightsteelblue", mec="steelblue", ms=6, label="candidate epochs")
    if tied:
        ax.plot(tied, [best] * len(tied), "o", color="tab:olive", ms=9, label="tied, later epoch")
    ax.plot([chosen], [selection["value"]], "o", color="tab:green", ms=11, label=f"selected: epoch {chosen}")
    ax.axhline(selection["value"], color="tab:green", ls="--", lw=1)
    for epoch, value in zip(epochs, values, strict=True):
        ax.annotate(f"{value:.3f}", (epoch, value), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
    word = "highest" if selection["mode"] == "max" else "lowest"
    why = f"selected epoch {chosen}: {word} {metric} ({selection['value']:.4f}) of {len(values)} epochs"
    why += f"; {len(tied) + 1} epochs tie, the earliest wins" if tied else "; ties would go to the earliest"
    ax.set(xlabel="epoch", ylabel=f"{metric} (validation split)", title=f"{title}\n{why}")
    ax.set_xticks(epochs)
    # zoom on the candidates' range: the differences between epochs are what the reader compares
    low, high = min(values), max(values)
    pad = max(0.01, 0.15 * (high - low))
    ax.set_ylim(low - pad, high + 2 * pad)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right" if selection["mode"] == "max" else "upper right")
    save_png(fig, path)


def cache_lifecycle(summary: dict[str, Any], path: str | Path, title: str) -> None:
    """Horizontal bars of each profiled phase's inclusive total time (phases nest, so bars do not add up)."""
    phases = sorted(summary["phases"].items(), key=lambda item: item[1]["total_s"])
    names = [name for name, _ in phases]
    totals = [float(stats["total_s"]) for _, stats in phases]
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.38 * max(len(names), 1)))
    bars = ax.barh(names, totals, color="tab:purple", alpha=0.8)
    for bar, (_, stats) in zip(bars, phases, strict=True):
        label = f" {stats['total_s']:.3f} s / {stats['count']} call{'s' if stats['count'] != 1 else ''}"
        ax.annotate(label, (bar.get_width(), bar.get_y() + bar.get_height() / 2), va="center", fontsize=7)
    ax.set_xlim(0, max(totals, default=1.0) * 1.3 or 1.0)
    ax.set(xlabel="inclusive time (s), summed over all batches of the step", title=f"{title}\ninclusive, non-additive phase timings")
    ax.grid(axis="x", alpha=0.3)
    save_png(fig, path)


def plot_training(run: str, epoch_dirs: list[str | Path], selection_dir: str | Path, out_dir: str | Path) -> Path:
    """Training curves and selection evidence, read from the epoch and selection sentinels (validation data only)."""
    out_dir, selection_dir = Path(out_dir), Path(selection_dir)
    started = provenance.start()
    inputs, epochs = {}, []
    for directory in map(Path, epoch_dirs):
        body = read_sentinel(directory / "sentinel.json")
        inputs[f"epoch_{body['key']['epoch']}"] = upstream(directory / "sentinel.json", out_dir)
        epochs.append(body["metrics"])
    epochs.sort(key=lambda m: m["epoch"])
    selection = read_sentinel(selection_dir / "sentinel.json")["selection"]
    inputs["selection"] = upstream(selection_dir / "sentinel.json", out_dir)
    training_curves(epochs, out_dir / VALIDATION_FIGURES[0], f"{run}: training curves", selection["epoch"])
    selection_evidence(selection, out_dir / VALIDATION_FIGURES[1], f"{run}: checkpoint selection")
    outputs = {name: file_record(out_dir / name) for name in VALIDATION_FIGURES}
    provenance.finish(out_dir / "provenance.json", "plot_training", started)
    return write_sentinel(out_dir, "plot_training", {"run": run}, outputs, inputs, {"run": run}, "report")


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


def summarize_manifest(run: str, qualification_dir: str | Path, out_dir: str | Path) -> Path:
    """Render the run manifest (checked against the qualification sentinel) as an HTML table."""
    qualification_dir, out_dir = Path(qualification_dir), Path(out_dir)
    started = provenance.start()
    require_intact(qualification_dir / "sentinel.json", ["run_manifest.json"], "summarize_manifest")
    manifest = read_json(qualification_dir / "run_manifest.json")
    atomic_write_bytes(out_dir / MANIFEST_TABLE, manifest_html(manifest).encode())
    outputs = {MANIFEST_TABLE: file_record(out_dir / MANIFEST_TABLE)}
    inputs = {"qualification": upstream(qualification_dir / "sentinel.json", out_dir)}
    provenance.finish(out_dir / "provenance.json", "summarize_manifest", started)
    return write_sentinel(out_dir, "summarize_manifest", {"run": run}, outputs, inputs, {"run": run}, "report")


def check_lifecycle_summary(summary: Any, path: str | Path) -> dict[str, Any]:
    """A cache_lifecycle_summary.json with phases {name: {total_s, count}}, or a clear error."""
    phases = summary.get("phases") if isinstance(summary, dict) else None
    if not isinstance(phases, dict) or not phases:
        raise DataError(
            f"{path}: field 'phases' must be a non-empty mapping of phase name to {{total_s, count}}. Fix: rerun the profiled step."
        )
    for name, stats in phases.items():
        if not isinstance(stats, dict) or not isinstance(stats.get("total_s"), (int, float)) or not isinstance(stats.get("count"), int):
            raise DataError(f"{path}: phases.{name} must hold a number 'total_s' and an integer 'count', got {stats!r}")
    return summary


def plot_cache_lifecycle(run: str, summary_path: str | Path, out_dir: str | Path) -> Path:
    """Bar chart of a profiled run's cache lifecycle phases (inclusive timings)."""
    summary_path, out_dir = Path(summary_path), Path(out_dir)
    started = provenance.start()
    summary = check_lifecycle_summary(read_json(summary_path), summary_path)
    batches = summary.get("batch_count")
    title = f"{run}: cache lifecycle" + (f" ({batches} profiled batches)" if batches else "")
    cache_lifecycle(summary, out_dir / LIFECYCLE_FIGURE, title)
    outputs = {LIFECYCLE_FIGURE: file_record(out_dir / LIFECYCLE_FIGURE)}
    inputs = {"profiling_summary": upstream(summary_path, out_dir)}
    provenance.finish(out_dir / "provenance.json", "plot_cache_lifecycle", started)
    return write_sentinel(out_dir, "plot_cache_lifecycle", {"run": run}, outputs, inputs, {"run": run}, "report")
