"""Re-check a whole results tree: every sentinel's outputs and every upstream link."""

from __future__ import annotations

from pathlib import Path

from rffm.errors import IntegrityError
from rffm.records.files import sha256_file
from rffm.records.layout import SENTINEL_NAME
from rffm.records.sentinel import SCRATCH_PREFIX, read_sentinel, sentinel_problems


def link_problems(sentinel_path: Path, scratch_dir: Path | None) -> list[str]:
    """Upstream sentinels that are missing or no longer carry the recorded digest."""
    problems = []
    for role, ref in read_sentinel(sentinel_path)["inputs"].items():
        if ref["path"] is None:
            continue
        if ref["path"].startswith(SCRATCH_PREFIX):
            if scratch_dir is None:
                continue
            target = scratch_dir / ref["path"][len(SCRATCH_PREFIX) :]
            if not target.exists():
                continue  # the cache is temporary; a missing one is rebuilt, not broken
        else:
            target = (sentinel_path.parent / ref["path"]).resolve()
        if not target.exists():
            problems.append(f"{sentinel_path}: upstream {role} sentinel {target} is missing")
        elif sha256_file(target) != ref["sha256"]:
            problems.append(f"{sentinel_path}: upstream {role} sentinel {target} changed since this step consumed it")
    return problems


def verify_tree(results_dir: str | Path, scratch_dir: str | Path | None = None) -> tuple[int, list[str]]:
    """(number of sentinels checked, problems) for every sentinel under results (and scratch)."""
    roots = [Path(results_dir)] + ([Path(scratch_dir)] if scratch_dir else [])
    scratch = Path(scratch_dir) if scratch_dir else None
    checked, problems = 0, []
    for root in roots:
        for sentinel_path in sorted(root.rglob(SENTINEL_NAME)):
            checked += 1
            try:
                problems += sentinel_problems(sentinel_path)
                problems += link_problems(sentinel_path, scratch)
            except IntegrityError as exc:
                problems.append(str(exc))
    return checked, problems
