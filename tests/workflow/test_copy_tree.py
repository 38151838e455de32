"""Copying a results tree (issue 25): with the workflow's .snakemake/ folder beside it, nothing reruns,
whatever mtimes the copy gives the files; without it Snakemake has only mtimes to go by (concepts.md says so)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, planned_jobs

pytestmark = pytest.mark.workflow


def copy_newest_first(source: Path, destination: Path) -> None:
    """A plain copy (new mtimes), in the unluckiest order: downstream files first, so every upstream file is newer."""
    files = sorted((p for p in source.rglob("*") if p.is_file() and not p.is_symlink()), reverse=True)
    for path in files:
        target = destination / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def test_a_tree_copied_with_its_snakemake_folder_reruns_nothing(finished_workdir: Path, tmp_path: Path):
    copy = tmp_path / "copy"
    copy_newest_first(finished_workdir, copy)
    first = (copy / "results/datasets/tiny/sentinel.json").stat().st_mtime_ns
    assert first > (copy / "results/runs/base/qualification/sentinel.json").stat().st_mtime_ns  # upstream is newer
    assert planned_jobs(copy) == []
    verify = subprocess.run(
        [str(BIN / "rffm"), "verify", "results"],
        cwd=copy,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
    )
    assert verify.returncode == 0, verify.stdout
