"""The pipeline table (rffm.records.pipeline) and the layout (rffm.records.layout) against the DAG Snakemake builds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO, snakemake, tiny_config, write_config
from rffm.config import check
from rffm.records import layout, pipeline
from rffm.records.code import code_digest


def configs() -> dict[str, dict]:
    """The tiny config (profiled), and one with a floor run, a sweep and an end-to-end reference (a sweep too) beside it."""
    tiny, mixed = tiny_config(), tiny_config()
    mixed["backbones"]["random-init"] = {**mixed["backbones"]["mini"], "source": "random", "pretrain": {"seed": 0}}
    mixed["runs"]["floor"] = {**mixed["runs"]["base"], "backbone": "random-init", "sweep": {"train.lr": [0.01, 0.02]}}
    mixed["runs"]["floor"].pop("profiling")
    train = {"epochs": 2, "lr": 0.01, "batch_size": 16, "seed": 0}
    sweep = {"train.lr": [0.01, 0.03]}
    mixed["references"] = {"cnn": {"dataset": "tiny", "model": {"width": 8, "blocks": 2}, "train": train, "sweep": sweep}}
    return {"tiny": tiny, "mixed": mixed}


def dag_sentinels(workdir: Path) -> set[str]:
    """The step folders (relative to results) of every sentinel the full plan's DAG outputs (`snakemake --summary`)."""
    lines = snakemake(workdir, "--summary").stdout.splitlines()
    outputs = [line.split("\t")[0] for line in lines[1:] if line.strip()]
    prefix = "results/"
    return {path[len(prefix) : -len("/sentinel.json")] for path in outputs if path.endswith(f"/{layout.SENTINEL_NAME}")}


@pytest.mark.parametrize("name", ["tiny", "mixed"])
def test_planned_steps_are_the_sentinels_of_the_dag(tmp_path: Path, name: str):
    config = configs()[name]
    write_config(tmp_path, config)
    planned = dag_sentinels(tmp_path)
    check(config)  # the schema's defaults, as the workflow sees the config
    assert planned and layout.planned_steps(config) == planned


def test_every_rule_is_a_row_of_the_pipeline_table_and_runs_its_module(tmp_path: Path):
    write_config(tmp_path, configs()["mixed"])
    listed = snakemake(tmp_path, "--list-rules").stdout.split()
    rules = set(listed) - {"final_qualification", "validation_selection"}
    assert rules == set(pipeline.RULES)
    assert all((REPO / "scripts/rffm" / f"{step.module.replace('.', '/')}.py").is_file() for step in pipeline.STEPS)
    assert all(code_digest(step.module) for step in pipeline.STEPS)


def test_the_ledger_policy_comes_from_the_table():
    assert pipeline.SELECTION_STEPS == (
        "stage_dataset",
        "pretrain_backbone",
        "import_backbone",
        "build_cache",
        "train_epoch",
        "select_checkpoint",
    )
    assert pipeline.REFERENCE_STEPS == ("stage_dataset", "train_reference")
    # every backbone source is built by exactly one step
    assert {source: pipeline.backbone_step(source) for source in ("pretrain", "random", "checkpoint", "python", "export")} == {
        "pretrain": "pretrain_backbone",
        "random": "pretrain_backbone",
        "checkpoint": "import_backbone",
        "python": "import_backbone",
        "export": "import_backbone",
    }


def test_each_rule_passes_exactly_the_options_its_row_names(tmp_path: Path):
    """The rule's shell string and the table's `flags` (which build `rffm <rule>`'s parser) name the same options."""
    write_config(tmp_path, configs()["mixed"])  # every option appears: a sweep, epochs after the first, a reference
    printed = snakemake(tmp_path, "-n", "-p").stdout
    passed: dict[str, set[str]] = {}
    for line in printed.splitlines():
        words = line.removeprefix("Shell command: ").split()
        if len(words) > 1 and words[0] == "rffm" and words[1] in pipeline.BY_RULE:
            passed.setdefault(words[1], set()).update(re.findall(r"(?<!\S)(--[a-z-]+)", line))
    for text in (REPO / "workflow/rules").glob("*.smk"):  # and as written (the mixed config imports no backbone)
        for rule, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", text.read_text(), re.M | re.S):
            shell = "".join(re.findall(r'"([^"]*)"', body.split("shell:")[1])) if "shell:" in body else ""
            passed.setdefault(rule, set()).update(re.findall(r"(?<!\S)(--[a-z-]+)", shell)) if shell.startswith("rffm ") else None
    assert set(passed) == set(pipeline.RULES)
    for rule, flags in passed.items():
        step = pipeline.BY_RULE[rule]
        own = ({"--spec"} if step.spec else set()) | ({"--threads"} if step.torch else set())
        assert flags - {"--device"} == set(step.flags) | own, rule  # --device: a torch step's, default cpu
        assert step.torch or "--device" not in flags, rule
