"""The cost of a plan: every heavy job's work from the config, its seconds predicted from a throughput record, and
after the run the seconds each one measured (its provenance), per stage.

A job's work is counted in its stage's unit (IQ samples staged or verified, examples cached, rows an epoch reads,
epoch records a selection reads, test examples qualified) and its rate depends only on what its key names: the stage,
the device class and the settings that set its cost (the backbone's architecture, the example length, the head's batch
size), never the data set's size or a seed.
A throughput record (`rffm throughput`, config `throughput`) holds the (work, seconds) of every job of finished trees;
each key's jobs fit seconds = fixed + work / rate (least squares; one size measured: no fixed part), so a pilot at
two small sizes predicts a study at any size. Reports, plots and summaries take well under a second and are not counted.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from rffm.backbone_kinds import BUILT_HERE
from rffm.data import cache_plan
from rffm.records.files import atomic_write_json, read_json, sha256_json
from rffm.records.layout import (
    PROVENANCE_NAME,
    backbone_folder,
    cache_folder,
    dataset_folder,
    epoch_folder,
    export_folder,
    qualification_folder,
    selection_folder,
)
from rffm.training import sweep

FORMAT = 1
COST_FREE = ("seed", "labels_seed", "lr", "epochs", "weight_decay")  # train settings that do not change an epoch's time
FIX = (
    "run a pilot of this config at a smaller size (a `select` or a smaller file) and `rffm throughput RESULTS --out FILE`, "
    "then set `throughput: FILE`"
)


@dataclasses.dataclass(frozen=True)
class Job:
    """One planned heavy job: its stage (the rule), the step folder its provenance lands in, what decides its rate,
    its work in the stage's unit, and its group job on a cluster ("" none)."""

    stage: str
    folder: str
    key: str
    work: float
    group: str = ""


def device_class(device: str) -> str:
    """cpu or gpu, from a config's `device` (cpu, cuda, auto) or a provenance record's device name ('cpu (x86_64)')."""
    return "cpu" if str(device).startswith("cpu") else "gpu"


def _digest(value: Any) -> str:
    return sha256_json(value)[:12]


def backbone_key(backbone: dict[str, Any], length: int) -> str:
    """What sets a backbone's forward time: its entry without what only pretraining reads, and the example length."""
    forward = {key: value for key, value in backbone.items() if key not in ("dataset", "pretrain")}
    return f"{_digest(forward)}|L{length}"


def source_counts(spec: dict[str, Any]) -> tuple[dict[str, int] | None, int | None]:
    """Split counts and example length of an unstaged HDF5 source in RadioML 2018's layout, from its shape alone (the
    stratified split rounds within a few rows of these); (None, None) for any other source."""
    if spec["source"] != "radioml2018" or spec.get("select"):
        return None, None
    try:
        import h5py

        with h5py.File(spec["radioml2018"]["path"], "r") as handle:
            count, length = int(handle["X"].shape[0]), int(handle["X"].shape[1])
    except (OSError, KeyError, ValueError):
        return None, None
    fractions = spec["splits"]
    test, val = round(count * fractions["test"]), round(count * fractions["val"])
    return {"train": count - test - val, "val": val, "test": test}, length


def dataset_size(config: dict[str, Any], results: str, dataset: str) -> tuple[dict[str, int] | None, int | None]:
    """(split counts, example length) of a dataset as far as planning can know them."""
    counts, length, _ = cache_plan.dataset_facts(config, results, dataset)
    if counts is None or length is None:
        counts, length = source_counts(config["datasets"][dataset])
    return counts, length


def member_count(spec: dict[str, Any]) -> int:
    """How many members a run's or reference's sweep trains in each epoch (1 without a sweep)."""
    return math.prod(len(values) for _, values in sweep.grid(spec))


def planned_jobs(config: dict[str, Any], results: str, groups: dict[str, str] | None = None) -> tuple[list[Job], list[str]]:
    """The heavy jobs of the config's full plan with their work, and one line per dataset whose size planning cannot
    know (its jobs are left out). `groups`: run -> its epochs' group job, and (dataset, backbone) -> its build's."""
    groups = groups or {}
    jobs: list[Job] = []
    unknown: list[str] = []
    sizes: dict[str, tuple[dict[str, int], int]] = {}

    def size(dataset: str) -> tuple[dict[str, int], int] | None:
        if dataset not in sizes:
            counts, length = dataset_size(config, results, dataset)
            if counts is None or length is None:
                unknown.append(
                    f"datasets.{dataset}: its size is not known before it is staged, so its jobs' cost is not predicted. "
                    f"Fix: snakemake {results}/{dataset_folder(dataset)}/sentinel.json (stage it first)"
                )
                return None
            sizes[dataset] = (counts, length)
            kind = config["datasets"][dataset]["source"]
            jobs.append(Job("stage_dataset", dataset_folder(dataset), f"stage_dataset|{kind}", sum(counts.values()) * length))
        return sizes[dataset]

    backbones: set[str] = set()
    caches: set[tuple[str, str]] = set()
    for name, run in config.get("runs", {}).items():
        dataset, backbone_name = run["dataset"], run["backbone"]
        backbone = config["backbones"][backbone_name]
        known = size(dataset)
        if known is None:
            continue
        counts, length = known
        forward = backbone_key(backbone, length)
        if backbone_name not in backbones:
            backbones.add(backbone_name)
            jobs += backbone_jobs(config, results, backbone_name, backbone, size)
        if (dataset, backbone_name) not in caches:
            caches.add((dataset, backbone_name))
            cached = counts["train"] + counts["val"]
            group = groups.get(f"{dataset}__{backbone_name}", "")
            jobs.append(Job("build_cache", cache_folder(dataset, backbone_name), f"build_cache|{forward}", cached, group))
        members = member_count(run)
        train = {key: value for key, value in run["train"].items() if key not in COST_FREE}
        epoch_key = f"train_epoch|{forward}|{_digest({'train': train, 'head': run.get('head'), 'members': members})}"
        epochs = int(run["train"]["epochs"])
        for epoch in range(1, epochs + 1):
            rows = (counts["train"] + counts["val"]) * members
            jobs.append(Job("train_epoch", epoch_folder(name, epoch), epoch_key, rows, groups.get(name, "")))
        jobs.append(Job("select_checkpoint", selection_folder(name), "select_checkpoint", epochs * members))
        jobs.append(Job("qualify", qualification_folder(name), f"qualify|{forward}", counts["test"]))
        if run.get("export", True):
            jobs.append(Job("export", export_folder(name), f"export|{forward}", 1))
    for name, reference in config.get("references", {}).items():
        known = size(reference["dataset"])
        if known is None:
            continue
        counts, length = known
        members = member_count(reference)
        train = {key: value for key, value in reference["train"].items() if key not in COST_FREE}
        model = f"{_digest({'model': reference.get('model'), 'train': train, 'members': members})}|L{length}"
        rows = int(reference["train"]["epochs"]) * (counts["train"] + counts["val"]) * members
        jobs.append(Job("train_reference", selection_folder(name), f"train_reference|{model}", rows))
        jobs.append(Job("qualify_reference", qualification_folder(name), f"qualify_reference|{model}", counts["test"]))
    return jobs, unknown


def backbone_jobs(config: dict[str, Any], results: str, name: str, backbone: dict[str, Any], size) -> list[Job]:
    """The job that makes a backbone: pretraining (its epochs over its dataset's train split) or an import (fixed)."""
    if backbone["source"] not in BUILT_HERE:
        return [Job("import_backbone", backbone_folder(name), f"import_backbone|{backbone['source']}", 1)]
    known = size(backbone["dataset"])
    if known is None:
        return []
    counts, length = known
    pretrain = backbone.get("pretrain", {})
    if backbone["source"] != "pretrain":  # it verifies the train split's bytes before it maps its shape
        work = counts["train"] * length
        return [Job("pretrain_backbone", backbone_folder(name), f"pretrain_backbone|{backbone['source']}|L{length}", work)]
    epochs = int(pretrain.get("epochs", 1))
    settings = {key: value for key, value in backbone.items() if key != "dataset"}
    settings["pretrain"] = {key: value for key, value in pretrain.items() if key not in COST_FREE}
    return [Job("pretrain_backbone", backbone_folder(name), f"pretrain_backbone|{_digest(settings)}|L{length}", epochs * counts["train"])]


def measured(results: str | Path, job: Job) -> dict[str, Any] | None:
    """A finished job's seconds, peak RSS and device from its provenance record; None when it has not run here."""
    try:
        record = read_json(Path(results) / job.folder / PROVENANCE_NAME)
    except (OSError, ValueError):
        return None
    if record.get("rule") != job.stage or "duration_s" not in record:
        return None
    return {
        "seconds": float(record["duration_s"]),
        "peak_rss_mb": record.get("peak_rss_mb"),
        "device": record.get("device", "cpu"),
        "started_unix": record.get("started_unix"),
    }


# --- the throughput record -------------------------------------------------------------------------------------------


def record_points(results: str | Path, jobs: list[Job]) -> list[dict[str, Any]]:
    """(key, device class, work, seconds) of every job of `jobs` that has run in `results`, with when it started (a
    tree recorded twice adds each job once)."""
    points = []
    for job in jobs:
        if (found := measured(results, job)) is not None:
            device, started = device_class(found["device"]), found["started_unix"]
            points.append({"key": job.key, "device": device, "work": job.work, "seconds": found["seconds"], "started_unix": started})
    return points


def write_record(path: str | Path, points: list[dict[str, Any]]) -> dict[str, Any]:
    """Add `points` to the throughput record at `path` (created if absent; a point already there is kept once)."""
    path = Path(path)
    old = read_json(path)["points"] if path.is_file() else []
    merged = {sha256_json(point): point for point in [*old, *points]}
    record = {"format": FORMAT, "points": sorted(merged.values(), key=lambda p: (p["key"], p["device"], p["work"], p["seconds"]))}
    atomic_write_json(path, record)
    return record


def read_record(path: str | Path, where: str = "throughput") -> list[dict[str, Any]]:
    """The points of a throughput record; a missing or foreign file is one line with a Fix."""
    from rffm.errors import ConfigError

    try:
        record = read_json(path)
    except FileNotFoundError:
        raise ConfigError(f"{where}: {path} does not exist. Fix: {FIX}") from None
    except (OSError, ValueError) as error:
        raise ConfigError(f"{where}: {path} is not a throughput record ({error}). Fix: {FIX}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("points"), list):
        raise ConfigError(f"{where}: {path} is not a throughput record of format {FORMAT}. Fix: {FIX}")
    return record["points"]


def fit(points: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[float, float]]:
    """{(key, device class): (fixed seconds, seconds per unit of work)}: least squares over each key's jobs; with one
    size measured (or a negative fixed part) the line goes through the origin."""
    by_key: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for point in points:
        by_key.setdefault((point["key"], point["device"]), []).append((float(point["work"]), float(point["seconds"])))
    lines = {}
    for key, pairs in by_key.items():
        works = [work for work, _ in pairs]
        mean_w, mean_s = sum(works) / len(pairs), sum(s for _, s in pairs) / len(pairs)
        spread = sum((w - mean_w) ** 2 for w in works)
        slope = sum((w - mean_w) * (s - mean_s) for w, s in pairs) / spread if spread else 0.0
        fixed = mean_s - slope * mean_w
        if not spread or fixed < 0 or slope < 0:
            fixed, slope = 0.0, sum(s for _, s in pairs) / max(sum(works), 1e-12)
        lines[key] = (fixed, slope)
    return lines


def predict(jobs: list[Job], lines: dict[tuple[str, str], tuple[float, float]], device: str) -> list[float | None]:
    """Each job's predicted seconds on `device` (a config's `device`); None where the record has no job of its key."""
    where = device_class(device)
    predicted = []
    for job in jobs:
        line = lines.get((job.key, where))
        predicted.append(None if line is None else line[0] + line[1] * job.work)
    return predicted


# --- what the plan and `rffm status --cost` print --------------------------------------------------------------------


def by_stage(jobs: list[Job], predicted: list[float | None], results: str | Path | None = None) -> list[dict[str, Any]]:
    """Per stage: jobs, predicted seconds (None when any of its jobs cannot be predicted), and with `results` the
    measured seconds and largest peak RSS of the jobs that ran there."""
    stages: dict[str, dict[str, Any]] = {}
    for job, seconds in zip(jobs, predicted, strict=True):
        row = stages.setdefault(job.stage, {"stage": job.stage, "jobs": 0, "work": 0.0, "predicted_s": 0.0, "unpredicted": 0})
        row["jobs"] += 1
        row["work"] += job.work
        if seconds is None:
            row["unpredicted"] += 1
        else:
            row["predicted_s"] += seconds
        if results is not None and (found := measured(results, job)) is not None:
            row["measured_jobs"] = row.get("measured_jobs", 0) + 1
            row["measured_s"] = row.get("measured_s", 0.0) + found["seconds"]
            if found["peak_rss_mb"] is not None:
                row["peak_rss_mb"] = max(row.get("peak_rss_mb", 0.0), float(found["peak_rss_mb"]))
    for row in stages.values():
        if row["unpredicted"]:
            row["predicted_s"] = None
        if row.get("measured_s") and row["predicted_s"]:
            row["measured_over_predicted"] = round(row["measured_s"] / row["predicted_s"], 3)
    return list(stages.values())


def hours(seconds: float) -> str:
    """'0.42 h' (minutes under a tenth of an hour, seconds under a minute)."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.1f} min"


def plan_lines(config: dict[str, Any], results: str, groups: dict[str, str] | None = None) -> list[str]:
    """The plan's cost, one line per stage and one per cluster group job, from the config's throughput record; or why
    it cannot be predicted and how to measure."""
    head = "note: cost: "
    if not config.get("throughput"):
        return [f"{head}no throughput record, so the plan cannot predict its hours. Fix: {FIX}"]
    jobs, unknown = planned_jobs(config, results, groups)
    lines = fit(read_record(config["throughput"]))
    predicted = predict(jobs, lines, config["device"])
    out = [f"{head}{line}" for line in unknown]
    todo = [(job, s) for job, s in zip(jobs, predicted, strict=True) if measured(results, job) is None]
    for row in by_stage([job for job, _ in todo], [s for _, s in todo]):
        if row["predicted_s"] is None:
            out.append(
                f"{head}{row['stage']}: {row['jobs']} job(s), not predicted: {config['throughput']} has no job of this kind "
                f"on {device_class(config['device'])}. Fix: {FIX}"
            )
        else:
            out.append(f"{head}{row['stage']}: {row['jobs']} job(s) to run, {hours(row['predicted_s'])} predicted")
    group_seconds: dict[str, list[float]] = {}
    for job, seconds in todo:
        if job.group and seconds is not None:
            group_seconds.setdefault(job.group, []).append(seconds)
    for group, times in sorted(group_seconds.items()):
        out.append(f"{head}group job {group}: {len(times)} job(s), {hours(sum(times))} predicted (its members one after another)")
    known = [s for _, s in todo if s is not None]
    done = len(jobs) - len(todo)
    out.append(f"{head}in all {len(todo)} job(s) to run ({done} done), {hours(sum(known))} predicted from {config['throughput']}")
    return out


def render_stages(stages: list[dict[str, Any]], record: str | None) -> str:
    """`rffm status --cost`'s table: stage, jobs, work, predicted, measured, measured / predicted, peak RSS."""

    def seconds(value: float | None) -> str:
        return "?" if value is None else f"{value:.1f}"

    lines = [f"cost per stage, predicted from {record or 'no throughput record (config `throughput`)'}:"]
    lines.append(f"{'stage':<18} {'jobs':>5} {'work':>14} {'predicted s':>12} {'measured s':>11} {'meas/pred':>9} {'peak RSS MB':>11}")
    for row in stages:
        measured_jobs = row.get("measured_jobs", 0)
        shown = seconds(row.get("measured_s")) + ("" if measured_jobs in (0, row["jobs"]) else f" ({measured_jobs} run)")
        ratio = row.get("measured_over_predicted")
        lines.append(
            f"{row['stage']:<18} {row['jobs']:>5} {row['work']:>14.0f} {seconds(row['predicted_s']):>12} {shown:>11} "
            f"{'?' if ratio is None else f'{ratio:.2f}':>9} {seconds(row.get('peak_rss_mb')):>11}"
        )
    return "\n".join(lines)
