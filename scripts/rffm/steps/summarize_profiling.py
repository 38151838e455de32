"""summarize_profiling: cache_lifecycle_summary.json of a profiled run, from the phase timings its steps recorded."""

from __future__ import annotations

from pathlib import Path

from rffm.records.layout import PROVENANCE_NAME, SENTINEL_NAME
from rffm.records.step import Step
from rffm.runtime.profiling import SUMMARY_NAME, summarize

RULE = "summarize_profiling"


def run(run_name: str, cache_provenance: str | Path, epoch_dirs: list[str | Path], profile_dir: str | Path) -> Path:
    """The summary beside the run's traces; its sentinel vouches for it (the chart reads it)."""
    with Step(RULE, profile_dir, key={"run": run_name}, params={}) as step:
        for directory in map(Path, epoch_dirs):  # runs/<run>/epochs/<k>
            step.consume(f"epoch_{directory.name}", directory / SENTINEL_NAME)
        provenances = [Path(d) / PROVENANCE_NAME for d in epoch_dirs]
        summarize(run_name, cache_provenance, provenances, step.out_dir, step.out_dir / SUMMARY_NAME)
        step.output(SUMMARY_NAME)
    return step.sentinel
