"""Smoke test of `rffm bench staging` on a tiny size (the benchmark itself is run by hand, see workflow/docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import BIN


def test_bench_staging_prints_ratios_and_cleans_up(tmp_path: Path):
    result = subprocess.run(
        [str(BIN / "rffm"), "bench", "staging", "--size-gb", "0.1", "--repeats", "1", "--work-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.strip().splitlines()
    report = json.loads(lines[-1])
    assert report["staging"]["large"]["bytes"] > 3.99 * report["staging"]["small"]["bytes"] > 0  # 4x the rows
    assert report["raw_read_mb_per_s"] > 0 and report["raw_write_mb_per_s"] > 0
    assert report["throughput_fraction"] > 0 and report["rss_ratio"] > 0
    assert report["resident_after_evict"] is None or 0 <= report["resident_after_evict"] <= 1
    assert report["raw_copy_mb_per_s"] > 0 and report["throughput_fraction_of_copy"] > 0 and report["copy_fraction_of_read"] > 0
    assert any(line.startswith("throughput / raw read bandwidth = ") for line in lines)
    assert list(tmp_path.iterdir()) == []  # generated files and staged splits removed
