"""Job start-up: a step's process imports what its step uses, and nothing of Snakemake's (issue 33).

Every job is a fresh `rffm <rule>` process, and thousands of them start in a test run and on a cluster: a step
that never touches a tensor does not pay for importing torch, and no step imports Snakemake or an executor plugin
(pandas, the Google Cloud clients)."""

from __future__ import annotations

import json
import subprocess
import sys

from rffm.records.pipeline import RULES, STEPS

TENSORLESS = ("stage_dataset", "plot_training", "summarize_manifest", "summarize_profiling", "plot_cache_lifecycle", "plot_comparison")


def imported_by(modules: list[str]) -> set[str]:
    """The modules a fresh interpreter holds after importing these."""
    code = "import importlib, json, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout))


def test_the_steps_that_never_touch_a_tensor_and_the_cli_import_no_torch():
    assert set(TENSORLESS) <= set(RULES)
    loaded = imported_by(["rffm.cli", *(f"rffm.{step.module}" for step in STEPS if step.rule in TENSORLESS)])
    assert "torch" not in loaded and "onnx" not in loaded


def test_inspecting_a_results_tree_imports_no_torch():
    """rffm status, verify, compare, prune and unlock read records and check files: no tensor, so no torch (~1.7 s each)."""
    loaded = imported_by([f"rffm.ops.{name}" for name in ("status", "verify", "compare", "prune", "unlock")])
    assert "rffm.data.cache_reader" in loaded  # verify opens caches (checks every byte) without torch
    assert "torch" not in loaded


def test_no_step_imports_snakemake_or_an_executor_plugin():
    loaded = imported_by(["rffm.cli", *(f"rffm.{step.module}" for step in STEPS)])
    assert "torch" in loaded  # the check can see an import
    heavy = ("snakemake", "pandas", "sqlmodel", "google.")  # google and google.cloud alone: empty namespace packages
    assert sorted(name for name in loaded if name.startswith(heavy) and name != "google.cloud") == []


def test_a_torch_steps_setup_is_deterministic_without_importing_the_compiler():
    """rffm.runtime.device.setup: torch's deterministic algorithms on (warn only), one thread, and no torch._inductor
    (torch.use_deterministic_algorithms would import it: ~1.6 s of CPU in every torch step's process)."""
    code = (
        "import sys, torch\nfrom rffm.runtime.device import setup\nsetup(1)\n"
        "print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),"
        " torch.get_num_threads(), 'torch._inductor' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True", "1", "False"]
