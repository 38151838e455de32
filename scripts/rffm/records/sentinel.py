"""Checksummed sentinels: the deterministic record each step writes last, and their checks.

A sentinel lists the step's outputs (size and digest), the upstream sentinels it consumed (path and
sha256: the links), digests of its params and code, and facts the step vouches for (metrics, the
dataset description...). It carries the sha256 of its own content, so an edited or damaged sentinel
is named as such; it holds nothing that depends on time or host, so a step that reproduces the same
bytes writes the same sentinel. Every check here reports a problem as one line naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rffm.errors import IntegrityError
from rffm.records.files import sha256_file, sha256_json, xxh3_parts
from rffm.records.ranking import scorer
from rffm.records.seal import unseal, verify_fix

SCHEMA_VERSION = 2  # 2: self_sha256, full digests for every output
REQUIRED = {"schema_version": int, "stage": str, "key": dict, "inputs": dict, "outputs": dict, "params_sha256": str, "code_sha256": str}


def file_record(path: str | Path) -> dict[str, Any]:
    """Size and full sha256 of a file."""
    path = Path(path)
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def parts_record(path: str | Path, boundaries: Sequence[int] = (), known: dict[int, bytes] | None = None) -> dict[str, Any]:
    """Size and full xxh3-128 digest of a large data file, hashed in parts (files.xxh3_parts); `known` part digests are not re-read."""
    path = Path(path)
    return {"bytes": path.stat().st_size, "parts": list(boundaries), "xxh3_128_of_parts": xxh3_parts(path, boundaries, known)}


def _digest_name(record: dict[str, Any]) -> str:
    return "xxh3_128_of_parts" if "xxh3_128_of_parts" in record else "sha256"


def record_digest(record: dict[str, Any]) -> str:
    """A file record's full digest, prefixed with its algorithm (e.g. "xxh3_128_of_parts:…"): the file's identity."""
    return f"{_digest_name(record)}:{record[_digest_name(record)]}"


def json_record(path: str | Path, excluding: list[str]) -> dict[str, Any]:
    """Digest of a JSON file's content without its non-deterministic top-level keys (e.g. provenance)."""
    body = json.loads(Path(path).read_text())
    kept = {key: value for key, value in body.items() if key not in excluding}
    return {"excluding": sorted(excluding), "json_sha256": sha256_json(kept)}


def read_sealed(path: str | Path, what: str, when_missing: str) -> dict[str, Any]:
    """The body of a sealed record file; a missing file raises `<path>: <what> is missing<when_missing>`."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise IntegrityError(f"{path}: {what} is missing{when_missing}") from None
    return unseal(path, data, what)


def read_sentinel(path: str | Path) -> dict[str, Any]:
    """Load and check a sentinel: present, parseable, self-consistent and of the expected shape."""
    path = Path(path)
    if not path.exists():  # a missing intermediate file: plain `snakemake` sees a finished workflow, the sentinel as target reruns its step
        raise IntegrityError(f"{path}: sentinel is missing; the step that writes it has not completed. Fix: {_rebuild(path, remove=False)}")
    body = read_sealed(path, "sentinel", "; the step that writes it has not completed.")
    for key, kind in REQUIRED.items():
        if not isinstance(body.get(key), kind):
            raise IntegrityError(f"{path}: sentinel field {key!r} is missing or not a {kind.__name__}. Fix: {verify_fix(path)}")
    if body["schema_version"] != SCHEMA_VERSION:
        raise IntegrityError(
            f"{path}: sentinel schema_version {body['schema_version']}, expected {SCHEMA_VERSION}. Fix: {verify_fix(path)}"
        )
    for name, record in body["outputs"].items():
        if not isinstance(record, dict) or not isinstance(record.get("bytes", record.get("json_sha256")), int | str):
            raise IntegrityError(f"{path}: record of output {name!r} is malformed. Fix: {verify_fix(path)}")
    for role, ref in body["inputs"].items():
        if not isinstance(ref, dict) or not isinstance(ref.get("sha256"), str) or not isinstance(ref.get("path"), str | None):
            raise IntegrityError(f"{path}: link to upstream {role!r} is malformed. Fix: {verify_fix(path)}")
    return body


def check_record(path: Path, record: dict[str, Any]) -> str | None:
    """Compare a file with its record; return a one-line description of the mismatch, or None."""
    if not path.exists():
        return f"{path}: missing" + (f" (recorded {record['bytes']} bytes)" if "bytes" in record else "")
    if "json_sha256" in record:
        try:
            actual = json_record(path, record.get("excluding", []))["json_sha256"]
        except (ValueError, AttributeError):
            return f"{path}: not valid JSON any more"
        changed = f"{path}: content (without {record.get('excluding')}) changed since it was written"
        return None if actual == record["json_sha256"] else changed
    size = path.stat().st_size
    if size != record["bytes"]:
        return f"{path}: size {size} bytes, recorded {record['bytes']}"
    digest = _digest_name(record)
    if not isinstance(record.get(digest), str):
        return f"{path}: its record holds no digest"
    actual = xxh3_parts(path, record.get("parts", [])) if digest == "xxh3_128_of_parts" else sha256_file(path)
    if actual != record[digest]:
        return f"{path}: {digest} {actual[:16]}…, recorded {record[digest][:16]}…"
    return None


def sentinel_problems(sentinel_path: str | Path, files: list[str] | None = None) -> list[str]:
    """Every output of a sentinel (or the named subset) that no longer matches it."""
    sentinel_path = Path(sentinel_path)
    body = read_sentinel(sentinel_path)
    names = files if files is not None else list(body["outputs"])
    problems = []
    for name in names:
        if name not in body["outputs"]:
            problems.append(f"{sentinel_path.parent / name}: not listed in {sentinel_path}")
        elif problem := check_record(sentinel_path.parent / name, body["outputs"][name]):
            problems.append(problem)
    return problems


def upstream(sentinel_path: str | Path, relative_to: str | Path) -> dict[str, str]:
    """Reference to a consumed sentinel: its path relative to the consumer's directory, and its sha256."""
    sentinel_path = Path(sentinel_path)
    ref = Path(os.path.relpath(sentinel_path.resolve(), Path(relative_to).resolve())).as_posix()
    return {"path": ref, "sha256": sha256_file(sentinel_path)}


def link_problems(sentinel_path: str | Path, body: dict[str, Any] | None = None, fix: bool = False) -> list[str]:
    """Upstream sentinels that are missing or no longer the ones this step consumed (by sha256); with `fix`, each line
    ends with the command that rebuilds the upstream step as the plan makes it (what this step consumed: every step
    is deterministic, so an upstream changed without a change of plan was damaged, put back or copied there) — or,
    where the changed upstream is intact itself, this step (it was rebuilt from what it holds: a profiling summary
    holds the timings of the epochs it read, so one rebuilt after them is not the one its chart consumed)."""
    sentinel_path = Path(sentinel_path)
    body = body if body is not None else read_sentinel(sentinel_path)
    problems = []
    for role, ref in body["inputs"].items():
        if ref["path"] is None:
            continue
        where = Path(os.path.normpath(sentinel_path.parent / ref["path"]))  # relative stays relative: what a Fix names
        target = where.resolve()
        if not target.exists():
            problem = f"{sentinel_path}: its upstream {role} sentinel {target} is missing"
            problems.append(problem + (f". Fix: {_rebuild(where, remove=False)}" if fix else ""))
        elif sha256_file(target) != ref["sha256"]:
            problem = f"{sentinel_path}: its upstream {role} sentinel {target} changed since this step consumed it"
            problems.append(problem + (f". Fix: {_rebuild(sentinel_path if _intact(target) else where)}" if fix else ""))
    return problems


def _intact(sentinel_path: Path) -> bool:
    """Whether a sentinel is the one of its folder's step (not another step's copied there), and it, its outputs and
    its own links are as it records (read only where a link to it is broken)."""
    try:
        return _in_its_folder(sentinel_path) and not sentinel_problems(sentinel_path) and not link_problems(sentinel_path)
    except IntegrityError:
        return False


def _in_its_folder(sentinel_path: Path) -> bool:
    """Whether every value of the sentinel's key names its folder (runs/<run>/epochs/<epoch>, caches/<dataset>__<backbone>):
    epoch 1's sentinel copied into epoch 2's folder is not."""
    names = {name for part in sentinel_path.parent.parts for name in (part, *part.split("__"))}
    return all(str(value) in names for value in read_sentinel(sentinel_path).get("key", {}).values())


def _rebuild(sentinel_path: Path, remove: bool = True) -> str:
    """The command that rebuilds a step (records/rebuild.py; imported here only when needed)."""
    from rffm.records.rebuild import rebuild_command

    return rebuild_command(sentinel_path, remove=remove)


def require_intact(sentinel_path: str | Path, files: list[str], consumer: str) -> dict[str, Any]:
    """Stop with one clear line unless the sentinel, its links and the named files are intact; return it.

    An upstream sentinel that changed since this one was written means the tree is no longer what
    the step recorded (a file put back, an edit): that is damage too.
    """
    sentinel_path = Path(sentinel_path)
    body = read_sentinel(sentinel_path)
    problems = sentinel_problems(sentinel_path, files) + link_problems(sentinel_path, body)
    if problems:
        raise IntegrityError(
            f"{consumer} refuses to start: {problems[0]}"
            + (f" (and {len(problems) - 1} more problem(s) under {sentinel_path.parent})" if len(problems) > 1 else "")
            + f". Fix: restore the file, or rebuild it with {body['stage']}: {_rebuild(sentinel_path)}"
        )
    return body


def epoch_metrics(body: dict[str, Any], member: str | None = None, rule: dict[str, str] | None = None) -> dict[str, Any]:
    """An epoch sentinel's metrics: a plain epoch's; of a sweep's, the named member's (with "member"), else the
    epoch's best member by `rule` (default: highest val_accuracy)."""
    if "members" not in body:
        return body["metrics"]
    table = body["members"]
    if member not in table:
        score = scorer((rule or {}).get("metric", "val_accuracy"), (rule or {}).get("mode", "max"))
        member = max(table, key=lambda name: score(table[name]["metrics"]))
    return {**table[member]["metrics"], "member": member}
