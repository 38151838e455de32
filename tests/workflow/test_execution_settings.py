"""Execution settings say how a step runs, never what it computes: changing one on a finished run plans no job.

They reach the steps as Snakemake resources, which none of Snakemake's rerun triggers (mtime, params,
input, software-env, code) looks at; the steps' outputs do not depend on them (tests/unit/test_cache.py:
identical caches whatever the batch size; profiling never changes an epoch).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import planned_jobs, snakemake, tiny_config, write_config

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
        ("cache.colocate", "per-run"),  # a cluster's group jobs (local runs carry no groups): the default is per-cache
        ("cache.runs_per_group", 1),  # the most runs of a cluster's group job
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


def test_nested_command_line_values_plan_as_the_same_values_in_the_config_file(workdir: Path, selected_workdir: Path):
    """Issue 34: Snakemake passes `--config 'cache={batch_size: 8}'`'s 8 as the string '8' (YAML's base loader); the
    workflow reads it as the config file would: accepted, the same params (nothing planned on the finished run for the
    run's own lr) and the same plan as the value written in the file (a fourth epoch)."""
    lr = tiny_config()["runs"]["base"]["train"]["lr"]
    assert planned_jobs(workdir, "--config", "cache={batch_size: 8}", f"runs={{base: {{train: {{lr: {lr}}}}}}}") == []
    four = planned_jobs(selected_workdir, "validation_selection", "--config", "runs={base: {train: {epochs: 4}}}")
    assert "train_epoch[run=base, epoch=4]" in four, four
    config = tiny_config()
    config["runs"]["base"]["train"]["epochs"] = 4
    write_config(selected_workdir, config)
    assert planned_jobs(selected_workdir, "validation_selection") == four
    refused = snakemake(workdir, "-n", "--config", "cache={batch_size: eight}", check=False)
    assert refused.returncode != 0 and "  cache.batch_size: 'eight' is not of type 'integer'. Fix: " in refused.stderr, refused.stderr
