"""Everyday commands on a finished tiny run: `rffm status | head -1`, and which Snakemake command lists
the outputs whose params changed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import BIN, snakemake

pytestmark = pytest.mark.workflow

PIPE_CAPACITY = 64 * 1024  # Linux default; a longer table cannot all be written before `head` has left


def test_status_piped_into_head_ends_quietly(workdir: Path):
    """`rffm status results | head -1`, the real pipe: the table is longer than the pipe holds, so rffm
    writes after `head` has exited (EPIPE); that must end without a BrokenPipeError traceback."""
    runs = workdir / "results" / "runs"
    for number in range(2500):  # runs that have not started yet: one table row each
        (runs / f"pending-{number:04d}").mkdir()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    table = subprocess.run(["rffm", "status", "results"], cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert table.returncode == 0 and len(table.stdout) > 4 * PIPE_CAPACITY, "the table must outgrow the pipe"
    piped = subprocess.run(
        ["bash", "-c", 'rffm status results | head -1; echo "rffm exit status: ${PIPESTATUS[0]}"'],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert piped.stdout.splitlines() == [table.stdout.splitlines()[0], "rffm exit status: 0"]
    assert piped.stderr == "", piped.stderr


def changed_outputs(workdir: Path, *targets: str) -> set[str]:
    """Outputs that `snakemake --summary [targets]` reports with status 'params changed'."""
    lines = snakemake(workdir, "--summary", *targets).stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("output_file\t")))
    rows = [line.split("\t") for line in lines[header + 1 :] if "\t" in line]
    return {row[0] for row in rows if row[-2] == "params changed"}


def test_summary_names_exactly_the_outputs_whose_params_changed(workdir: Path, selected_workdir: Path):
    """What the README can recommend instead of `--list-changes params` (see the next test). On a qualified run a
    changed lr is refused whatever the target, the refusal naming the key; on a run not yet qualified it is listed."""
    assert changed_outputs(workdir) == set()
    for tree in (workdir, selected_workdir):
        config = yaml.safe_load((tree / "config.yaml").read_text())
        config["runs"]["base"]["train"]["lr"] *= 2
        (tree / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    for target in ([], ["validation_selection"]):
        refused = snakemake(workdir, "--summary", *target, check=False)
        assert refused.returncode != 0 and "runs.base was qualified" in refused.stderr + refused.stdout
        assert "runs.base.train.lr" in refused.stderr + refused.stdout
    changed = changed_outputs(selected_workdir, "validation_selection")
    assert "results/runs/base/epochs/1/sentinel.json" in changed
    assert not {path for path in changed if path.startswith(("results/datasets/", "results/backbones/"))}, changed


@pytest.mark.xfail(
    strict=True,
    reason="Snakemake 9.25.2 (and every release up to 9.27.1): persistence.ParamsChange.__iter__ yields the files of a "
    "record with no change, and DAG.get_outputs_with_changes iterates it, so --list-changes params lists every output "
    "whose params were recorded. When this passes, Snakemake fixed it: recommend --list-changes params again.",
)
def test_list_changes_params_lists_nothing_right_after_a_clean_run(workdir: Path):
    listed = [line for line in snakemake(workdir, "--list-changes", "params").stdout.splitlines() if line.startswith("results/")]
    assert listed == []
