"""A table of the runs under a results tree, read from sentinels and small JSON files (never from data).

Planned epochs and the selection metric come from the workflow configuration (`--config`, or
config/config.yaml when its `results` is this tree); the tree itself does not record the plan.

Integrity, fast by default: for every sentinel of the run, each output exists with its recorded
byte size, outputs up to QUICK_HASH_BYTES are re-hashed (sentinels, metrics, plots, manifests,
model cards), and every upstream sentinel the run consumed still carries the recorded digest.
Large files (checkpoints, artifacts above the limit, datasets, caches) are only size-checked;
`full=True` (`rffm status --full`) re-hashes everything, exactly as `rffm verify` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rffm import config as rffm_config
from rffm.errors import IntegrityError
from rffm.records import ledger
from rffm.records.layout import SENTINEL_NAME, split_file
from rffm.records.sentinel import check_record, read_sentinel, record_digest, sentinel_problems
from rffm.records.verify import link_problems
from rffm.training.selection import best as best_epoch

QUICK_HASH_BYTES = 1 << 20


def _sentinel(path: Path) -> dict[str, Any] | None:
    try:
        return read_sentinel(path) if path.exists() else None
    except IntegrityError:
        return None


def plan_for(results_dir: str | Path, config_paths: list[str | Path] | None) -> dict[str, Any]:
    """The workflow config that plans this tree: the given files, else config/config.yaml when its `results` is this tree."""
    if config_paths:
        return rffm_config.load(config_paths)
    default = Path("config/config.yaml")
    if not default.exists():
        return {}
    config = rffm_config.load([default])
    return config if Path(config["results"]).resolve() == Path(results_dir).resolve() else {}


def quick_problems(sentinel_path: Path) -> list[str]:
    """Sizes of every output, hashes of the small ones, and the upstream links of one sentinel."""
    body = read_sentinel(sentinel_path)
    problems = []
    for name, record in body["outputs"].items():
        path = sentinel_path.parent / name
        if "bytes" not in record:  # JSON-content and diagnostics records: small, check them fully
            if problem := check_record(path, record):
                problems.append(problem)
        elif not path.exists():
            problems.append(f"{path}: missing (recorded {record['bytes']} bytes)")
        elif path.stat().st_size != record["bytes"]:
            problems.append(f"{path}: size {path.stat().st_size} bytes, recorded {record['bytes']}")
        elif record["bytes"] <= QUICK_HASH_BYTES and (problem := check_record(path, record)):
            problems.append(problem)
    return problems + link_problems(sentinel_path, None)


def integrity(run_dir: Path, full: bool = False) -> list[str]:
    """Problems found in the run's sentinels (fast check, or the full `rffm verify` check)."""
    problems = []
    for sentinel_path in sorted(run_dir.rglob(SENTINEL_NAME)):
        try:
            problems += (sentinel_problems(sentinel_path) + link_problems(sentinel_path, None)) if full else quick_problems(sentinel_path)
        except IntegrityError as exc:
            problems.append(str(exc))
    return problems


def exposure(results_dir: Path, qualification: dict[str, Any] | None, run_dir: Path, dataset: str | None) -> int | None:
    """Distinct artifacts evaluated on the run's test split so far, from the split's ledger."""
    if qualification and "dataset" in qualification["inputs"]:
        dataset_dir = (run_dir / "qualification" / qualification["inputs"]["dataset"]["path"]).parent.resolve()
    elif dataset:
        dataset_dir = results_dir / "datasets" / dataset
    else:
        return None
    dataset_sentinel = _sentinel(dataset_dir / SENTINEL_NAME)
    if dataset_sentinel is None or split_file("test") not in dataset_sentinel["outputs"]:
        return None
    return ledger.exposure_count(dataset_dir / ledger.LEDGER_NAME, record_digest(dataset_sentinel["outputs"][split_file("test")]))


def state_of(epochs_done: int, planned: int | None, selected: bool, qualified: bool) -> str:
    """pending, training, trained, selected or qualified (training again when more epochs are planned)."""
    if epochs_done == 0:
        return "pending"
    if planned is not None and epochs_done < planned:
        return "training"
    if qualified:
        return "qualified"
    if selected:
        return "selected"
    return "trained" if planned is not None else "training"


def run_status(run_dir: Path, plan: dict[str, Any] | None = None, full: bool = False) -> dict[str, Any]:
    """What one run has done so far, from its sentinels."""
    plan = plan or {}
    epochs = []
    for sentinel_path in (run_dir / "epochs").glob(f"*/{SENTINEL_NAME}"):
        body = _sentinel(sentinel_path)
        if body:
            epochs.append(body["metrics"])
    epochs.sort(key=lambda m: m["epoch"])
    selection_sentinel = _sentinel(run_dir / "selection" / SENTINEL_NAME)
    qualification_sentinel = _sentinel(run_dir / "qualification" / SENTINEL_NAME)
    selection = selection_sentinel["selection"] if selection_sentinel else None
    qualification = qualification_sentinel["qualification"] if qualification_sentinel else None
    rule = {"metric": selection["metric"], "mode": selection["mode"]} if selection else plan.get("selection")
    best = best_epoch(epochs, rule) if rule else None
    planned = plan.get("train", {}).get("epochs")
    manifest = run_dir / "qualification/run_manifest.json"
    problems = integrity(run_dir, full)
    return {
        "run": run_dir.name,
        "state": state_of(len(epochs), planned, selection is not None, qualification is not None),
        "epochs_done": len(epochs),
        "epochs_planned": planned,
        "metric": rule["metric"] if rule else "-",
        "best_value": best[rule["metric"]] if best else None,
        "best_epoch": best["epoch"] if best else None,
        "selected_epoch": selection["epoch"] if selection else None,
        "artifact_sha256": selection["artifact_sha256"] if selection else None,
        "test_accuracy": qualification["accuracy"] if qualification else None,
        "test_macro_f1": qualification["macro_f1"] if qualification else None,
        "test_high_snr": qualification.get("accuracy_high_snr") if qualification else None,
        "exposure_count": exposure(run_dir.parent.parent, qualification_sentinel, run_dir, plan.get("dataset")),
        "problems": problems,
        "manifest": str(manifest) if qualification and manifest.exists() else None,
    }


def collect(results_dir: str | Path, config: dict[str, Any] | None = None, full: bool = False) -> list[dict[str, Any]]:
    """Status of every run under results/runs, and of configured runs that have not started."""
    runs_dir = Path(results_dir) / "runs"
    planned = (config or {}).get("runs", {})
    present = {d.name for d in runs_dir.iterdir() if d.is_dir()} if runs_dir.is_dir() else set()
    names = sorted(present | set(planned))
    return [run_status(runs_dir / name, planned.get(name), full) for name in names]


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render(rows: list[dict[str, Any]], full: bool = False) -> str:
    """Plain-text table, then every integrity problem, then one manifest path per qualified run."""
    high = next((r["test_high_snr"]["min_snr_db"] for r in rows if r.get("test_high_snr")), 10)
    metrics = sorted({r["metric"] for r in rows})
    mixed = len(metrics) > 1
    best_header = "best val metric" if mixed else f"best {metrics[0]}"
    header = ["run", "state", "epochs", f"{best_header} @epoch", "selected", "artifact", "test acc"]
    header += [f"acc >={high:g} dB", "macro-F1", "test exposure", "verify" + (" (full)" if full else " (fast)")]
    table = [header]
    for r in rows:
        best = "-" if r["best_value"] is None else f"{_fmt(r['best_value'])} @{r['best_epoch']}"
        if mixed and r["best_value"] is not None:
            best = f"{r['metric']} {best}"
        table.append(
            [
                r["run"],
                r["state"],
                f"{r['epochs_done']}/{_fmt(r['epochs_planned']) if r['epochs_planned'] is not None else '?'}",
                best,
                _fmt(r["selected_epoch"]),
                (r["artifact_sha256"] or "-")[:12],
                _fmt(r["test_accuracy"]),
                _fmt(r["test_high_snr"]["accuracy"] if r.get("test_high_snr") else None),
                _fmt(r["test_macro_f1"]),
                _fmt(r["exposure_count"]),
                f"BROKEN ({len(r['problems'])})" if r["problems"] else "ok",
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines += [f"BROKEN {problem}" for r in rows for problem in r["problems"]]
    lines += [f"run manifest: {r['manifest']}" for r in rows if r["manifest"]]
    return "\n".join(lines)
