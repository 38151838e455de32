"""Issue 50: a mis-indented config file, run through the real `snakemake`. Snakemake reads `--configfile` itself before
any workflow code runs (snakemake.settings.types.ConfigSettings, built by its command line), so its message stays its
own, naming no file; workflow/docs/troubleshooting.md quotes it and gives `rffm status --config FILE`, which names the
file, line and column. The Snakefile's own config/config.yaml is read by rffm first and gets that line directly."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO, SNAKEFILE, WARM, plan_of, tiny_text

pytestmark = pytest.mark.workflow

TROUBLESHOOTING = REPO / "workflow" / "docs" / "troubleshooting.md"
SNAKEMAKES_LINE = "Config file is not valid JSON or YAML. In case of YAML, make sure to not mix whitespace and tab indentation."
LINE, MISINDENTED = 24, "   backbone: mini\n"  # 3 spaces among its 4-space siblings (runs.base)
WHERE = "24:4: not valid YAML (expected <block end>, but found '<block mapping start>', in a block mapping from line 22)."
FIX = "Fix: indent every key of one mapping by the same number of spaces (no tabs), e.g. compare with config/config.yaml"


def misindented() -> str:
    lines = tiny_text().splitlines(keepends=True)
    assert lines[LINE - 1] == "    backbone: mini\n"
    lines[LINE - 1] = MISINDENTED
    return "".join(lines)


def environment() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


def plain(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """`snakemake -s <checkout>/workflow/Snakefile -d <workdir> <args>` as typed (no --configfile of the helper's)."""
    return WARM.run_any([str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(workdir), *args], workdir, environment())


def test_a_misindented_configfile_gets_snakemakes_line_and_the_documented_command_names_its_line(tmp_path: Path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "my.yaml").write_text(misindented())
    refused = plain(workdir, "-n", "--configfile", "my.yaml")
    said = refused.stdout + refused.stderr  # Snakemake prints it on stdout: its logging is not set up yet
    assert refused.returncode != 0 and SNAKEMAKES_LINE in said, said[-2000:]
    documented = " ".join(TROUBLESHOOTING.read_text().split())  # the entry's symptom, as wrapped in the Markdown
    assert f"**`WorkflowError: {SNAKEMAKES_LINE}`**" in documented and "`rffm status --config my.yaml`" in documented

    pinpointed = subprocess.run(["rffm", "status", "--config", "my.yaml"], cwd=workdir, env=environment(), capture_output=True, text=True)
    assert pinpointed.returncode == 2 and pinpointed.stderr == f"rffm status: error: my.yaml:{WHERE} {FIX}\n", pinpointed.stderr

    (workdir / "my.yaml").write_text(tiny_text())  # the Fix: line 24 indented like its siblings
    fixed = plain(workdir, "-n", "--configfile", "my.yaml")
    assert fixed.returncode == 0 and "train_epoch[run=base, epoch=3]" in plan_of(fixed.stdout), fixed.stderr[-2000:]


def test_a_misindented_default_config_gets_the_workflows_line_naming_its_line(tmp_path: Path):
    workdir = tmp_path / "work"
    (workdir / "config").mkdir(parents=True)
    (workdir / "config" / "config.yaml").write_text(misindented())  # the Snakefile's own configfile
    refused = plain(workdir, "-n")
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "Traceback" not in said and SNAKEMAKES_LINE not in said, said[-2000:]
    assert [line for line in said.splitlines() if line.startswith("rffm: ")] == [f"rffm: config/config.yaml:{WHERE} {FIX}"], said

    (workdir / "config" / "config.yaml").write_text(tiny_text())  # the Fix: line 24 indented like its siblings
    fixed = plain(workdir, "-n")
    assert fixed.returncode == 0 and "train_epoch[run=base, epoch=3]" in plan_of(fixed.stdout), fixed.stderr[-2000:]
