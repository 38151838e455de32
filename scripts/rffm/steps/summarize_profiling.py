"""summarize_profiling: cache_lifecycle_summary.json of a profiled run, from the phase timings its steps recorded."""

from __future__ import annotations

from pathlib import Path

from rffm.records import provenance
from rffm.records.files import atomic_write_json
from rffm.records.layout import PROVENANCE_NAME, SENTINEL_NAME, profiling_folder
from rffm.records.step import Step
from rffm.records.store import given_store
from rffm.runtime.profiling import SUMMARY_NAME, summarize

RULE = "summarize_profiling"


def run(
    run_name: str, cache_record_dir: str | Path, epoch_dirs: list[str | Path], profile_dir: str | Path, *, store: str | None = None
) -> Path:
    """The summary beside the run's traces (listed from the results store); its sentinel vouches for it (the chart reads it)."""
    cache_record_dir = Path(cache_record_dir)
    with Step(RULE, profile_dir, key={"run": run_name}, params={}) as step:
        step.consume("cache", cache_record_dir / SENTINEL_NAME)
        parts = {"build_cache": provenance.read(cache_record_dir / PROVENANCE_NAME, cache_record_dir / SENTINEL_NAME)}
        for directory in map(Path, epoch_dirs):  # runs/<run>/epochs/<k>
            step.consume(f"epoch_{directory.name}", directory / SENTINEL_NAME)
            parts[f"epoch{directory.name}"] = provenance.read(directory / PROVENANCE_NAME, directory / SENTINEL_NAME)
        results = given_store(store, RULE)
        traces = [Path(key).name for key in results.list(profiling_folder(run_name)) if key.endswith(".trace.json")]
        atomic_write_json(step.out_dir / SUMMARY_NAME, summarize(run_name, parts, traces))
        step.output(SUMMARY_NAME)
    return step.sentinel
