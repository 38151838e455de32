"""`rffm verify`: re-check a results tree — every sentinel, link, provenance record, ledger entry, artifact
and memo entry — and, when the workflow config is known, tell what the current plan uses from what is
stale (left by runs, epochs or datasets the config no longer has; `rffm prune` removes it).

Every problem is one line naming the file; nothing raises: a malformed record is itself a problem.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rffm.data.cache_format import recipe
from rffm.data.cache_reader import open_cache
from rffm.errors import IntegrityError
from rffm.records import launch, ledger, memo, provenance
from rffm.records.files import sha256_file
from rffm.records.layout import (
    ARTIFACTS,
    CACHES,
    EXPORTS,
    KEPT,
    MEMO,
    PROVENANCE_NAME,
    RUNS,
    SENTINEL_NAME,
    launch_folder,
    planned_steps,
    results_root,
)
from rffm.records.plans import Judgment, plan_problems
from rffm.records.rebuild import rebuild_command
from rffm.records.seal import unseal
from rffm.records.sentinel import check_record, link_problems, read_sentinel, sentinel_problems
from rffm.records.store import PosixStore


@dataclass
class Report:
    """What a check found: sentinels checked, problems (BROKEN), stale step folders, and notes."""

    checked: int = 0
    broken: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    protection: list[str] = field(default_factory=list)  # one line per ledger entry: what keeps it write-once


def fixed(problem: str, fix: str, why: str = "") -> str:
    """A problem line ending with why the fix works, if said, and its fix (in place of a general one the message carried)."""
    return f"{problem.split(' Fix: ')[0].rstrip('.')}{f'; {why}' if why else ''}. Fix: {fix}"


STORED = (("artifact", "the selected artifact"), ("ledger_entry", "the ledger entry of this qualification"))


def step_problems(sentinel_path: Path) -> list[str]:
    """A step folder's problems (its sentinel, outputs, upstream links, provenance, records in the store), each line
    ending with its fix: of the folder itself, the command that rebuilds the step (its outputs come back byte for byte)."""
    try:
        body = read_sentinel(sentinel_path)
        own = sentinel_problems(sentinel_path)
        links = link_problems(sentinel_path, body, fix=True)
        record = provenance.read(sentinel_path.parent / PROVENANCE_NAME, sentinel_path)
        named = {problem.split(": ")[0] for problem in own + links}  # every problem starts with the file it names
        own += [p for p in provenance.partial_output_problems(sentinel_path.parent, body, record) if p.split(": ")[0] not in named]
        own += memo.restored_problems(sentinel_path.parent, record, tree_of(sentinel_path))  # its memo entry's bytes
        fix = rebuild_command(sentinel_path, remove=True) if own else ""  # the plan records are read only when needed
        return [fixed(problem, fix) for problem in own] + links + stored_problems(sentinel_path, body)
    except (IntegrityError, OSError, KeyError, TypeError, ValueError) as error:
        problem = str(error) if isinstance(error, IntegrityError) else f"{sentinel_path}: unreadable ({type(error).__name__}: {error})"
        return [fixed(problem, rebuild_command(sentinel_path, remove=True))]


def stored_problems(sentinel_path: Path, body: dict[str, Any]) -> list[str]:
    """The records a sentinel names in the results store: the selected artifact, the ledger entry, the exported files."""
    results = tree_of(sentinel_path)
    named = [(key, body[key], what) for key, what in STORED if isinstance(body.get(key), dict)]
    named += [
        ("exported", record, f"the published copy of the exported {name}") for name, record in sorted((body.get("exported") or {}).items())
    ]
    problems = []
    for key, record, what in named:
        stored = results / record["key"]
        missing = not stored.exists()
        if not missing and sha256_file(stored) == record["sha256"]:
            continue
        if key == "ledger_entry":  # write-once: no step writes an entry again (a rerun would reset the exposure)
            fix = f"restore {stored} from a backup"
        else:  # content-addressed: the step that published it publishes the same bytes again (plan records read only now)
            rebuild = rebuild_command(sentinel_path, remove=True)
            fix = rebuild if missing else f"rm -f {shlex.quote(str(stored))} && {rebuild}"
        damaged = "" if key == "exported" else " (edited or damaged?)"
        said = (
            f"is missing (deleted?); {sentinel_path} records it" if missing else f"differs from the one {sentinel_path} recorded{damaged}"
        )
        problems.append(f"{stored}: {what} {said}. Fix: {fix}")
    return problems


def tree_of(sentinel_path: Path) -> Path:
    """The results tree a sentinel's step folder belongs to (rffm.records.layout; outside one: its folder's parent)."""
    path = sentinel_path.parent.resolve()
    return results_root(path) or path.parent


def ledger_problems(results: Path) -> list[str]:
    """Every ledger entry whose content, seal or place is wrong."""
    store, problems = PosixStore(results), []
    for key in store.list(ledger.LEDGER):
        try:
            ledger.read(store, key)
        except IntegrityError as error:
            problems.append(str(error) if " Fix: " in str(error) else fixed(str(error), misplaced_fix(results, key)))
    return problems


def misplaced_fix(results: Path, key: str) -> str:
    """The fix of a sound ledger entry under another run's or split's key: where its own place holds an entry (that one
    speaks for the run), remove this copy; else move it to its place."""
    here = results / key
    entry = json.loads(here.read_bytes())["entry"]
    place = results / ledger.entry_key(entry["split_digest"], entry["run"])
    if place.exists():
        return f"rm -f {shlex.quote(str(here))}"
    return f"mkdir -p {shlex.quote(str(place.parent))} && mv {shlex.quote(str(here))} {shlex.quote(str(place))}"


def publisher(results: Path, key: str) -> Path | None:
    """The sentinel of the step of a run that published this store key (a selected artifact, an exported file), if any."""
    for sentinel_path in sorted(results.glob(f"{RUNS}/*/*/{SENTINEL_NAME}")):
        try:
            body = read_sentinel(sentinel_path)
        except IntegrityError:
            continue  # named on its own
        records = [body.get("artifact"), *(body.get("exported") or {}).values()]
        if any(isinstance(record, dict) and record.get("key") == key for record in records):
            return sentinel_path
    return None


def republish(results: Path, path: Path) -> str:
    """The fix of a damaged content-addressed file: remove it, and rebuild the step that published it (the same bytes)."""
    remove = f"rm -f {shlex.quote(str(path))}"
    step = publisher(results, path.relative_to(results).as_posix())
    return f"{remove} && {rebuild_command(step, remove=True)}" if step else remove  # no step of this tree records it


def artifact_problems(results: Path) -> list[str]:
    """Artifacts whose bytes do not match the sha256 their name promises."""
    problems = []
    for path in sorted((results / ARTIFACTS).glob("sha256-*.pt")):
        if sha256_file(path) != path.name.removeprefix("sha256-").removesuffix(".pt"):
            problems.append(f"{path}: its sha256 is not the one its name promises. Fix: {republish(results, path)}")
    return problems


def export_problems(results: Path) -> list[str]:
    """Published exported files (exports/sha256-<hex>.<kind>) whose bytes do not match the sha256 their name promises."""
    return [
        f"{path}: its sha256 is not the one its name promises. Fix: {republish(results, path)}"
        for path in sorted((results / EXPORTS).glob("sha256-*"))
        if path.is_file() and not path.name.endswith(".tmp") and sha256_file(path) != path.name.removeprefix("sha256-").split(".")[0]
    ]


def memo_problems(results: Path) -> list[str]:
    """Memo entries whose sentinel, provenance, place or files are wrong (such an entry is never restored, but it is damage);
    the fix removes the entry: a step that needs it computes again (and keeps a new one)."""
    problems = []
    for sentinel_path in sorted((results / MEMO).glob(f"*/*/{SENTINEL_NAME}")):
        found = []
        try:
            data = sentinel_path.read_bytes()
            body = unseal(sentinel_path, data, "memo sentinel")
            provenance.check(sentinel_path.parent / PROVENANCE_NAME, _read(sentinel_path.parent / PROVENANCE_NAME), data, sentinel_path)
            if memo.folder_of(body) != sentinel_path.parent.relative_to(results).as_posix():
                found.append(f"{sentinel_path}: memo sentinel of another entry (moved or copied here); it is never restored")
            else:
                records = body.get("outputs", {})
                found += [p for name, record in records.items() if (p := check_record(sentinel_path.parent / name, record))]
        except (IntegrityError, TypeError, KeyError, AttributeError) as error:
            found.append(str(error) if isinstance(error, IntegrityError) else f"{sentinel_path}: malformed ({error})")
        remove = f"rm -rf {shlex.quote(str(sentinel_path.parent))}"
        problems += [fixed(problem, remove, "a damaged entry is never restored (its step computes again)") for problem in found]
    return problems


def _read(path: Path) -> bytes | None:
    """A file's bytes, None when it is missing."""
    return path.read_bytes() if path.exists() else None


def launch_problems(results: Path) -> list[str]:
    """Launch records whose profile copy no longer has the recorded sha256; the fix removes the record (the run's next
    launch with that profile records it again)."""
    problems = []
    for record_path in sorted(results.glob(f"{launch_folder('*')}/*/{launch.RECORD_NAME}")):
        fix, again = f"rm -rf {shlex.quote(str(record_path.parent))}", "the run's next launch with that profile records it again"
        try:
            record = json.loads(record_path.read_text())
            kept = record_path.parent / Path(record["file"]).name
            if sha256_file(kept) != record["sha256"]:
                problems.append(f"{kept}: differs from the launch profile recorded in {record_path}; {again}. Fix: {fix}")
        except (OSError, ValueError, KeyError, TypeError) as error:
            problems.append(f"{record_path}: unreadable launch record ({type(error).__name__}); {again}. Fix: {fix}")
    return problems


def local_cache_problems(results: Path, folders: dict[str, Path]) -> tuple[list[str], list[str]]:
    """(problems, notes) of the hidden-state caches (record folder -> its node-local directory on this machine)."""
    problems, notes = [], []
    for folder, cache_dir in sorted(folders.items()):
        record_path = results / folder / SENTINEL_NAME
        if not cache_dir.exists() or not record_path.exists():
            notes.append(f"skipped {cache_dir}: no hidden-state cache on this machine (it is rebuilt where an epoch needs it)")
            continue
        try:
            open_cache(cache_dir, recipe(read_sentinel(record_path)), "verify")
        except (IntegrityError, OSError, KeyError, TypeError, ValueError) as error:
            problem = str(error).removeprefix("verify refuses to start: ") if isinstance(error, IntegrityError) else f"{cache_dir}: {error}"
            why = "the cache is temporary (an epoch that needs it builds it again)"
            problems.append(fixed(problem, f"rm -rf {shlex.quote(str(cache_dir))}", why))
    return problems, notes


def recorded_caches(results: Path) -> dict[str, Path]:
    """Cache record folders and where their build kept the cache (its provenance's `cache_dir`, relative to where it ran)."""
    found = {}
    for record_path in sorted(results.glob(f"{CACHES}/*/{SENTINEL_NAME}")):
        try:
            details = provenance.read(record_path.parent / PROVENANCE_NAME, record_path)
            cache_dir = details.get("cache_dir", details.get("memo"))  # `memo`: the key's name in trees built before
        except IntegrityError:
            continue  # named by the record's own check
        if isinstance(cache_dir, str):
            found[record_path.parent.relative_to(results).as_posix()] = Path(cache_dir)
    return found


def verify_tree(
    results_dir: str | Path, config: dict[str, Any] | None = None, scratch: str | Path | None = None, judgment: Judgment | None = None
) -> Report:
    """Check everything under a results tree; folders the plan (`judgment`, else `config`) no longer writes are stale, not checked."""
    results = Path(results_dir)
    report = Report()
    judgment = judgment or Judgment(config or None)
    for sentinel_path in sorted(results.rglob(SENTINEL_NAME)):
        folder = sentinel_path.parent.relative_to(results).as_posix()
        if folder.split("/")[0] in KEPT:
            continue  # memo entries: checked below
        if not judgment.is_planned(folder):
            report.stale.append(folder)
            continue
        report.checked += 1
        report.broken += step_problems(sentinel_path)
    for provenance_path in sorted(results.rglob(PROVENANCE_NAME)):  # a step folder whose sentinel is gone
        folder = provenance_path.parent.relative_to(results).as_posix()
        if folder.split("/")[0] not in KEPT and judgment.is_planned(folder) and not (provenance_path.parent / SENTINEL_NAME).exists():
            report.broken.append(
                f"{provenance_path.parent / SENTINEL_NAME}: missing (deleted, or its step was interrupted); nothing vouches for "
                f"{provenance_path.parent}. Fix: {rebuild_command(provenance_path.parent / SENTINEL_NAME)}"
            )
    report.broken += ledger_problems(results) + artifact_problems(results) + memo_problems(results) + launch_problems(results)
    report.broken += export_problems(results)
    report.protection = [f"{where}: {what}" for where, what in ledger.protections(PosixStore(results))]
    report.broken += plan_problems(results)
    scratch = Path(scratch) if scratch else (Path(config["scratch"]) if config and config.get("scratch") else None)
    if scratch is not None:  # the caches of the planned runs (or of every record) under that scratch
        plan = judgment.config
        records = [f for f in planned_steps(plan) if f.startswith(f"{CACHES}/")] if plan else list(recorded_caches(results))
        folders = {folder: scratch / Path(folder).name for folder in records}
    else:  # where each cache record's build kept its cache
        folders = recorded_caches(results)
        if not folders:
            report.notes.append("skipped the hidden-state caches: no config, --scratch or cache record says where they are")
    problems, notes = local_cache_problems(results, folders)
    report.broken += problems
    report.notes += notes
    return report
