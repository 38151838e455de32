"""`rffm bench scale` (issue 47) at test size: a RadioML 2018-layout file staged, cached with the default backbone's
architecture, a grid trained and qualified by the real workflow; every stage measured, the disk planned against used,
the second size's cost predicted from the first's throughput record."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO

pytestmark = pytest.mark.workflow
STAGES = ["stage_dataset", "pretrain_backbone", "build_cache", "train_epoch", "select_checkpoint", "qualify"]


def test_two_small_sizes_run_end_to_end_and_the_second_is_predicted_from_the_first(tmp_path: Path):
    """1/4096 and 1/2048 of the full size are 5 examples per (class, SNR), the bench's floor: the second size's
    prediction comes from the first size's jobs of the same work (its figures are timings: reported, never asserted)."""
    command = [str(BIN / "rffm"), "bench", "scale", "--fractions", "1/4096", "1/2048", "--runs", "1", "--epochs", "1"]
    command += ["--work-dir", str(tmp_path), "--shared"]  # the suite's other workers run snakemake beside it
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    first, second = result["sizes"]
    assert first["examples"] == second["examples"] == 5 * 24 * 26
    for size in (first, second):
        assert [row["stage"] for row in size["stages"]] == STAGES
        assert all(row["measured_jobs"] == row["jobs"] and row["measured_s"] > 0 for row in size["stages"])
        assert 0 < size["peak_rss_mb"] < 2000 and abs(size["disk_error"]) < 0.05
    assert all(row["predicted_s"] is None for row in first["stages"])
    assert first["plan_notes"][0].startswith("note: cost: no throughput record")
    assert all(row["predicted_s"] > 0 for row in second["stages"]) and second["plan_notes"][-1].startswith("note: cost: in all ")
    assert result["checks"]["prediction_error"].keys() == {"1/2048"}
    assert list(tmp_path.iterdir()) == []  # every size's tree and source removed, the ledger's entries released first
