"""The benches' arms as the workflow runs them: `snakemake` processes on the real Snakefile, timed, their jobs counted."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from rffm.runtime.processes import run_as_group

SNAKEFILE = Path(__file__).resolve().parents[3] / "workflow" / "Snakefile"


def write_config(path: Path, config: dict[str, Any]) -> Path:
    """`config` as a YAML config file at `path`."""
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake(work: Path, configfile: Path, cores: int, targets: list[str], *extra: str) -> str:
    """Run `snakemake --cores <cores> <targets>` in `work` with `configfile` (and `extra` flags); its output. A failure
    raises with the output's end and the failed jobs' logs."""
    command = [str(Path(sys.executable).with_name("snakemake")), "-s", str(SNAKEFILE), "-d", str(work), "--cores", str(cores)]
    command += [*targets, "--configfile", str(configfile), *extra]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "RFFM_PLAIN_PROGRESS": "1"}
    result = run_as_group(command, cwd=work, env=env)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        logs = sorted(set(re.findall(r"^\s*log: (\S+)", output, flags=re.MULTILINE)))
        failed = "".join(f"\n== {log}:\n" + (work / log).read_text()[-2000:] for log in logs if (work / log).is_file())
        raise RuntimeError(f"snakemake {' '.join(targets)} failed ({result.returncode}) in {work}:\n{output[-5000:]}{failed}")
    return output


def scheduler_run(work: Path, config: dict[str, Any], cores: int, target: str) -> tuple[float, str]:
    """Seconds of one `snakemake --cores <cores> <target>` in `work` with `config` (the clock around the process), its output."""
    configfile = write_config(work / "config.yaml", config)
    started = time.perf_counter()
    output = snakemake(work, configfile, cores, [target])
    return time.perf_counter() - started, output


def jobs_run(output: str) -> dict[str, int]:
    """{rule: jobs} a scheduler run ran, from its log."""
    counts: dict[str, int] = {}
    for rule in re.findall(r"^\s*(?:local)?(?:rule|checkpoint) (\w+):$", output, flags=re.MULTILINE):
        counts[rule] = counts.get(rule, 0) + 1
    return counts
