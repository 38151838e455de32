"""The plan's cost (rffm.plan.cost): each heavy job's work from the config, a throughput record's fit, predictions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import tiny_config
from rffm.config import check
from rffm.errors import ConfigError
from rffm.plan import cost


def test_a_fit_over_two_sizes_separates_the_fixed_part_from_the_rate():
    points = [{"key": "k", "device": "cpu", "work": work, "seconds": 2.0 + work / 1000} for work in (1000, 4000, 8000)]
    ((fixed, per_unit),) = cost.fit(points).values()
    assert fixed == pytest.approx(2.0) and per_unit == pytest.approx(1e-3)
    job = cost.Job("build_cache", "caches/x", "k", 64000)
    assert cost.predict([job], cost.fit(points), "cpu") == [pytest.approx(66.0)]
    assert cost.predict([job], cost.fit(points), "cuda") == [None]  # measured on a CPU: says nothing of a GPU


def test_one_size_measured_predicts_through_the_origin():
    lines = cost.fit([{"key": "k", "device": "cpu", "work": 100, "seconds": 5.0}] * 2)
    assert lines[("k", "cpu")] == (0.0, 0.05)


def test_each_heavy_job_of_the_tiny_plan_is_counted_in_its_unit():
    config = check(tiny_config())
    counts = cost.dataset_size(config, "no-results", "tiny")[0]
    run = config["runs"]["base"]
    jobs, unknown = cost.planned_jobs(config, "no-results")
    assert unknown == []
    stages = [job.stage for job in jobs]
    epochs = run["train"]["epochs"]
    assert stages == ["stage_dataset", "pretrain_backbone", "build_cache", *["train_epoch"] * epochs, "select_checkpoint", "qualify"]
    by_stage = {job.stage: job for job in jobs}
    assert by_stage["build_cache"].work == counts["train"] + counts["val"]
    assert by_stage["qualify"].work == counts["test"]
    assert by_stage["select_checkpoint"].work == epochs  # it reads each epoch's record, not the val rows
    # a random backbone's job verifies the train split's bytes: its work is the split's IQ samples
    raw = tiny_config()
    name = run["backbone"]
    random = check({**raw, "backbones": {name: {**raw["backbones"][name], "source": "random"}}})
    made = next(job for job in cost.planned_jobs(random, "no-results")[0] if job.stage == "pretrain_backbone")
    assert made.work == counts["train"] * cost.dataset_size(config, "no-results", "tiny")[1]
    # a seed or a learning rate does not change a job's rate: same key
    other = check({**tiny_config(), "runs": {"base": {**tiny_config()["runs"]["base"], "train": {**run["train"], "seed": 7, "lr": 0.1}}}})
    assert [job.key for job in cost.planned_jobs(other, "no-results")[0]] == [job.key for job in jobs]


def test_a_record_keeps_each_job_once_and_a_missing_one_says_how_to_measure(tmp_path: Path):
    point = {"key": "k", "device": "cpu", "work": 1, "seconds": 1.0, "started_unix": 5.0}
    path = tmp_path / "throughput.json"
    cost.write_record(path, [point])
    assert len(cost.write_record(path, [point])["points"]) == 1
    assert cost.read_record(path) == [point]
    with pytest.raises(ConfigError, match=r"^throughput: \S+/absent\.json does not exist\. Fix: run a pilot .*rffm throughput"):
        cost.read_record(tmp_path / "absent.json")
    (tmp_path / "foreign.json").write_text(json.dumps({"points": 3}))
    with pytest.raises(ConfigError, match=r"is not a throughput record of format 1\. Fix: "):
        cost.read_record(tmp_path / "foreign.json")


def test_an_unstaged_source_of_unknown_size_is_named_with_its_fix():
    config = check(tiny_config())
    config["datasets"]["tiny"] = {**config["datasets"]["tiny"], "source": "sigmf", "sigmf": {"path": "x.sigmf-meta", "window": 128}}
    jobs, unknown = cost.planned_jobs(config, "no-results")
    assert jobs == [] and len(unknown) == 1
    assert unknown[0].startswith("datasets.tiny: its size is not known before it is staged") and "Fix: snakemake " in unknown[0]
