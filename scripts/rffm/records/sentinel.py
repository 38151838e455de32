"""Checksummed sentinels: the deterministic record each step writes last, and their checks."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rffm.errors import IntegrityError
from rffm.records.files import read_json, sha256_file, sha256_json, xxh3_parts

SCHEMA_VERSION = 1
SCRATCH_PREFIX = "scratch:"
SAMPLED_ROWS = 64


def file_record(path: str | Path) -> dict[str, Any]:
    """Size and full sha256 of a file."""
    path = Path(path)
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def parts_record(path: str | Path, boundaries: Sequence[int] = (), known: dict[int, bytes] | None = None) -> dict[str, Any]:
    """Size and full xxh3-128 digest of a large data file (a dataset split), hashed in parts (files.xxh3_parts)."""
    path = Path(path)
    return {"bytes": path.stat().st_size, "parts": list(boundaries), "xxh3_128_of_parts": xxh3_parts(path, boundaries, known)}


def _digest_name(record: dict[str, Any]) -> str:
    return "xxh3_128_of_parts" if "xxh3_128_of_parts" in record else "sha256"


def record_digest(record: dict[str, Any]) -> str:
    """A file record's full digest, prefixed with its algorithm (e.g. "xxh3_128_of_parts:…"): the file's identity."""
    return f"{_digest_name(record)}:{record[_digest_name(record)]}"


def json_record(path: str | Path, excluding: list[str]) -> dict[str, Any]:
    """Digest of a JSON file's content without its non-deterministic top-level keys (e.g. provenance)."""
    body = read_json(path)
    kept = {key: value for key, value in body.items() if key not in excluding}
    return {"excluding": sorted(excluding), "json_sha256": sha256_json(kept)}


def diagnostic_record() -> dict[str, Any]:
    """A diagnostics file (timings, traces): listed so verify knows it, never hashed."""
    return {"diagnostic": True}


def array_record(path: str | Path, shape: tuple[int, ...], dtype: str, full_hash: bool = False) -> dict[str, Any]:
    """Element count, shape, dtype and a checksum of evenly sampled rows of a raw array file."""
    path = Path(path)
    stored = np.memmap(path, dtype=np.uint16 if dtype == "bfloat16" else np.dtype(dtype), mode="r", shape=shape)
    rows = np.unique(np.linspace(0, shape[0] - 1, num=min(SAMPLED_ROWS, shape[0])).astype(np.int64)) if shape[0] else []
    digest = hashlib.sha256()
    for row in rows:
        digest.update(np.ascontiguousarray(stored[row]).tobytes())
    record = {
        "bytes": path.stat().st_size,
        "dtype": dtype,
        "elements": int(np.prod(shape)),
        "shape": list(shape),
        "sampled_rows": len(rows),
        "sampled_sha256": digest.hexdigest(),
    }
    if full_hash:
        record["sha256"] = sha256_file(path)
    return record


def upstream(sentinel_path: str | Path, relative_to: str | Path, scratch_root: str | Path | None = None) -> dict[str, str]:
    """Reference to a consumed sentinel: its path (relative to the consumer, or scratch-relative) and digest."""
    sentinel_path = Path(sentinel_path)
    if scratch_root is not None:
        ref = SCRATCH_PREFIX + sentinel_path.resolve().relative_to(Path(scratch_root).resolve()).as_posix()
    else:
        ref = Path(_relpath(sentinel_path, relative_to)).as_posix()
    return {"path": ref, "sha256": sha256_file(sentinel_path)}


def _relpath(target: Path, start: str | Path) -> str:
    return os.path.relpath(target.resolve(), Path(start).resolve())


def read_sentinel(path: str | Path) -> dict[str, Any]:
    """Load a sentinel, with a clear error if it is missing or unreadable."""
    path = Path(path)
    try:
        body = read_json(path)
    except FileNotFoundError:
        raise IntegrityError(f"{path}: sentinel is missing; the step that writes it has not completed. Fix: rerun snakemake.") from None
    except ValueError as exc:
        raise IntegrityError(f"{path}: sentinel is not valid JSON ({exc}). Fix: delete it and rerun snakemake.") from None
    if body.get("schema_version") != SCHEMA_VERSION:
        raise IntegrityError(f"{path}: sentinel schema_version {body.get('schema_version')!r}, expected {SCHEMA_VERSION}.")
    return body


def check_record(path: Path, record: dict[str, Any]) -> str | None:
    """Compare a file with its record; return a description of the mismatch, or None."""
    if not path.exists():
        return f"{path}: missing" + (f" (recorded {record['bytes']} bytes)" if "bytes" in record else "")
    if record.get("diagnostic"):
        return None
    if "json_sha256" in record:
        try:
            actual = json_record(path, record["excluding"])["json_sha256"]
        except ValueError:
            return f"{path}: not valid JSON any more"
        return None if actual == record["json_sha256"] else f"{path}: content (without {record['excluding']}) changed since it was written"
    size = path.stat().st_size
    if size != record["bytes"]:
        return f"{path}: size {size} bytes, recorded {record['bytes']}"
    if "sampled_sha256" in record:
        actual = array_record(path, tuple(record["shape"]), record["dtype"], full_hash="sha256" in record)
        for field in ("sampled_sha256", "sha256"):
            if field in record and actual[field] != record[field]:
                return f"{path}: {field} {actual[field][:16]}…, recorded {record[field][:16]}…"
        return None
    digest = _digest_name(record)
    actual = xxh3_parts(path, record["parts"]) if digest == "xxh3_128_of_parts" else sha256_file(path)
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
            continue
        problem = check_record(sentinel_path.parent / name, body["outputs"][name])
        if problem:
            problems.append(problem)
    return problems


def require_intact(sentinel_path: str | Path, files: list[str], consumer: str) -> dict[str, Any]:
    """Stop with a clear error unless the named files match their upstream sentinel; return it."""
    sentinel_path = Path(sentinel_path)
    body = read_sentinel(sentinel_path)
    problems = sentinel_problems(sentinel_path, files)
    if problems:
        listing = "\n  ".join(problems)
        raise IntegrityError(
            f"{consumer} refuses to start: inputs do not match {sentinel_path} "
            f"(written by {body['stage']}):\n  {listing}\n"
            f"The file was changed after its step completed. Fix: restore it, or delete "
            f"{sentinel_path} and rerun snakemake so {body['stage']} rebuilds it."
        )
    return body
