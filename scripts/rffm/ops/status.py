"""A table of the runs under a results tree, read from sentinels and small JSON files (never from data).

Planned epochs and the selection metric come from the workflow configuration (`--config`, or
config/config.yaml when its `results` is this tree); the tree itself does not record the plan. With
a config, only what it plans counts: epochs beyond its count and runs it no longer has are stale
(`rffm prune` lists and removes them), never part of a run's figures.

Integrity, fast by default: for every planned sentinel of the run, each output exists with its
recorded byte size, outputs up to QUICK_HASH_BYTES are re-hashed (sentinels, metrics, plots,
manifests, model cards), and every upstream sentinel the run consumed still carries the recorded
digest. Large files (checkpoints, datasets) are only size-checked; `full=True` (`rffm status --full`)
checks everything, exactly as `rffm verify` does.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from rffm.errors import IntegrityError
from rffm.ops.pairing import against_leader, val_correctness
from rffm.ops.verify import fixed, step_problems
from rffm.records import ledger, provenance
from rffm.records.layout import (
    EPOCHS,
    MANIFEST_NAME,
    PROVENANCE_NAME,
    QUALIFICATION,
    RUNNING,
    RUNS,
    SELECTION,
    SENTINEL_NAME,
    backbone_folder,
    cache_folder,
    dataset_folder,
    run_folder,
    split_file,
)
from rffm.records.plans import Judgment
from rffm.records.rebuild import rebuild_command
from rffm.records.sentinel import check_record, epoch_metrics, link_problems, read_sentinel, record_digest
from rffm.records.store import PosixStore
from rffm.training.selection import best as best_epoch

QUICK_HASH_BYTES = 1 << 20
STALE_S = 600  # a heartbeat this old: its step has reported no progress for 10 min (hung, or killed before it could remove it)


def _sentinel(path: Path) -> dict[str, Any] | None:
    try:
        return read_sentinel(path) if path.exists() else None
    except IntegrityError:
        return None


def quick_problems(sentinel_path: Path) -> list[str]:
    """Sizes of every output, hashes of the small ones, and the upstream links of one sentinel; each line ends with
    its fix (the step's rebuild, as `rffm verify` prints it)."""
    try:
        body = read_sentinel(sentinel_path)
    except IntegrityError as error:
        return [fixed(str(error), rebuild_command(sentinel_path, remove=True))]
    problems = []
    for name, record in body["outputs"].items():
        path = sentinel_path.parent / name
        if "bytes" not in record:  # JSON-content records: small, check them fully
            problem = check_record(path, record)
        elif not path.exists():
            problem = f"{path}: missing (recorded {record['bytes']} bytes)"
        elif path.stat().st_size != record["bytes"]:
            problem = f"{path}: size {path.stat().st_size} bytes, recorded {record['bytes']}"
        else:
            problem = check_record(path, record) if record["bytes"] <= QUICK_HASH_BYTES else None
        if problem:
            problems.append(problem)
    fix = rebuild_command(sentinel_path, remove=True) if problems else ""
    return [fixed(problem, fix) for problem in problems] + link_problems(sentinel_path, body, fix=True)


def integrity(run_dir: Path, planned: Judgment | None, full: bool = False) -> list[str]:
    """Problems found in the run's planned sentinels (fast check), or (full) what `rffm verify` finds in the
    run's folders and in the step folders it consumed (dataset, backbone, cache: followed through its links)."""
    problems = []
    results = run_dir.parent.parent
    sentinels = sorted(run_dir.rglob(SENTINEL_NAME))
    if full:
        sentinels += upstream_sentinels(results, sentinels)
    for sentinel_path in sentinels:
        if planned is not None and not planned.is_planned(sentinel_path.parent.relative_to(results).as_posix()):
            continue  # stale: not part of the current plan
        problems += step_problems(sentinel_path) if full else quick_problems(sentinel_path)
    return problems


def upstream_sentinels(results: Path, sentinels: list[Path]) -> list[Path]:
    """The sentinels outside the run that its sentinels link to, transitively (dataset, backbone, cache)."""
    seen = {path.resolve() for path in sentinels}
    found, todo = [], list(sentinels)
    while todo:
        path = todo.pop()
        for link in ((_sentinel(path) or {}).get("inputs") or {}).values():
            if not isinstance(link, dict) or not isinstance(link.get("path"), str):
                continue
            target = (path.parent / link["path"]).resolve()
            if target not in seen and target.exists() and target.is_relative_to(results.resolve()):
                seen.add(target)
                found.append(results / target.relative_to(results.resolve()))
                todo.append(target)
    return sorted(found)


def exposure(results_dir: Path, run_dir: Path, dataset: str | None) -> tuple[int, int] | None:
    """(times this run was qualified on its test split, distinct artifacts evaluated on that split so far), from the ledger."""
    qualification = _sentinel(run_dir / QUALIFICATION / SENTINEL_NAME)
    if qualification and "dataset" in qualification["inputs"]:
        dataset_dir = (run_dir / QUALIFICATION / qualification["inputs"]["dataset"]["path"]).parent.resolve()
    elif dataset:
        dataset_dir = results_dir / dataset_folder(dataset)
    else:
        return None
    dataset_sentinel = _sentinel(dataset_dir / SENTINEL_NAME)
    if dataset_sentinel is None or split_file("test") not in dataset_sentinel["outputs"]:
        return None
    try:
        found = ledger.entries(PosixStore(results_dir), record_digest(dataset_sentinel["outputs"][split_file("test")]))
    except IntegrityError:
        return None  # a damaged ledger shows as a problem of the run's qualification
    own = {entry["artifact_sha256"] for _, entry in found if entry.get("run") == run_dir.name}
    return len(own), len({entry["artifact_sha256"] for _, entry in found})


def recorded_epochs(run_dir: Path) -> int | None:
    """The epoch count the run's selection consumed (its own record of the plan, when no config says it)."""
    selection = _sentinel(run_dir / SELECTION / SENTINEL_NAME)
    if not selection or selection.get("selection", {}).get("kind") == "end_to_end":
        return None
    epochs = [role for role in selection["inputs"] if role.startswith("epoch")]
    return len(epochs) or None


def _restored_record(run_dir: Path, epoch: int) -> dict[str, Any]:
    folder = run_dir / EPOCHS / str(epoch)
    try:
        return provenance.read(folder / PROVENANCE_NAME, folder / SENTINEL_NAME)
    except IntegrityError:
        return {}  # a damaged record shows as a problem of the run


def restored(run_dir: Path, epochs: list[int]) -> list[int]:
    """Of these epochs, those restored from the memo rather than trained by this run (their provenance says so)."""
    return [epoch for epoch in epochs if _restored_record(run_dir, epoch).get("restored_from")]


def restored_members(run_dir: Path, epochs: list[int]) -> list[dict[str, Any]]:
    """Of a sweep's epochs trained here, those where the memo restored some members: {epoch, members (restored), of}."""
    found = []
    for epoch in epochs:
        record = _restored_record(run_dir, epoch)
        names, trained = record.get("members_restored") or [], record.get("members_trained") or []
        if names and not record.get("restored_from"):  # a whole restored epoch: every member, listed as an epoch
            found.append({"epoch": epoch, "members": list(names), "of": len(names) + len(trained)})
    return found


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


def run_status(run_dir: Path, plan: dict[str, Any] | None = None, full: bool = False, planned: Judgment | None = None) -> dict[str, Any]:
    """What one run has done so far, from its sentinels (only the planned epochs when the plan is known)."""
    plan = plan or {}
    epochs_planned = plan.get("train", {}).get("epochs") or (None if plan else recorded_epochs(run_dir))
    epochs = []
    selection_sentinel = _sentinel(run_dir / SELECTION / SENTINEL_NAME)
    chosen = selection_sentinel["selection"].get("member") if selection_sentinel else None  # of a sweep
    for sentinel_path in (run_dir / EPOCHS).glob(f"*/{SENTINEL_NAME}"):
        body = _sentinel(sentinel_path)
        metrics = epoch_metrics(body, chosen, plan.get("selection")) if body else None
        if body and (epochs_planned is None or metrics["epoch"] <= epochs_planned):
            epochs.append(metrics)
    epochs.sort(key=lambda m: m["epoch"])
    qualification_sentinel = _sentinel(run_dir / QUALIFICATION / SENTINEL_NAME)
    selection = selection_sentinel["selection"] if selection_sentinel else None
    qualification = qualification_sentinel["qualification"] if qualification_sentinel else None
    if selection and selection.get("kind") == "end_to_end":  # a reference: its epochs are the selection's candidates
        candidates = [c for c in selection["candidates"] if c.get("member") == chosen]  # of a sweep, the chosen member's
        epochs = [{"epoch": c["epoch"], selection["metric"]: c[selection["metric"]]} for c in candidates]
        epochs_planned = (selection.get("settings") or {}).get("train.epochs", epochs_planned)
    rule = {"metric": selection["metric"], "mode": selection["mode"]} if selection else plan.get("selection")
    best = best_epoch(epochs, rule) if rule else None
    manifest = run_dir / QUALIFICATION / MANIFEST_NAME
    return {
        "run": run_dir.name,
        "state": state_of(len(epochs), epochs_planned, selection is not None, qualification is not None),
        "epochs_done": len(epochs),
        "epochs_planned": epochs_planned,
        "metric": rule["metric"] if rule else "-",
        "best_value": best[rule["metric"]] if best else None,
        "best_epoch": best["epoch"] if best else None,
        "selected_epoch": selection["epoch"] if selection else None,
        "selected_member": chosen,
        "artifact_sha256": selection["artifact_sha256"] if selection else None,
        "test_accuracy": qualification["accuracy"] if qualification else None,
        "test_macro_f1": qualification["macro_f1"] if qualification else None,
        "test_high_snr": qualification.get("accuracy_high_snr") if qualification else None,
        "restored_epochs": restored(run_dir, [m["epoch"] for m in epochs]),
        "restored_members": restored_members(run_dir, [m["epoch"] for m in epochs]),
        "exposure": exposure(run_dir.parent.parent, run_dir, plan.get("dataset")),
        "problems": integrity(run_dir, planned, full),
        "manifest": str(manifest) if qualification and manifest.exists() else None,
    }


def collect(
    results_dir: str | Path, config: dict[str, Any] | Judgment | None = None, full: bool = False, now: float | None = None
) -> list[dict[str, Any]]:
    """Status of every planned run (started or not) and of the runs no plan speaks for; without a plan, of every
    run under results/runs. `config`: the judgment of the tree (rffm.records.plans.judge), or a config. Each row's
    `running`: the heartbeats of the steps it waits on (running_steps, aged at `now`, default the clock's)."""
    judgment = config if isinstance(config, Judgment) else Judgment(config or None)
    runs_dir = Path(results_dir) / RUNS
    configured = {**(judgment.config or {}).get("runs", {}), **(judgment.config or {}).get("references", {})}
    present = {d.name for d in runs_dir.iterdir() if d.is_dir()} if runs_dir.is_dir() else set()
    if judgment.config is None:
        rows = [run_status(runs_dir / name, None, full) for name in sorted(present)]
    else:
        rows = [run_status(runs_dir / name, configured.get(name), full, judgment) for name in sorted({*configured, *judgment.unknown})]
    attach_running(rows, running_steps(results_dir, now), configured, (judgment.config or {}).get("backbones", {}))
    attach_val_pairs(rows, runs_dir, configured)
    if judgment.config is None:
        return rows
    return rows + [{"run": name, "state": "stale"} for name in sorted(present - set(configured) - set(judgment.unknown))]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): it exists
        return True
    return True


def _counts(beat: dict[str, Any]) -> bool:
    numbers = [beat.get(key) for key in ("rate", "eta_s")]
    counts = isinstance(beat.get("done"), int) and isinstance(beat.get("total"), int)
    return counts and all(value is None or isinstance(value, int | float) for value in numbers)


def running_steps(results_dir: str | Path, now: float | None = None) -> list[dict[str, Any]]:
    """The heartbeats under results/running/ (rffm.runtime.progress), each with its file, its age at `now` and its
    state: running; stalled (no beat for STALE_S); gone (its process on this host no longer exists)."""
    folder = Path(results_dir) / RUNNING
    now = time.time() if now is None else now
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # removed meanwhile (its step ended), or not a heartbeat
        if not (isinstance(beat, dict) and isinstance(beat.get("updated_unix"), int | float) and _counts(beat)):
            continue
        age = max(0.0, now - beat["updated_unix"])
        here = beat.get("host") == socket.gethostname() and isinstance(beat.get("pid"), int)
        state = "gone" if here and not _alive(beat["pid"]) else "stalled" if age > STALE_S else "running"
        found.append({**beat, "file": str(path), "age_s": round(age, 1), "state": state})
    return found


def consumed_folders(plan: dict[str, Any], backbones: dict[str, Any]) -> set[str]:
    """The shared step folders (dataset, backbone and its pretraining dataset, cache) a planned run reads."""
    dataset, backbone = plan.get("dataset"), plan.get("backbone")
    folders = {dataset_folder(dataset)} if dataset else set()
    if backbone:
        folders |= {backbone_folder(backbone)} | ({cache_folder(dataset, backbone)} if dataset else set())
        if (backbones.get(backbone) or {}).get("dataset"):
            folders.add(dataset_folder(backbones[backbone]["dataset"]))
    return folders


def attach_running(rows: list[dict[str, Any]], beats: list[dict[str, Any]], plans: dict[str, Any], backbones: dict[str, Any]) -> None:
    """Give each row the heartbeats of its own steps and of the shared steps its plan reads; a heartbeat no row
    claims (no plan says who reads it) goes to every row, so that every running step is shown."""
    for row in rows:
        row["running"] = []
    for beat in beats:
        folder = str(beat.get("folder") or "")
        owners = [
            row
            for row in rows
            if folder.startswith(run_folder(row["run"]) + "/") or folder in consumed_folders(plans.get(row["run"]) or {}, backbones)
        ]
        for row in owners or rows:
            row["running"].append(beat)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def exposure_words(exposure: tuple[int, int] | None) -> str:
    """'once (split: 3 artifacts)': this run's own qualifications on its test split, then the split's count."""
    if exposure is None:
        return "-"
    own, split = exposure
    times = {0: "never", 1: "once"}.get(own, f"{own} times")
    return f"{times} (split: {split} artifact{'s' if split != 1 else ''})"


def _spans(numbers: list[int]) -> str:
    """1,2,3,5 as '1-3,5'."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def restored_words(row: dict[str, Any]) -> str:
    """'epochs 1-3; epoch 4: 2 of 3 members': the epochs the memo restored, then the sweep epochs it restored members of."""
    epochs = row.get("restored_epochs") or []
    parts = [f"epoch{'s' if len(epochs) > 1 else ''} {_spans(epochs)}"] if epochs else []
    parts += [f"epoch {m['epoch']}: {len(m['members'])} of {m['of']} members" for m in row.get("restored_members") or []]
    return "; ".join(parts) or "-"


def duration_words(seconds: float) -> str:
    """'45 s', '18 min', '2 h 5 min'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min"


def _rate_words(rate: float) -> str:
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.1f}" if rate >= 1 else f"{rate:.2g}"


def running_line(beat: dict[str, Any]) -> str:
    """One running step, from its heartbeat: what, how far, how fast, how long yet (or why it may no longer run)."""
    done, total, unit = beat.get("done", 0), beat.get("total", 0), beat.get("unit", "it")
    percent = f" ({100 * done / total:.0f}%)" if total else ""
    what = f"{beat.get('name', '?')}" + (f" ({beat['folder']})" if beat.get("folder") else "")
    count = f"{done:,}/{total:,} {unit}{percent}"
    age = duration_words(beat["age_s"])
    if beat["state"] == "gone":
        return (
            f"not running: {what} stopped at {count} {age} ago: its process {beat['pid']} on this host is gone (killed?); "
            f"its heartbeat {beat['file']} is left over (remove it)"
        )
    if beat["state"] == "stalled":
        return f"stalled?: {what} at {count}, no progress reported for {age} (hung, or its job was killed: see its log)"
    rate = f", {_rate_words(beat['rate'])} {unit}/s" if beat.get("rate") else ""
    left = f", about {duration_words(beat['eta_s'])} left" if beat.get("eta_s") is not None else ", time left not known yet"
    return f"running: {what} {count}{rate}{left} (updated {age} ago)"


def attach_val_pairs(rows: list[dict[str, Any]], runs_dir: Path, plans: dict[str, Any]) -> None:
    """Give each row `val_vs_leader`: its paired val difference (± SE) to the best selected row of its data set on val
    (rffm.ops.pairing; None: not selected, no per-example val record, or the leader itself: `val_leader`)."""
    by_dataset: dict[Any, dict[str, Any]] = {}
    for r in rows:
        vector = val_correctness(runs_dir / r["run"]) if r.get("selected_epoch") is not None else None
        by_dataset.setdefault((plans.get(r["run"]) or {}).get("dataset"), {})[r["run"]] = vector
    pairs, scored = {}, set()
    for correct in by_dataset.values():
        scores = {run: float(vector.mean()) for run, vector in correct.items() if vector is not None and len(vector)}
        pairs |= against_leader(correct, scores)
        scored |= scores.keys()
    for r in rows:
        r["val_vs_leader"] = pairs[r["run"]]
        r["val_leader"] = r["run"] in scored and pairs[r["run"]] is None


def val_pair_words(row: dict[str, Any]) -> str:
    """'-0.008 ± 0.004 (rf)': the val difference to the leader and its paired SE; 'leader'; '-': none."""
    pair = row.get("val_vs_leader")
    if pair is None:
        return "leader" if row.get("val_leader") else "-"
    return f"{pair['difference']:+.3f} ± {pair['se']:.3f} ({pair['run']})"


def render(rows: list[dict[str, Any]], full: bool = False) -> str:
    """Plain-text table, then one line per running step, then every integrity problem, then the stale runs, then one
    manifest path per qualified run."""
    stale = [r["run"] for r in rows if r["state"] == "stale"]
    rows = [r for r in rows if r["state"] != "stale"]
    high = next((r["test_high_snr"]["min_snr_db"] for r in rows if r.get("test_high_snr")), 10)
    metrics = sorted({r["metric"] for r in rows}) or ["-"]
    mixed = len(metrics) > 1
    best_header = "best val metric" if mixed else f"best {metrics[0]}"
    header = ["run", "state", "epochs", f"{best_header} @epoch", "selected", "val vs leader ± paired SE", "artifact", "test acc"]
    header += [f"acc >={high:g} dB", "macro-F1", "test exposure: run (split)", "restored from memo"]
    header.append("verify" + (" (full)" if full else " (fast)"))
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
                _fmt(r["selected_epoch"]) + (f" [{r['selected_member']}]" if r.get("selected_member") else ""),
                val_pair_words(r),
                (r["artifact_sha256"] or "-")[:12],
                _fmt(r["test_accuracy"]),
                _fmt(r["test_high_snr"]["accuracy"] if r.get("test_high_snr") else None),
                _fmt(r["test_macro_f1"]),
                exposure_words(r["exposure"]),
                restored_words(r),  # epochs (and sweep members) restored from the memo, not trained by this run
                f"BROKEN ({len(r['problems'])})" if r["problems"] else "ok",
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    beats = {beat["file"]: beat for r in rows for beat in r.get("running") or []}  # a shared step: once, not per run
    lines += [running_line(beat) for _, beat in sorted(beats.items())]
    lines += [f"BROKEN {problem}" for r in rows for problem in r["problems"]]
    lines += [f"stale: {run_folder(name)} (not in the config; `rffm prune` removes it)" for name in stale]
    lines += [f"run manifest: {r['manifest']}" for r in rows if r["manifest"]]
    return "\n".join(lines)
