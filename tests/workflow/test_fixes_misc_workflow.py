"""Issue 34: printed Fixes (and workflow/docs/troubleshooting.md entries) whose following needs the real workflow:
`rffm mlflow` without mlflow or on a tree not yet qualified, a step run by hand before its inputs existed, and a figure
that looks stale. Each is provoked on a copy of a session tree (or a fresh tiny config), its Fix is done as written,
and the same command then works."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, planned_jobs, snakemake, tiny_config
from fixes import fix_of, run_fix
from rffm.cli import main
from rffm.config import entry_defaults

pytestmark = pytest.mark.workflow
OFFLINE_PIP = {"PIP_NO_INDEX": "1", "PIP_DRY_RUN": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # as in test_fixes_misc.py
RUN = Path("results/runs/base")


def rffm(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rffm"), *args], cwd=workdir, capture_output=True, text=True)


def test_mlflow_missing_then_no_qualified_run_are_fixed_by_pip_install_then_the_workflow_to_final_qualification(
    selected_workdir: Path, monkeypatch, capsys
):
    """ops/tracking.py's two refusals, in the order a user meets them on a tree only validation-selected."""
    results = str(selected_workdir / "results")

    def refusal() -> str:
        capsys.readouterr()
        assert main(["mlflow", results]) == 2
        return capsys.readouterr().err.strip()

    with monkeypatch.context() as hidden:
        hidden.setitem(sys.modules, "mlflow", None)  # as if mlflow were not installed
        line = refusal()
    assert line.endswith("mlflow is not installed. Fix: pip install 'rffm[mlflow]'"), line
    done = run_fix(fix_of(line), selected_workdir, env=OFFLINE_PIP)  # the extra's check: tests/unit/test_fixes_misc.py
    assert "Requirement already satisfied: rffm[mlflow]" in done.stdout and "Would install" not in done.stdout, done.stdout

    line = refusal()
    assert fix_of(line) == "run the workflow to final_qualification first.", line
    snakemake(selected_workdir, "final_qualification")
    capsys.readouterr()
    assert main(["mlflow", results]) == 0
    assert re.fullmatch(r"base: logged \w+", capsys.readouterr().out.strip())
    assert (selected_workdir / "mlruns").is_dir()  # the default store, beside the results tree


def test_a_step_run_by_hand_before_its_inputs_exist_is_fixed_by_running_the_upstream_target_first(fresh_workdir: Path, monkeypatch, capsys):
    """troubleshooting.md: `…/sentinel.json: sentinel is missing; the step that writes it has not completed.` — you ran
    an `rffm` step by hand before its inputs existed; run `snakemake` (or the upstream target) first."""
    spec = entry_defaults("backbones", {"name": "mini", **tiny_config()["backbones"]["mini"]})  # what the rule passes
    by_hand = ["pretrain_backbone", "--spec", json.dumps(spec), "--threads", "1", "--device", "cpu"]
    by_hand += ["--dataset-dir", "results/datasets/tiny", "--out-dir", "results/backbones/mini"]
    monkeypatch.chdir(fresh_workdir)
    capsys.readouterr()
    assert main(by_hand) == 2  # `rffm pretrain_backbone …`, in-process
    line = capsys.readouterr().err.strip()
    missing = re.search(r"error: (\S+/sentinel\.json): sentinel is missing; the step that writes it has not completed\.", line)
    assert missing and missing[1] == "results/datasets/tiny/sentinel.json" and "\n" not in line, line
    snakemake(fresh_workdir, missing[1])  # the upstream target
    assert main(by_hand) == 0  # the same command, by hand again
    assert (fresh_workdir / "results/backbones/mini/sentinel.json").is_file()


def test_a_stale_looking_figure_is_fixed_by_snakemake_and_a_changed_one_is_named_by_verify(workdir: Path):
    """troubleshooting.md, "A plot or the report looks stale": `snakemake -n` shows a figure that is not up to date
    (here: deleted) and `snakemake` draws it again; one changed by hand is no rule's business: `rffm verify` names it,
    BROKEN with the command that draws it again (the damage battery runs such commands)."""
    curves = workdir / RUN / "report/validation/training_curves.png"
    lifecycle = workdir / RUN / "report/profiling/cache_lifecycle.png"
    before = curves.read_bytes()
    curves.unlink()
    lifecycle.write_bytes(before)  # another figure's bytes in its place
    assert planned_jobs(workdir) == ["plot_training[run=base]"]
    snakemake(workdir)
    assert curves.read_bytes() == before
    verify = rffm(workdir, "verify", "results")
    broken = [line for line in verify.stdout.splitlines() if line.startswith("BROKEN")]
    assert verify.returncode != 0 and len(broken) == 1, verify.stdout
    assert broken[0].startswith(f"BROKEN {lifecycle.relative_to(workdir)}: ") and " Fix: rm -f " in broken[0], broken[0]
