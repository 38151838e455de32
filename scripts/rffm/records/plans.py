"""Plan records: which config(s) planned each run, kept create-only as runs/<run>/launch/plan-<n>.json.

When the workflow starts (its `onstart` handler, never on a dry run) every configured run and reference
gets a record of what planned it: the config files Snakemake read (path as given, sha256), the
`--config key=value` overrides, and the run's own slice of the resolved config (its entry, its dataset(s)
and backbone). A new record (n + 1) is written only when that slice, a file's content or an override
changed since the run's latest one; earlier records are never replaced, so the folder is the run's
planning history. `rffm status|verify|compare|prune` judge a tree by these records (`judge`): without
`--config` by the records; with `--config` by the given files, except for runs whose recorded plan the
given files contradict (one line says so; `--by-config` judges by the given files anyway). A run that its own
recorded config files no longer have (removed from the config since) is judged removed: its folders are stale.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rffm.errors import IntegrityError
from rffm.records.files import sha256_file
from rffm.records.layout import RUNS, launch_folder, planned_steps
from rffm.records.seal import seal, unseal
from rffm.records.store import Store

PLAN_NAME = re.compile(r"plan-([1-9][0-9]*)\.json")


def plan_key(run: str, number: int) -> str:
    """The store key of a run's n-th plan record."""
    return f"{launch_folder(run)}/plan-{number}.json"


def _plain(value: Any) -> Any:
    """The value as JSON reads it back (tuples to lists, keys to strings): what a record compares."""
    return json.loads(json.dumps(value, sort_keys=True))


def run_plan(config: dict[str, Any], run: str) -> dict[str, Any] | None:
    """The slice of a resolved config that plans one run or reference (None when the config has neither)."""
    if run in config.get("runs", {}):
        entry = config["runs"][run]
        backbone = config.get("backbones", {}).get(entry["backbone"], {})
        datasets = [entry["dataset"], *([backbone["dataset"]] if backbone.get("dataset") else [])]
        plan = {"runs": {run: entry}, "backbones": {entry["backbone"]: backbone}}
    elif run in config.get("references", {}):
        entry = config["references"][run]
        datasets = [entry["dataset"]]
        plan = {"references": {run: entry}}
    else:
        return None
    plan["datasets"] = {name: config.get("datasets", {}).get(name, {}) for name in datasets}
    return _plain(plan)


def file_records(files: list[str | Path], cwd: str = "") -> list[dict[str, Any]]:
    """Each config file read with its sha256 (None when it is not there); relative to `cwd` when it lies under it
    (Snakemake makes them absolute), so the record stays true for a copied tree."""
    records = []
    for f in files:
        path = Path(f)
        shown = path.relative_to(cwd) if cwd and path.is_absolute() and path.is_relative_to(cwd) else path
        records.append({"path": shown.as_posix(), "sha256": sha256_file(path) if path.is_file() else None})
    return records


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two records plan alike: the same slice, file contents and overrides (paths may differ: a moved tree)."""
    digests = [f["sha256"] for f in a["files"]], [f["sha256"] for f in b["files"]]
    return a["plan"] == b["plan"] and digests[0] == digests[1] and a["overrides"] == b["overrides"]


def latest(store: Store, run: str) -> tuple[int, dict[str, Any]] | None:
    """A run's latest plan record and its number (records of another run copied here are skipped)."""
    numbered = []
    for key in store.list(launch_folder(run)):
        match = PLAN_NAME.fullmatch(key.rsplit("/", 1)[-1])
        if match and "/" not in key.removeprefix(f"{launch_folder(run)}/"):
            numbered.append(int(match.group(1)))
    for number in sorted(numbered, reverse=True):
        try:
            record = read_record(store.read(plan_key(run, number)) or b"", plan_key(run, number), run)
        except IntegrityError:
            continue  # damaged: an older record speaks for the run (verify names it)
        return number, record
    return None


def workdir_of(results: Path, record: dict[str, Any] | None) -> Path:
    """The directory the workflow that wrote a record ran in, as it lies now: the tree less its configured
    `results` path (the tree may have been copied or moved with its working directory), else the recorded one."""
    configured = os.path.normpath((record or {}).get("results") or results.name)
    if os.path.isabs(configured):
        return Path((record or {}).get("workdir") or os.getcwd())
    return Path(os.path.normpath(results.absolute().as_posix().removesuffix("/" + configured.strip("/"))))


def still_planned(results: Path, record: dict[str, Any]) -> bool:
    """Whether the config files that planned a run, as they read now (with its recorded --config values), still
    have it; True when they cannot tell (no file recorded, one gone or unreadable)."""
    import yaml  # only when a file changed: the everyday commands start without it

    read_files = [f for f in record["files"] if f.get("sha256")]  # None: not there when the workflow read its configs
    where = workdir_of(results, record)
    paths = [where / f["path"] for f in read_files]  # an absolute recorded path stays itself
    if not read_files or not all(path.is_file() for path in paths):
        return True
    if all(sha256_file(path) == f["sha256"] for path, f in zip(paths, read_files, strict=True)):
        return True  # the very files that planned it
    try:
        configs = [yaml.safe_load(path.read_text()) or {} for path in paths]
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return True
    sections = [config.get(key) for config in [*configs, record.get("overrides") or {}] for key in ("runs", "references")]
    if not all(isinstance(config, dict) for config in configs) or not all(isinstance(s, dict | None) for s in sections):
        return True  # a file half-edited: nothing to judge by
    return any(record["run"] in (section or {}) for section in sections)  # merging files only adds runs


def read_record(data: bytes, where: str, run: str) -> dict[str, Any]:
    """A plan record's body after checking its seal, its shape and that it is this run's (IntegrityError otherwise)."""
    record = unseal(where, data, "plan record")
    if record.get("run") != run or not isinstance(record.get("plan"), dict) or not isinstance(record.get("files"), list):
        raise IntegrityError(f"{where}: plan record of run {record.get('run')!r}, not of {run!r} (copied or moved here?)")
    return record


def record_plans(
    config: dict[str, Any],
    files: list[str | Path],
    overrides: dict[str, Any],
    store: Store,
    replaced: bool = False,
    cwd: str = "",
    snakefile: str = "",
) -> list[str]:
    """Record, create-only, what plans every configured run and reference; the keys written.

    files: the config files Snakemake read; overrides: its --config values; replaced: --replace-workflow-config;
    cwd: the working directory the workflow ran in (where a printed rebuild command starts)."""
    written = []
    for run in [*config.get("runs", {}), *config.get("references", {})]:
        record = {
            "run": run,
            "files": file_records(files, cwd),
            "overrides": _plain(overrides or {}),
            "replaced": bool(replaced),
            "results": config.get("results"),
            "workdir": str(cwd),
            "snakefile": file_records([snakefile], cwd)[0]["path"] if snakefile else "",
            "plan": run_plan(config, run),
        }
        found = latest(store, run)
        if found and _same(found[1], record):
            continue
        number = found[0] + 1 if found else 1
        while not store.create(plan_key(run, number), seal(record)):
            number += 1  # a record this number already exists (unreadable, or another run's copy)
        written.append(plan_key(run, number))
    return written


def plan_problems(results: Path) -> list[str]:
    """Plan records whose seal, shape or run is wrong (one line each, naming the file)."""
    problems = []
    for path in sorted(results.glob(f"{launch_folder('*')}/plan-*.json")):
        if PLAN_NAME.fullmatch(path.name):
            try:
                read_record(path.read_bytes(), str(path), path.parents[1].name)
            except IntegrityError as error:
                problem = str(error).split(" Fix: ")[0].rstrip(".")
                problems.append(
                    f"{problem}; the everyday commands judge the run by an earlier record, if any. Fix: rm -f {shlex.quote(str(path))}"
                )
    return problems


def merged(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """One config from several runs' slices (what planned_steps and the everyday commands read)."""
    config: dict[str, Any] = {"runs": {}, "references": {}, "datasets": {}, "backbones": {}}
    for plan in plans:
        for section in config:
            config[section].update(plan.get(section, {}))
    return config


@dataclass
class Judgment:
    """What a results tree is judged by: a config (None: nothing known), runs no plan speaks for, and notes."""

    config: dict[str, Any] | None
    unknown: list[str] = field(default_factory=list)  # run folders without a plan: shown, never stale
    notes: list[str] = field(default_factory=list)
    _planned: set[str] | None = None

    def has_run(self, run: str) -> bool:
        """Whether the plan has this run or reference (True when nothing says otherwise)."""
        if self.config is None or run in self.unknown:
            return True
        return run in self.config.get("runs", {}) or run in self.config.get("references", {})

    def is_planned(self, folder: str) -> bool:
        """Whether a step folder (relative to results) is part of the plan (True when nothing says otherwise)."""
        if self.config is None:
            return True
        if self.unknown and (not folder.startswith(f"{RUNS}/") or folder.split("/")[1] in self.unknown):
            return True  # a run no record speaks for may use any dataset, backbone or cache: none is stale
        if self._planned is None:
            self._planned = planned_steps(self.config)
        return folder in self._planned


def run_folders(results: Path) -> list[str]:
    runs = results / RUNS
    return sorted(d.name for d in runs.iterdir() if d.is_dir()) if runs.is_dir() else []


def judge(results_dir: str | Path, given: dict[str, Any] | None = None, by_config: bool = False) -> Judgment:
    """The plan to judge a tree by: its runs' plan records, the given config where no record contradicts it
    (or wherever `by_config`), else (a tree without records) the given config or none."""
    from rffm.records.store import PosixStore

    results = Path(results_dir)
    store = PosixStore(results)
    recorded = {run: found for run in run_folders(results) if (found := latest(store, run))}
    if given and (by_config or not recorded):
        return Judgment(given)
    if not recorded:
        return Judgment(None)
    removed = sorted(
        run for run, (_, record) in recorded.items() if not (given and run_plan(given, run)) and not still_planned(results, record)
    )
    notes = [removed_note(recorded, removed)] if removed else []
    recorded = {run: found for run, found in recorded.items() if run not in removed}
    if not given:
        config = merged([record["plan"] for _, record in recorded.values()])
        unknown = [run for run in run_folders(results) if run not in recorded and run not in removed]
        return Judgment(config, unknown, notes)
    named = [*given.get("runs", {}), *given.get("references", {})]
    contradicted = sorted(run for run, (_, record) in recorded.items() if run_plan(given, run) != record["plan"])
    plans = [record["plan"] for _, record in recorded.values()]
    plans += [plan for run in named if run not in recorded and (plan := run_plan(given, run))]
    if contradicted:
        where = ", ".join(
            f"{run} ({plan_key(run, recorded[run][0])}: {' '.join(f['path'] for f in recorded[run][1]['files']) or 'no file'})"
            for run in contradicted
        )
        notes.append(
            f"plan: --config plans runs {', '.join(contradicted)} otherwise than the workflow recorded when it last ran them "
            f"({where}); judged by the recorded plan (add --by-config to judge by --config)"
        )
    return Judgment(merged(plans), [], notes)


def removed_note(recorded: dict[str, tuple[int, dict[str, Any]]], removed: list[str]) -> str:
    """The one line that says which runs their own config files no longer have, and what that makes of them."""
    where = ", ".join(
        f"{run} ({' '.join(f['path'] for f in recorded[run][1]['files'])}, which planned it: {plan_key(run, recorded[run][0])})"
        for run in removed
    )
    return (
        f"plan: runs {', '.join(removed)} are no longer in the config files that planned them ({where}); "
        "judged removed: their folders are stale (`rffm prune` removes them)"
    )
