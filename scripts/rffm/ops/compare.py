"""Floor | frozen backbone | end-to-end: the qualified runs and references of a results tree side by side.

Read from each qualified run's manifest and its steps' provenance only (never from data). Roles: a run on
a backbone of source `random` is the floor, a run on any other backbone the frozen backbone, a reference
(`references:` in the config) the end-to-end CNN. Step time is the sum of the recorded durations of the
steps that produced the result after staging (each step's own work: not its process start nor Snakemake's
scheduling): backbone, cache, every epoch, selection and qualification for a run;
training (with selection) and qualification for a reference. A backbone or cache several runs share
counts in each of them.

What makes the comparison fair or not is in the table too. Tuning budget: the members a row's selection tried on
val (a sweep's grid, 1 otherwise) and the optimizer steps each member took (a head: the global step its last
epoch recorded; the end-to-end CNN, which records none: ceil(train rows / batch size) x epochs). Each row's
difference to the floor and to the end-to-end reference of its labels and test split, with the paired standard
error (both scored on the same test examples, from the per-example correctness qualification records:
McNemar's sqrt((b + c) - (b - c)^2 / n) / n, b and c the discordant counts). Exposure: a test split the ledger
holds more qualifications of than the table shows gets one line under the table (figures on it are optimistic:
the table may show the best of several looks at the same test data).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from rffm.backbone_kinds import RANDOM
from rffm.errors import IntegrityError
from rffm.model.metrics import CORRECT_KEY, unpack_correct
from rffm.records import provenance
from rffm.records.layout import (
    EPOCHS,
    LEDGER,
    MANIFEST_NAME,
    METRICS_NAME,
    PROVENANCE_NAME,
    QUALIFICATION,
    SELECTION,
    SENTINEL_NAME,
    backbone_folder,
    cache_folder,
    qualification_folder,
    split_file,
)
from rffm.records.ledger import split_id
from rffm.records.sentinel import epoch_metrics, read_sentinel
from rffm.records.store import PosixStore

ROLES = ("floor", "frozen backbone", "end-to-end")
# the counterparts every row is compared with (its key in a row, the column's title)
COUNTERPARTS = (("floor", "vs_floor", "vs floor"), ("end-to-end", "vs_end_to_end", "vs end-to-end"))


def _duration(directory: Path) -> float | None:
    try:
        return float(provenance.read(directory / PROVENANCE_NAME, directory / SENTINEL_NAME)["duration_s"])
    except (IntegrityError, FileNotFoundError, KeyError, TypeError, ValueError):
        return None


def wall_time(results: Path, run_dir: Path, manifest: dict[str, Any]) -> float | None:
    """Seconds of the steps behind one qualified result (None when a record is missing)."""
    if manifest.get("kind") == "end_to_end":
        folders = [run_dir / SELECTION, run_dir / QUALIFICATION]
    else:
        dataset, backbone = manifest["dataset"]["name"], manifest["backbone"]["name"]
        epochs = [run_dir / EPOCHS / str(e["epoch"]) for e in manifest["training"]["epochs"]]
        folders = [results / backbone_folder(backbone), results / cache_folder(dataset, backbone), *epochs]
        folders += [run_dir / SELECTION, run_dir / QUALIFICATION]
    durations = [_duration(folder) for folder in folders]
    return None if any(d is None for d in durations) else round(sum(durations), 1)


def role_of(manifest: dict[str, Any]) -> str:
    if manifest.get("kind") == "end_to_end":
        return "end-to-end"
    return "floor" if manifest["backbone"]["source"] == RANDOM else "frozen backbone"


def collect(
    results_dir: str | Path, config: dict[str, Any] | None = None, names: list[str] | None = None, unknown: list[str] = ()
) -> list[dict[str, Any]]:
    """One row per qualified run or reference (of the config's and the `unknown` runs no plan speaks for, or those
    named, when given): by labels per (class, SNR) (k ascending, all last), then floor first. Besides the results: the
    test split's digest (split) and the runs the ledger holds a qualification of on it (split_qualifications), the
    tuning budget (members, optimizer_steps, optimizer_steps_computed) and the paired differences to the floor and
    the end-to-end reference (vs_floor, vs_end_to_end: {run, difference, se, n, discordant}, or None)."""
    from rffm.ops.status import exposure

    results = Path(results_dir)
    if names is None and config:
        names = [*config.get("runs", {}), *config.get("references", {}), *unknown]
    rows, correct = [], {}
    for path in sorted(results.glob(f"{qualification_folder('*')}/{MANIFEST_NAME}")):
        run_dir = path.parents[1]
        if (names is not None and run_dir.name not in names) or not (path.parent / SENTINEL_NAME).exists():
            continue
        manifest = json.loads(path.read_text())
        quality = manifest["qualification"]
        rows.append(
            {
                "run": run_dir.name,
                "role": role_of(manifest),
                "dataset": manifest["dataset"]["name"],
                "model": manifest.get("backbone", {}).get("name") or f"cnn ({manifest['model']['input']} input)",
                "labels": manifest["training"]["params"].get("labels_per_class_snr"),  # per (class, SNR); None: all
                "accuracy": quality["accuracy"],
                "accuracy_high_snr": quality["accuracy_high_snr"]["accuracy"],
                "high_snr_db": quality["accuracy_high_snr"]["min_snr_db"],
                "macro_f1": quality["macro_f1"],
                "wall_s": wall_time(results, run_dir, manifest),
                "exposure_count": quality["exposure_count"],
                "member": manifest.get("selection", {}).get("member"),  # a sweep's chosen member
                "exposure": exposure(results, run_dir, None),
                "split": manifest["dataset"].get("splits", {}).get(split_file("test")),  # the test split's digest
                "members": members_tried(run_dir),
                **optimizer_steps(run_dir, manifest),
            }
        )
        correct[run_dir.name] = correctness(run_dir / QUALIFICATION, quality.get("test_count"))
    rows = sorted(rows, key=lambda r: (r["labels"] is None, r["labels"] or 0, ROLES.index(r["role"]), r["run"]))
    store = PosixStore(results)
    for r in rows:
        r["split_qualifications"] = split_qualifications(store, r["split"])
        for role, key, _ in COUNTERPARTS:
            r[key] = paired_difference(r, rows, role, correct)
    return rows


def _sentinel_or_none(path: Path) -> dict[str, Any] | None:
    try:
        return read_sentinel(path)
    except (IntegrityError, FileNotFoundError, ValueError):
        return None


def members_tried(run_dir: Path) -> int | None:
    """How many members the run's selection compared on val: a sweep's grid, 1 otherwise (None: no selection record)."""
    selection = _sentinel_or_none(run_dir / SELECTION / SENTINEL_NAME)
    if selection is None or not isinstance(selection.get("selection"), dict):
        return None
    return len({candidate.get("member") for candidate in selection["selection"].get("candidates", [])}) or 1


def optimizer_steps(run_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """{optimizer_steps: of each member over all its epochs, optimizer_steps_computed}: a head's from the global step its
    last epoch recorded; the end-to-end CNN's, which records none, ceil(train rows / batch size) x epochs from its
    recorded params (of a reference's sweep, its chosen member's) and train rows (the labelled ones when label-scarce).
    None where a record is missing."""
    try:
        if manifest.get("kind") == "end_to_end":  # of a sweep, the chosen member's (its epochs may be swept)
            params = {**manifest["training"]["params"], **chosen_train(manifest.get("selection", {}).get("settings") or {})}
            labels = (_sentinel_or_none(run_dir / SELECTION / SENTINEL_NAME) or {}).get("labels") or {}
            rows = labels.get("labelled_rows") or manifest["dataset"]["counts"]["train"]
            return {"optimizer_steps": math.ceil(rows / params["batch_size"]) * params["epochs"], "optimizer_steps_computed": True}
        last = manifest["training"]["epochs"][-1]["epoch"]
        body = read_sentinel(run_dir / EPOCHS / str(last) / SENTINEL_NAME)
        steps = epoch_metrics(body, manifest.get("selection", {}).get("member"))["global_step"]
        return {"optimizer_steps": int(steps), "optimizer_steps_computed": False}
    except (IntegrityError, FileNotFoundError, KeyError, IndexError, TypeError, ValueError):
        return {"optimizer_steps": None, "optimizer_steps_computed": False}


def chosen_train(settings: dict[str, Any]) -> dict[str, Any]:
    """A sweep member's train settings ({"train.epochs": 20} -> {"epochs": 20}; the CNN's keys are not nested)."""
    return {key.removeprefix("train."): value for key, value in settings.items() if key.count(".") == 1}


def correctness(qualification_dir: Path, count: int | None) -> np.ndarray | None:
    """Which test examples a qualified result got right (row order), as its qualification recorded them; None for a
    result qualified before they were recorded."""
    try:
        metrics = json.loads((qualification_dir / METRICS_NAME).read_text())
        return unpack_correct(metrics[CORRECT_KEY], int(count if count is not None else metrics["count"]))
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return None


def split_qualifications(store: PosixStore, split_digest: str | None) -> list[str]:
    """The runs the ledger holds a qualification of on this test split (one entry each, damaged ones included)."""
    if not split_digest:
        return []
    keys = store.list(f"{LEDGER}/{split_id(split_digest)}")
    return sorted(Path(key).name.removesuffix(".json") for key in keys if key.endswith(".json"))


def paired_se(mine: np.ndarray, theirs: np.ndarray) -> dict[str, Any]:
    """Difference in accuracy (mine - theirs) on the same n examples and its paired (McNemar) standard error,
    sqrt((b + c) - (b - c)^2 / n) / n, b: examples only mine got right, c: only theirs."""
    n = len(mine)
    b, c = int((mine & ~theirs).sum()), int((~mine & theirs).sum())
    se = math.sqrt(max(0.0, (b + c) - (b - c) ** 2 / n)) / n if n else float("nan")
    return {"difference": (b - c) / n if n else float("nan"), "se": se, "n": n, "discordant": [b, c]}


def paired_difference(row: dict[str, Any], rows: list[dict[str, Any]], role: str, correct: dict[str, np.ndarray | None]) -> dict | None:
    """This row against the first row of `role` with its labels and test split: {run, difference, se, n, discordant}
    (se None where either qualification recorded no per-example correctness); None for a row of that role or without one."""
    if row["role"] == role or not row["split"]:
        return None
    other = next((r for r in rows if r["role"] == role and r["labels"] == row["labels"] and r["split"] == row["split"]), None)
    if other is None:
        return None
    mine, theirs = correct.get(row["run"]), correct.get(other["run"])
    if mine is None or theirs is None or len(mine) != len(theirs):
        return {"run": other["run"], "difference": row["accuracy"] - other["accuracy"], "se": None, "n": None, "discordant": None}
    return {"run": other["run"], **paired_se(mine, theirs)}


def exposure_flags(rows: list[dict[str, Any]]) -> list[str]:
    """One line per test split the ledger holds more qualifications of than the table shows."""
    names = {}
    for r in rows:
        if r["split"]:
            names.setdefault(r["split"], []).append(r)
    datasets = [shown[0]["dataset"] for shown in names.values()]
    lines = []
    for split, shown in names.items():
        used = shown[0]["split_qualifications"]
        if len(used) <= len(shown):
            continue
        name = shown[0]["dataset"] + (f" ({split_id(split)[:12]})" if datasets.count(shown[0]["dataset"]) > 1 else "")
        hidden = sorted(set(used) - {r["run"] for r in shown})
        lines.append(
            f"test split of {name}: this split was used for {len(used)} qualifications, {len(shown)} shown: figures on it are "
            f"optimistic (not shown: {', '.join(hidden)})"
        )
    return lines


def labels_text(labels: int | None) -> str:
    """The labels column: k labelled train examples per (class, SNR), or all of them."""
    return "all" if labels is None else str(labels)


def difference_text(paired: dict[str, Any] | None) -> str:
    """'+0.079 ± 0.012': the difference in test accuracy and its paired SE ('± ?': no per-example record; '-': none)."""
    if paired is None:
        return "-"
    se = "?" if paired["se"] is None else f"{paired['se']:.3f}"
    return f"{paired['difference']:+.3f} ± {se}"


def render(rows: list[dict[str, Any]]) -> str:
    """A plain-text table, one row per result (labels: k per (class, SNR) or all), one line per test split the table
    shows fewer qualifications of than the ledger holds, and lines saying what the time, budget and difference columns count."""
    high = rows[0]["high_snr_db"] if rows else 10
    from rffm.ops.status import exposure_words

    header = ["labels", "role", "run", "dataset", "backbone / model", "test acc", f"acc >={high:g} dB", "macro-F1"]
    header += [f"{title} ± paired SE" for _, _, title in COUNTERPARTS]
    header += ["val members", "optimizer steps (* computed)", "step time", "test exposure: run (split)"]
    table = [header]
    for r in rows:
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f} s"
        steps = "-" if r.get("optimizer_steps") is None else f"{r['optimizer_steps']}{'*' if r.get('optimizer_steps_computed') else ''}"
        table.append(
            [
                labels_text(r.get("labels")),
                r["role"],
                r["run"] + (f" [{r['member']}]" if r.get("member") else ""),
                r["dataset"],
                r["model"],
                f"{r['accuracy']:.3f}",
                f"{r['accuracy_high_snr']:.3f}",
                f"{r['macro_f1']:.3f}",
                *(difference_text(r.get(key)) for _, key, _ in COUNTERPARTS),
                "-" if r.get("members") is None else str(r["members"]),
                steps,
                wall,
                exposure_words(r["exposure"]),
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines += exposure_flags(rows)
    lines.append(
        "step time: the sum of the recorded durations of the steps after staging (backbone, cache, epochs, selection, "
        "qualification; end-to-end: training, qualification), each from its work's start to its end: not the process "
        "start (Python, torch imports) nor Snakemake's scheduling, so less than the run's wall-clock time"
    )
    lines.append(
        "tuning budget: val members: the settings selection compared on val (a sweep's grid, 1 otherwise); optimizer steps: "
        "of each member over all its epochs, as its last epoch recorded them (*: computed as ceil(train rows / batch size) x "
        "epochs, the end-to-end CNN records none; a reference's sweep of epochs: its chosen member's)"
    )
    lines.append(
        "vs floor, vs end-to-end: test accuracy minus that of the floor / end-to-end row of the same labels and test split, "
        "± the paired (McNemar) standard error sqrt((b + c) - (b - c)^2 / n) / n over the n test examples both were scored on, "
        "b and c the examples only one of the two got right (?: a result qualified before per-example correctness was recorded)"
    )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Grouped bars: test accuracy, high-SNR accuracy and macro-F1 of every result; wall time in the legend."""
    from rffm.report.png import plt, save_png

    metrics = [
        ("accuracy", "test accuracy"),
        ("accuracy_high_snr", f"accuracy >= {rows[0]['high_snr_db']:g} dB" if rows else "high SNR"),
        ("macro_f1", "macro-F1"),
    ]
    colors = {"floor": "#9e9e9e", "frozen backbone": "#1f77b4", "end-to-end": "#d62728"}
    hatches = ["", "//", "..", "xx"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / max(1, len(rows))
    x = np.arange(len(metrics))
    for i, r in enumerate(rows):
        values = [r[key] for key, _ in metrics]
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f} s"
        same_role = [q for q in rows[:i] if q["role"] == r["role"]]
        bars = ax.bar(
            x + (i - (len(rows) - 1) / 2) * width,
            values,
            width,
            color=colors[r["role"]],
            hatch=hatches[len(same_role) % len(hatches)],
            edgecolor="white",
            label=f"{r['role']}: {r['run']}, labels {labels_text(r.get('labels'))} ({wall})",
        )
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=1)
    ax.set_xticks(x, [label for _, label in metrics])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("test split")
    flags = exposure_flags(rows)  # a test split looked at more often than the figure shows
    ax.set_title(
        "\n".join(["floor | frozen backbone | end-to-end (test split; wall time in brackets)", *flags]), fontsize=9 if flags else None
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(3, max(1, len(rows))), frameon=False)
    save_png(fig, path)
