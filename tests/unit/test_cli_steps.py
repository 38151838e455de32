"""cli/steps: every `rffm <rule>` verb calls its step's run() with exactly run()'s parameters, by name.

With tests/workflow/test_pipeline.py (each rule's shell string passes exactly its row's flags) this is the
rule <-> code contract: a flag the rule passes and run() does not take, or the other way round, fails here."""

from __future__ import annotations

import argparse
import importlib
import inspect
from pathlib import Path

import pytest

from rffm.cli import steps as cli
from rffm.records.pipeline import STEPS, Rule


def placeholder(flag: str):
    """A value of the option's type (no step runs: run() is replaced)."""
    option = cli.FLAGS[flag]
    if flag == "--source-root":
        return "."  # the verb changes into it
    if option.get("nargs") in ("+", "*"):
        return ["x"]
    if option.get("type") in (int, float):
        return option["type"](0)
    return {} if option.get("type") is not None else ""


@pytest.mark.parametrize("step", STEPS, ids=[step.rule for step in STEPS])
def test_each_verb_calls_its_run_with_exactly_its_parameters(step: Rule, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    module = importlib.import_module(f"rffm.{step.module}")
    signature = inspect.signature(module.run)
    passed: dict = {}

    def run(*args, **kwargs) -> Path:
        passed.update(signature.bind(*args, **kwargs).arguments)  # a missing or unknown parameter: TypeError
        return tmp_path / "sentinel.json"

    run.__signature__ = signature
    monkeypatch.setattr(module, "run", run)
    monkeypatch.setattr("rffm.runtime.device.setup", lambda threads: None)  # this process's torch threads stay
    args = {cli._dest(flag): placeholder(flag) for flag in step.flags}
    args |= {"spec": {"run": "r"}} if step.spec else {}
    args |= {"threads": 1, "device": "cpu"} if step.torch else {}
    monkeypatch.chdir(tmp_path)
    cli.run_step(argparse.Namespace(step=step, **args))
    assert set(passed) == set(signature.parameters), step.rule  # run() takes nothing the rule never passes
