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

Seeds (rffm.config.seeds): the runs of one seed group (`baseline`, `baseline-seed1`, `baseline-pseed1`, ...) are one
row of the table, their mean, sd and min-max over seeds. The reference every row is measured against is the
strongest: of the end-to-end groups with the row's labels and test split, the one with the highest mean val accuracy
(never test). A group's difference to another is the difference of their mean test accuracies, its paired SE that of
the per-example mean correctness (McNemar's for one seed each), its seed spread sqrt(sd_a^2 + sd_b^2), the sd of the
difference between one seed of each; it is a lead (or behind) only beyond both 2 paired SEs and the seed spread.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from rffm.backbone_kinds import RANDOM
from rffm.config.seeds import group_of
from rffm.errors import IntegrityError, RffmError
from rffm.model.metrics import CORRECT_KEY, unpack_correct
from rffm.ops.pairing import paired_se, val_correctness
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
    run_folder,
    split_file,
)
from rffm.records.ledger import split_id
from rffm.records.sentinel import epoch_metrics, read_sentinel
from rffm.records.store import PosixStore

ROLES = ("floor", "frozen backbone", "end-to-end")
# the counterparts every row is compared with (its key in a row and a group, the column's title)
COUNTERPARTS = (("floor", "vs_floor", "vs floor"), ("end-to-end", "vs_end_to_end", "vs strongest reference"))


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
                "group": group_of(run_dir.name),
                "seed": manifest["training"]["params"].get("seed"),
                "role": role_of(manifest),
                "dataset": manifest["dataset"]["name"],
                "model": manifest.get("backbone", {}).get("name") or f"cnn ({manifest['model']['input']} input)",
                "labels": manifest["training"]["params"].get("labels_per_class_snr"),  # per (class, SNR); None: all
                "accuracy": quality["accuracy"],
                "accuracy_high_snr": quality["accuracy_high_snr"]["accuracy"],
                "high_snr_db": quality["accuracy_high_snr"]["min_snr_db"],
                "macro_f1": quality["macro_f1"],
                "val_accuracy": chosen_val_accuracy(run_dir, manifest),
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
    rows = sorted(rows, key=lambda r: (r["labels"] is None, r["labels"] or 0, ROLES.index(r["role"]), r["group"], r["run"]))
    store = PosixStore(results)
    strongest = strongest_references(rows)
    for r in rows:
        r["split_qualifications"] = split_qualifications(store, r["split"])
        r["vs_floor"] = paired_difference(r, rows, "floor", correct)
        r["vs_end_to_end"] = paired_difference(r, rows, "end-to-end", correct, strongest.get(_key(r)))
    return rows


def _key(row: dict[str, Any]) -> tuple[Any, Any]:
    """What makes two results comparable: the same labels per (class, SNR) and the same test split."""
    return row["labels"], row["split"]


def chosen_val_accuracy(run_dir: Path, manifest: dict[str, Any]) -> float | None:
    """The val accuracy of the epoch (and member) selection chose, as the run's records give it (None: not recorded)."""
    from rffm.ops.tracking import epoch_history

    selection = manifest.get("selection", {})
    if selection.get("metric") == "val_accuracy":
        return float(selection["value"])
    try:
        history = epoch_history(run_dir, manifest)
    except (OSError, ValueError, KeyError):
        return None
    return next((float(e["val_accuracy"]) for e in history if e.get("epoch") == selection.get("epoch") and "val_accuracy" in e), None)


def strongest_references(rows: list[dict[str, Any]]) -> dict[tuple[Any, Any], str]:
    """The strongest end-to-end group of each (labels, test split): the highest mean val accuracy over its seeds
    (ties: the first by name; a group without a val figure never wins)."""
    means: dict[tuple[Any, Any], dict[str, list[float]]] = {}
    for r in rows:
        if r["role"] == "end-to-end" and r["split"] and r.get("val_accuracy") is not None:
            means.setdefault(_key(r), {}).setdefault(r["group"], []).append(r["val_accuracy"])
    return {key: max(sorted(groups), key=lambda g: float(np.mean(groups[g]))) for key, groups in means.items()}


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


def paired_difference(
    row: dict[str, Any], rows: list[dict[str, Any]], role: str, correct: dict[str, np.ndarray | None], group: str | None = None
) -> dict | None:
    """This row against the first row of `role` (of `group`, when given) with its labels and test split: {run,
    difference, se, n, discordant} (se None where either qualification recorded no per-example correctness); None for
    a row of that role or without one."""
    if row["role"] == role or not row["split"]:
        return None
    others = (r for r in rows if r["role"] == role and _key(r) == _key(row) and group in (None, r["group"]))
    other = next(others, None)
    if other is None:
        return None
    mine, theirs = correct.get(row["run"]), correct.get(other["run"])
    if mine is None or theirs is None or len(mine) != len(theirs):
        return {"run": other["run"], "difference": row["accuracy"] - other["accuracy"], "se": None, "n": None, "discordant": None}
    return {"run": other["run"], **paired_se(mine, theirs)}


def seed_groups(rows: list[dict[str, Any]], results_dir: str | Path) -> list[dict[str, Any]]:
    """One entry per seed group of the rows (a group's runs share role, labels and test split), in the rows' order:
    its runs and seeds, mean / sd / min / max of the test figures, mean val accuracy, the tuning budget and step time
    of one seed, whether it is its (labels, split)'s strongest reference, and its differences to the floor group and
    the strongest reference group (vs_floor, vs_end_to_end: see `group_difference`)."""
    results = Path(results_dir)
    members: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        members.setdefault((r["group"], r["role"], *_key(r)), []).append(r)
    correct = {r["run"]: correctness(results / qualification_folder(r["run"]), None) for r in rows}
    val_correct = {r["run"]: val_correctness(results / run_folder(r["run"])) for r in rows}
    strongest = strongest_references(rows)
    groups = []
    for (name, role, labels, split), runs in members.items():
        first = runs[0]
        groups.append(
            {
                "group": name,
                "role": role,
                "labels": labels,
                "split": split,
                "dataset": first["dataset"],
                "model": first["model"],
                "runs": [r["run"] for r in runs],
                "seeds": len(runs),
                **{key: spread([r[key] for r in runs]) for key in ("accuracy", "accuracy_high_snr", "macro_f1")},
                "val_accuracy": mean_or_none([r.get("val_accuracy") for r in runs]),
                "val": None if (val := [r.get("val_accuracy") for r in runs]) and None in val else spread(val),
                "high_snr_db": first["high_snr_db"],
                "members": first.get("members"),
                "optimizer_steps": first.get("optimizer_steps"),
                "optimizer_steps_computed": first.get("optimizer_steps_computed"),
                "wall_s": None if (wall := mean_or_none([r["wall_s"] for r in runs])) is None else round(wall, 1),
                "exposure": first["exposure"],
                "strongest": role == "end-to-end" and strongest.get((labels, split)) == name,
            }
        )
    for g in groups:
        floor = next((o for o in groups if o["role"] == "floor" and _same(o, g)), None)
        reference = next((o for o in groups if o["strongest"] and _same(o, g)), None)
        g["vs_floor"] = None if g["role"] == "floor" else group_difference(g, floor, correct)
        g["vs_end_to_end"] = None if g["strongest"] else group_difference(g, reference, correct)
        g["val_vs_end_to_end"] = None if g["strongest"] or not g["val"] else group_difference(g, reference, val_correct, "val")
    return groups


def mean_or_none(values: list[float | None]) -> float | None:
    """The mean over a group's seeds, None where one has no figure."""
    return None if any(v is None for v in values) else float(np.mean(values))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["split"] is not None and (a["labels"], a["split"]) == (b["labels"], b["split"])


def spread(values: list[float]) -> dict[str, Any]:
    """{mean, sd (over seeds, n - 1; None for one), min, max} of one figure of a seed group."""
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else None
    return {"mean": float(np.mean(values)), "sd": sd, "min": float(min(values)), "max": float(max(values))}


def group_difference(
    mine: dict[str, Any], theirs: dict[str, Any] | None, correct: dict[str, np.ndarray | None], figure: str = "accuracy"
) -> dict | None:
    """{group, difference, se, n, seed_spread, verdict}: the difference of the mean accuracies (`figure`: "accuracy" on
    test, "val" on val, with `correct` the per-example records of that split), the paired SE of
    the per-example mean correctness over each group's seeds, sqrt(mean(d^2) - mean(d)^2) / sqrt(n) (McNemar's for one
    seed each; None without every per-example record), the seed spread sqrt(sd_a^2 + sd_b^2) (None where a group has
    one seed) and what the difference is (`verdict`)."""
    if theirs is None or not theirs.get(figure):
        return None
    difference = mine[figure]["mean"] - theirs[figure]["mean"]
    vectors = [[correct.get(run) for run in g["runs"]] for g in (mine, theirs)]
    se, n = None, None
    if all(v is not None for side in vectors for v in side) and len({len(v) for side in vectors for v in side}) == 1:
        d = np.mean(vectors[0], axis=0) - np.mean(vectors[1], axis=0)
        n = len(d)
        se = math.sqrt(max(0.0, float(np.mean(d**2) - np.mean(d) ** 2)) / n) if n else None
    sds = (mine[figure]["sd"], theirs[figure]["sd"])
    seed_spread = None if None in sds else math.sqrt(sds[0] ** 2 + sds[1] ** 2)
    judged = verdict(difference, se, seed_spread)
    return {"group": theirs["group"], "difference": difference, "se": se, "n": n, "seed_spread": seed_spread, "verdict": judged}


def verdict(difference: float, se: float | None, seed_spread: float | None) -> str:
    """'lead' or 'behind' only beyond both 2 paired SEs and the seed spread; otherwise which of the two it is within
    (or what is not measured)."""
    if se is None:
        return "no per-example record"
    beyond_se = abs(difference) > 2 * se
    if seed_spread is None:
        return "1 seed: spread not measured" + ("" if beyond_se else ", within 2 SE")
    beyond_spread = abs(difference) > seed_spread
    if beyond_se and beyond_spread:
        return "lead" if difference > 0 else "behind"
    return {(False, False): "within 2 SE and seed spread", (True, False): "within seed spread", (False, True): "within 2 SE"}[
        (beyond_se, beyond_spread)
    ]


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


def figure_text(figure: dict[str, Any]) -> str:
    """A seed group's figure: '0.570' for one seed, '0.570 ±sd 0.004 [0.566-0.575]' over several."""
    if figure["sd"] is None:
        return f"{figure['mean']:.3f}"
    return f"{figure['mean']:.3f} ±sd {figure['sd']:.3f} [{figure['min']:.3f}-{figure['max']:.3f}]"


def comparison_text(paired: dict[str, Any] | None) -> str:
    """'+0.012 ± 0.006 (spread 0.009): lead': a group's difference, paired SE, seed spread and verdict ('-': none)."""
    if paired is None:
        return "-"
    spread_text = "" if paired["seed_spread"] is None else f" (spread {paired['seed_spread']:.3f})"
    return f"{difference_text(paired)}{spread_text}: {paired['verdict']}"


def render(rows: list[dict[str, Any]], groups: list[dict[str, Any]]) -> str:
    """A plain-text table, one row per seed group (labels: k per (class, SNR) or all; the strongest reference marked
    with *), one line per test split the table shows fewer qualifications of than the ledger holds, the headline (each
    group against the strongest reference) and lines saying what the columns count."""
    high = groups[0]["high_snr_db"] if groups else 10
    from rffm.ops.status import exposure_words

    header = ["labels", "role", "run", "seeds", "dataset", "backbone / model", "test acc (mean ±sd [min-max])", f"acc >={high:g} dB"]
    header += ["macro-F1", "val acc", "val: vs strongest ± paired SE"]
    header += [f"{title} ± paired SE" for _, _, title in COUNTERPARTS]
    header += ["val members", "optimizer steps (* computed)", "step time", "test exposure: run (split)"]
    table = [header]
    members = {r["run"]: r.get("member") for r in rows}  # a sweep's chosen member, by run
    for g in groups:
        wall = "-" if g["wall_s"] is None else f"{g['wall_s']:.0f} s"
        steps = "-" if g.get("optimizer_steps") is None else f"{g['optimizer_steps']}{'*' if g.get('optimizer_steps_computed') else ''}"
        member = members.get(g["runs"][0])
        table.append(
            [
                labels_text(g.get("labels")),
                g["role"],
                g["group"] + (f" [{member}]" if member and g["seeds"] == 1 else "") + ("*" if g["strongest"] else ""),
                str(g["seeds"]),
                g["dataset"],
                g["model"],
                figure_text(g["accuracy"]),
                f"{g['accuracy_high_snr']['mean']:.3f}",
                f"{g['macro_f1']['mean']:.3f}",
                "-" if g["val_accuracy"] is None else f"{g['val_accuracy']:.3f}",
                comparison_text(g.get("val_vs_end_to_end")),
                *(comparison_text(g.get(key)) for _, key, _ in COUNTERPARTS),
                "-" if g.get("members") is None else str(g["members"]),
                steps,
                wall,
                exposure_words(g["exposure"]) if g["seeds"] == 1 else f"{g['seeds']} runs, 1 each",
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines += exposure_flags(rows)
    lines += headline(groups)
    lines += design_lines(groups)
    lines.append(
        "step time: the sum of the recorded durations of the steps after staging (backbone, cache, epochs, selection, "
        "qualification; end-to-end: training, qualification), each from its work's start to its end: not the process "
        "start (Python, torch imports) nor Snakemake's scheduling, so less than the run's wall-clock time (a seed group: its mean)"
    )
    lines.append(
        "tuning budget: val members: the settings selection compared on val (a sweep's grid, 1 otherwise); optimizer steps: "
        "of each member over all its epochs, as its last epoch recorded them (*: computed as ceil(train rows / batch size) x "
        "epochs, the end-to-end CNN records none; a reference's sweep of epochs: its chosen member's)"
    )
    lines.append(
        "vs floor, vs strongest reference (*: the end-to-end group of the same labels and test split with the highest mean "
        "val accuracy, never test): mean test accuracy minus that group's, ± the paired standard error over the n test "
        "examples both were scored on (of one seed each McNemar's sqrt((b + c) - (b - c)^2 / n) / n, b and c the examples only "
        "one got right; over seeds that of the per-example mean correctness; ?: a result qualified before per-example "
        "correctness was recorded); spread: the seed spread sqrt(sd_a^2 + sd_b^2); a lead (or behind) only beyond both 2 "
        "paired SEs and the seed spread, else which one it is within; val: the same on the val split, from the selected epoch's "
        "per-example val correctness (?: trained before it was recorded)"
    )
    return "\n".join(lines)


def design_records(config: dict[str, Any] | None, groups: list[dict[str, Any]], records_dir: str | Path) -> None:
    """Give each group the design behind its recipe (config `design`): {record, commit, variants: [{run, val}]} per
    record named, from its rows (`rffm status --json`: best_value; `rffm compare --json`: val_accuracy), and
    `val_variants`: those variants plus the members its selection tried (None: no design given)."""
    design = (config or {}).get("design", {})
    for g in groups:
        entries = []
        for name in design.get(g["group"], []):
            path = Path(records_dir) / f"{name}.json"
            try:
                body = json.loads(path.read_text())
                rows = body["output"]["rows"]
            except (OSError, ValueError, KeyError, TypeError):
                raise RffmError(
                    f"design.{g['group']}: {path}: no record with rows. Fix: name a record of `rffm status --json` or "
                    f"`rffm compare --json` there (rffm record {name} -- rffm status RESULTS --json), or drop it from design.{g['group']}"
                ) from None
            variants = [{"run": r["run"], "val": r.get("best_value", r.get("val_accuracy"))} for r in rows]
            entries.append({"record": name, "commit": body.get("commit"), "variants": variants})
        g["design"] = entries
        g["val_variants"] = sum(len(e["variants"]) for e in entries) + (g.get("members") or 0) if entries else None


def design_lines(groups: list[dict[str, Any]]) -> list[str]:
    """One line per group with a design: how many variants were compared on val before it, from which records."""
    lines = []
    for g in groups:
        if g.get("design"):
            records = ", ".join(f"{e['record']} ({len(e['variants'])} variants)" for e in g["design"])
            lines.append(
                f"design of {g['group']}: {g['val_variants']} settings compared on val in all - {records}, then "
                f"{g.get('members') or 0} member(s) by its selection"
            )
    return lines


def headline(groups: list[dict[str, Any]]) -> list[str]:
    """One line per (labels, test split) with a strongest reference: which it is and where each other group stands."""
    lines = []
    for ref in (g for g in groups if g["strongest"]):
        others = [g for g in groups if _same(g, ref) and g is not ref and g["vs_end_to_end"]]
        standing = "; ".join(f"{g['group']} {comparison_text(g['vs_end_to_end'])}" for g in others) or "nothing else to compare"
        lines.append(
            f"labels {labels_text(ref['labels'])}: strongest reference {ref['group']} (val {ref['val_accuracy']:.3f} over "
            f"{ref['seeds']} seed(s)): {standing}"
        )
    return lines


def plot(groups: list[dict[str, Any]], rows: list[dict[str, Any]], path: str | Path) -> None:
    """Grouped bars: the mean test accuracy, high-SNR accuracy and macro-F1 of every seed group, the seeds' min-max as
    error bars; seeds and step time in the legend."""
    from rffm.report.png import plt, save_png

    metrics = [
        ("accuracy", "test accuracy"),
        ("accuracy_high_snr", f"accuracy >= {groups[0]['high_snr_db']:g} dB" if groups else "high SNR"),
        ("macro_f1", "macro-F1"),
    ]
    colors = {"floor": "#9e9e9e", "frozen backbone": "#1f77b4", "end-to-end": "#d62728"}
    hatches = ["", "//", "..", "xx"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / max(1, len(groups))
    x = np.arange(len(metrics))
    for i, g in enumerate(groups):
        means = [g[key]["mean"] for key, _ in metrics]
        errors = [[g[key]["mean"] - g[key]["min"] for key, _ in metrics], [g[key]["max"] - g[key]["mean"] for key, _ in metrics]]
        wall = "-" if g["wall_s"] is None else f"{g['wall_s']:.0f} s"
        same_role = [q for q in groups[:i] if q["role"] == g["role"]]
        bars = ax.bar(
            x + (i - (len(groups) - 1) / 2) * width,
            means,
            width,
            yerr=errors if g["seeds"] > 1 else None,
            capsize=2,
            color=colors[g["role"]],
            hatch=hatches[len(same_role) % len(hatches)],
            edgecolor="white",
            label=f"{g['role']}: {g['group']}{'*' if g['strongest'] else ''}, labels {labels_text(g.get('labels'))}, "
            f"{g['seeds']} seed(s) ({wall})",
        )
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=1)
    ax.set_xticks(x, [label for _, label in metrics])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("test split")
    flags = exposure_flags(rows)  # a test split looked at more often than the figure shows
    title = "floor | frozen backbone | end-to-end (test split; mean over seeds, min-max bars; *: strongest reference on val)"
    ax.set_title("\n".join([title, *flags]), fontsize=8 if flags else 9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(2, max(1, len(groups))), frameon=False)
    save_png(fig, path)
