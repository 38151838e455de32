"""Smaller traps of issue 25, one test each: misspelt rules and runs, targets beyond a run's plan, the
invalid-configuration message (one frame-free report, references in the same pass), the SLURM profile's device."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, SNAKEFILE, WARM, plan_of, snakemake, tiny_config, write_config

pytestmark = pytest.mark.workflow


def refusal(workdir: Path, *args: str) -> str:
    """The rffm line a dry run refuses with (and no traceback, no Snakemake frame)."""
    result = snakemake(workdir, "-n", *args, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output and "MissingRuleException" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("rffm: ")]
    assert len(lines) == 1, output
    return lines[0]


def test_a_misspelt_rule_is_refused_naming_the_rules(fresh_workdir: Path):
    line = refusal(fresh_workdir, "final_qualificaton")
    assert "'final_qualificaton': the workflow has no such target" in line and "final_qualification, " in line


def test_a_misspelt_run_is_refused_naming_the_configured_runs(fresh_workdir: Path):
    line = refusal(fresh_workdir, "results/runs/bsae/qualification/run_manifest.json")
    assert "'bsae' is no configured run or reference (configured: base)" in line


def test_an_epoch_beyond_the_plan_is_refused(fresh_workdir: Path):
    line = refusal(fresh_workdir, "results/runs/base/epochs/7/checkpoint.pt")
    assert "runs.base.train.epochs plans epochs 1 to 3, not 7" in line
    assert snakemake(fresh_workdir, "-n", "results/runs/base/epochs/3/checkpoint.pt").returncode == 0


def test_an_invalid_config_is_reported_without_a_snakemake_frame_and_with_its_references(fresh_workdir: Path):
    config = tiny_config()
    config["runs"]["base"]["train"]["lr"] = "fast"  # a schema problem
    config["runs"]["base"]["dataset"] = "tinyy"  # and a reference problem, reported in the same pass
    write_config(fresh_workdir, config)
    result = snakemake(fresh_workdir, "-n", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "WorkflowError" not in output and 'File "' not in output, output
    assert "rffm: invalid configuration" in output
    assert "runs.base.train.lr: 'fast' is not of type 'number'" in output
    assert "runs.base.dataset: 'tinyy' is not defined under datasets (defined: tiny)" in output


@pytest.mark.parametrize("text, what", [("", "the configuration file is empty"), ("[1, 2]\n", "holds a list, not a mapping")])
def test_an_empty_or_non_mapping_default_config_gets_the_workflows_line(fresh_workdir: Path, text: str, what: str):
    (fresh_workdir / "config").mkdir()
    (fresh_workdir / "config/config.yaml").write_text(text)  # the Snakefile's own configfile
    line = refusal(fresh_workdir)
    assert line.startswith(f"rffm: config/config.yaml: {what}"), line


def plain(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """`snakemake -s <checkout>/workflow/Snakefile -d <workdir> <args>` as typed (no --configfile of the helper's)."""
    command = [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(workdir), *args]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return WARM.run_any(command, workdir, env)


def test_a_target_after_configfile_and_an_empty_configfile_are_fixed_as_troubleshooting_says(fresh_workdir: Path):
    """Issue 34: Snakemake reads --configfile before any workflow code runs, so these two stay its messages
    (workflow/docs/troubleshooting.md names them); each documented Fix, applied literally, plans the run."""
    after = plain(fresh_workdir, "-n", "--configfile", "config.yaml", "validation_selection")
    said = after.stdout + after.stderr  # Snakemake prints it on stdout: its logging is not set up yet
    assert after.returncode != 0 and "No such file or directory: 'validation_selection'" in said, said[-2000:]
    for fixed in (
        ["-n", "validation_selection", "--configfile", "config.yaml"],
        ["-n", "--configfile", "config.yaml", "--cores", "2", "validation_selection"],
    ):
        result = plain(fresh_workdir, *fixed)
        assert result.returncode == 0 and "select_checkpoint[run=base]" in plan_of(result.stdout), result.stderr[-2000:]
        assert "qualify[run=base]" not in plan_of(result.stdout)

    (fresh_workdir / "my.yaml").write_text("")
    empty = plain(fresh_workdir, "-n", "--configfile", "my.yaml")
    said = empty.stdout + empty.stderr
    assert empty.returncode != 0 and "Config file must be given as JSON or YAML with keys at top level." in said, said[-2000:]
    (fresh_workdir / "my.yaml").write_text((fresh_workdir / "config.yaml").read_text())  # the Fix: the configuration in it
    assert plain(fresh_workdir, "-n", "--configfile", "my.yaml").returncode == 0
