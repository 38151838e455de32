"""`rffm bench grid` (issue 36): a grid on one cache executed per cache and per run as a cluster places the group jobs,
the backbone's passes counted from the build records, and an exit 1 when the passes or the artifacts break an invariant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from byo import backbones, user_models
from conftest import tiny_config, write_config
from rffm.bench import grid as bench
from rffm.cli import main as rffm

pytestmark = pytest.mark.workflow


def rewrite_json(path: Path, change) -> None:
    """The JSON file at `path` replaced by `change` of its content (records are written read-only)."""
    data = json.loads(path.read_text())
    change(data)
    path.unlink()
    path.write_text(json.dumps(data))


def test_a_grid_of_two_runs_builds_the_cache_once_per_cache_and_three_times_per_run_and_a_broken_invariant_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.chdir(tmp_path)  # the config's weights and model code are relative to where the bench starts
    config = tiny_config()
    config["backbones"] = {"waves": backbones(user_models(tmp_path))["waves"]}  # the WavesFM-shaped example at test size
    config["runs"]["base"]["backbone"] = "waves"
    write_config(tmp_path, config)
    arguments = ["bench", "grid", "--runs", "2", "--epochs", "1", "--config", "config.yaml", "--work-dir", str(tmp_path), "--keep"]
    exit_code, printed = rffm(arguments), capsys.readouterr()
    assert exit_code == 0, printed.out[-3000:] + printed.err[-3000:]
    figures = json.loads(printed.out.splitlines()[-1])
    assert (figures["runs"], figures["epochs"], figures["cores"]) == (2, 1, 2) and figures["invariants_hold"] is True
    # counted from the records: per-cache the cache's own job built it; per-run each run's first epoch built it again
    assert (figures["per_cache_forwards"], figures["per_run_forwards"]) == (1, 3)
    assert figures["per_run_built_by"] == ["build_cache", "grid1/1", "grid2/1"]
    assert figures["per_run_forward_batches"] == 3 * figures["per_cache_forward_batches"] > 0
    # the scheduler ran the arms: one scheduler run per cache, one for the record and one per run per run
    assert (figures["per_cache_scheduler_runs"], figures["per_run_scheduler_runs"]) == (1, 3)
    for arm in ("per_cache", "per_run"):
        assert figures[f"{arm}_jobs"]["build_cache"] == 1 and figures[f"{arm}_jobs"]["train_epoch"] == 2
        assert figures[f"{arm}_cpu_s"] > 0 and figures[f"{arm}_s"] > 0
    assert figures["cpu_ratio"] == pytest.approx(figures["per_cache_cpu_s"] / figures["per_run_cpu_s"], abs=2e-3)
    assert figures["wall_ratio"] == pytest.approx(figures["per_cache_s"] / figures["per_run_s"], abs=2e-3)
    assert figures["artifacts"] == 2 and figures["artifacts_identical"] is True

    work = next(tmp_path.glob("rffm-bench-grid-*"))
    epoch = work / "per-run/results/runs/grid2/epochs/1/provenance.json"
    rewrite_json(epoch, lambda details: details.pop("cache_build"))  # as if grid2's node had found the cache
    assert bench.conclude(work) == 1
    printed = capsys.readouterr()
    verdict = json.loads(printed.out.splitlines()[-1])
    assert verdict["per_run_forwards"] == 2 and verdict["invariants_hold"] is False and verdict["artifacts_identical"] is True
    assert "the per-run arm built the cache 2 times (build_cache, grid1/1), not 3" in printed.err

    artifact = next((work / "per-run/results/artifacts").iterdir())
    content = artifact.read_bytes()
    artifact.unlink()
    artifact.write_bytes(content + b"\0")
    rewrite_json(epoch, lambda details: details.update(cache_build={"batch_stats": {}}))
    assert bench.conclude(work) == 1
    printed = capsys.readouterr()
    verdict = json.loads(printed.out.splitlines()[-1])
    assert verdict["per_run_forwards"] == 3 and verdict["artifacts_identical"] is False
    assert "per-run/results/artifacts: the selected heads differ from the per-cache arm's" in printed.err
