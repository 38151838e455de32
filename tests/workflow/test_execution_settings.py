"""Execution settings say how a step runs, never what it computes: changing one on a finished run plans no job.

They reach the steps as Snakemake resources, which none of Snakemake's rerun triggers (mtime, params,
input, software-env, code) looks at; the steps' outputs do not depend on them (tests/unit/test_cache.py:
identical caches whatever the batch size; profiling never changes an epoch).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import planned_jobs, tiny_config, write_config

pytestmark = pytest.mark.workflow


def with_setting(key: str, value) -> dict:
    config = tiny_config()
    target = config
    *path, leaf = key.split(".")
    for part in path:
        target = target.setdefault(part, {})
    target[leaf] = value
    return config


@pytest.mark.parametrize(
    "key, value",
    [
        ("device", "auto"),  # the device of backbone passes and epochs
        ("cache.batch_size", 7),  # examples per backbone forward
        ("cache.disk_headroom", 0),  # the free-space check
        ("runs.base.profiling", None),  # profiling off (the tiny run is profiled)
        ("runs.base.profiling.batch_count", 5),  # more traced batches
        ("threads", 2),  # torch threads of the heavy steps
        ("epoch_threads", 2),
        ("launch_profile", "default"),  # which profile launched the run
    ],
)
def test_changing_an_execution_setting_plans_no_job(workdir: Path, key: str, value):
    config = with_setting(key, value)
    if value is None:
        config["runs"]["base"].pop("profiling")
    write_config(workdir, config)
    assert planned_jobs(workdir) == [], f"changing {key} planned jobs"
