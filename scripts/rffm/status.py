"""A table of the runs under a results tree, read from sentinels (never from data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm.errors import IntegrityError
from rffm.sentinel import read_sentinel


def _sentinel(path: Path) -> dict[str, Any] | None:
    try:
        return read_sentinel(path) if path.exists() else None
    except IntegrityError:
        return None


def run_status(run_dir: Path) -> dict[str, Any]:
    """What one run has done so far, from its sentinels."""
    epochs = []
    for sentinel_path in (run_dir / "epochs").glob("*/sentinel.json"):
        body = _sentinel(sentinel_path)
        if body:
            epochs.append(body["metrics"])
    epochs.sort(key=lambda m: m["epoch"])
    selection = _sentinel(run_dir / "selection/sentinel.json")
    qualification = _sentinel(run_dir / "qualification/sentinel.json")
    manifest = run_dir / "qualification/run_manifest.json"
    return {
        "run": run_dir.name,
        "epochs_done": len(epochs),
        "best_val_accuracy": max((m["val_accuracy"] for m in epochs), default=None),
        "selected_epoch": selection["selection"]["epoch"] if selection else None,
        "artifact_sha256": selection["selection"]["artifact_sha256"] if selection else None,
        "test_accuracy": qualification["qualification"]["accuracy"] if qualification else None,
        "test_macro_f1": qualification["qualification"]["macro_f1"] if qualification else None,
        "test_high_snr": qualification["qualification"].get("accuracy_high_snr") if qualification else None,
        "manifest": str(manifest) if qualification and manifest.exists() else None,
    }


def collect(results_dir: str | Path) -> list[dict[str, Any]]:
    """Status of every run under results/runs."""
    runs = Path(results_dir) / "runs"
    return [run_status(d) for d in sorted(runs.iterdir()) if d.is_dir()] if runs.is_dir() else []


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render(rows: list[dict[str, Any]]) -> str:
    """Plain-text table, then one manifest path per qualified run."""
    high = next((r["test_high_snr"]["min_snr_db"] for r in rows if r.get("test_high_snr")), 10)
    header = ["run", "epochs", "best val acc", "selected", "artifact", "test acc", f"test acc >={high:g} dB", "test macro-F1"]
    table = [header] + [
        [
            r["run"],
            _fmt(r["epochs_done"]),
            _fmt(r["best_val_accuracy"]),
            _fmt(r["selected_epoch"]),
            (r["artifact_sha256"] or "-")[:12],
            _fmt(r["test_accuracy"]),
            _fmt(r["test_high_snr"]["accuracy"] if r.get("test_high_snr") else None),
            _fmt(r["test_macro_f1"]),
        ]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines += [f"run manifest: {r['manifest']}" for r in rows if r["manifest"]]
    return "\n".join(lines)
