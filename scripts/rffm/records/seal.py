"""Sealed records: canonical JSON carrying the sha256 of its own content (sentinels, provenance, plan records, memo entries)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from rffm.errors import IntegrityError
from rffm.records.files import canonical_json, sha256_json
from rffm.records.layout import results_root

SELF_DIGEST = "self_sha256"


def seal(body: dict[str, Any]) -> bytes:
    """A record's file bytes: its canonical JSON with the sha256 of that content added."""
    return canonical_json({**body, SELF_DIGEST: sha256_json(body)}).encode()


def verify_fix(path: str | Path) -> str:
    """The fix of a damaged record met by a step: `rffm verify` on its results tree, whose BROKEN lines each end with the
    command that rebuilds one damaged step. Deleting the record and rerunning snakemake is no fix: a step that met it
    has removed its own sentinel, and neither of those missing intermediate files reruns a finished workflow."""
    root = results_root(Path(path).parent)
    return f"rffm verify{f' {shlex.quote(str(root))}' if root else ''}, and run the Fix of each BROKEN line it prints until it prints none."


def unseal(path: str | Path, data: bytes, what: str) -> dict[str, Any]:
    """A sealed record's body after checking it parses and matches its own digest (one clear error otherwise)."""
    try:
        body = json.loads(data)
    except ValueError:
        raise IntegrityError(f"{path}: {what} is not valid JSON (damaged or truncated). Fix: {verify_fix(path)}") from None
    if not isinstance(body, dict) or not isinstance(body.get(SELF_DIGEST), str):
        raise IntegrityError(f"{path}: {what} has no {SELF_DIGEST} (damaged, edited or older). Fix: {verify_fix(path)}")
    digest = body.pop(SELF_DIGEST)
    if sha256_json(body) != digest:
        raise IntegrityError(f"{path}: {what} does not match its own sha256 (edited or damaged). Fix: {verify_fix(path)}")
    return body
