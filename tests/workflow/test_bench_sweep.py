"""`rffm bench sweep` measures what it names (issue 37): both arms run by the real Snakemake scheduler, the bytes counted
at the cache reader, and a member whose checkpoint differs from its separate run's fails the bench (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import TINY
from rffm.bench import sweep as bench
from rffm.cli import main as rffm

pytestmark = pytest.mark.workflow

GRID = {"train.lr": [0.003, 0.01]}  # two members: the separate arm is two runs, side by side at --cores 2
KEYS = {"wall_ratio", "bytes_ratio", "sweep_s", "separate_s", "sweep_cache_bytes", "separate_cache_bytes", "sweep_io_rchar"}


def nudge_one_weight(checkpoint_path: Path) -> None:
    """The checkpoint with one head weight moved by one ulp (a near miss no loose comparison would see)."""
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    flat = next(iter(checkpoint["head"].values())).view(-1)
    flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf")))
    checkpoint_path.unlink()
    torch.save(checkpoint, checkpoint_path)


def test_a_bench_that_computed_its_figures_is_fixed_by_scheduled_arms_measured_bytes_and_an_exit_on_a_differing_member(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    arguments = ["bench", "sweep", "--config", str(TINY), "--epochs", "1", "--grid", json.dumps(GRID), "--work-dir", str(tmp_path)]
    exit_code, printed = rffm([*arguments, "--keep"]), capsys.readouterr()
    assert exit_code == 0, printed.out[-3000:] + printed.err[-3000:]
    figures = json.loads(printed.out.splitlines()[-1])
    assert KEYS <= set(figures) and figures["members"] == 2 and figures["cores"] == 2
    assert figures["checkpoints_identical"] is True and figures["differing_members"] == {}
    # the scheduler ran the arms: one epoch job per epoch for the sweep, one per epoch and member for the separate runs
    assert (figures["sweep_jobs"]["train_epoch"], figures["separate_jobs"]["train_epoch"]) == (1, 2)
    assert figures["wall_ratio"] == pytest.approx(figures["sweep_s"] / figures["separate_s"], abs=2e-3) and figures["sweep_s"] > 0
    # counted where the reader copies rows out of the map: each separate run copies what the sweep copies once for both
    assert 2 * figures["sweep_cache_bytes"] == figures["separate_cache_bytes"] > 0 and figures["bytes_ratio"] == 0.5
    assert 0 < figures["sweep_io_rchar"] < figures["separate_io_rchar"]

    work = next(tmp_path.glob("rffm-bench-sweep-*"))
    nudge_one_weight(work / "results/runs/separate1/epochs/1/checkpoint.pt")
    assert bench.conclude(work) == 1
    printed = capsys.readouterr()
    verdict = json.loads(printed.out.splitlines()[-1])
    assert verdict["checkpoints_identical"] is False and list(verdict["differing_members"]) == ["lr=0.01"]
    assert "checkpoint.head." in verdict["differing_members"]["lr=0.01"] and "member lr=0.01 differs" in printed.err
