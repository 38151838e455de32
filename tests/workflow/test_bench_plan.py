"""`rffm bench plan` (issue 47) at test size: rffm's dry run beside the bare Snakefile of its shape, on every profile."""

from __future__ import annotations

import json
import subprocess

from conftest import BIN, REPO


def test_the_plan_bench_counts_the_same_jobs_as_the_bare_snakefile_and_bounded_groups():
    """2 and 9 runs x 2 epochs: rffm and bare plan the same jobs (the bench refuses otherwise); on the cluster profiles
    9 runs are ceil(9 / 8) = 2 group jobs and 2 cache builds (cache.runs_per_group 8, the default); locally none."""
    command = [str(BIN / "rffm"), "bench", "plan", "--runs", "2", "9", "--epochs", "2"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {(row["profile"], row["runs"]): row for row in result["rows"]}
    assert sorted(rows) == sorted((p, r) for p in ("local", "slurm", "gcp-batch") for r in (2, 9))
    for (profile, runs), row in rows.items():
        # per run: 2 epochs, select, its figure, qualify, export, manifest summary; stage, backbone, cache, the target
        assert row["jobs"] == runs * 7 + 4, row
        assert row["rffm_cpu_s"] > 0 and row["bare_cpu_s"] > 0, row
        groups = 0 if profile == "local" else {2: 1, 9: 2}[runs]
        assert (row["group_jobs"], row["cache_builds"]) == (groups, max(groups, 1)), row
    assert result["runs_ratio"] == 4.5 and set(result["growth"]) == {"local", "slurm", "gcp-batch"}
