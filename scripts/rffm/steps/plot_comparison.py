"""plot_comparison: floor | frozen backbone | end-to-end, as a report figure and a JSON table (rffm.ops.compare).

The one report output that depends on timings: the legend gives each result's wall time (its steps'
recorded durations), so rerunning a step redraws it; the accuracies come from the qualified results.
"""

from __future__ import annotations

from pathlib import Path

from rffm.ops import compare
from rffm.records.files import atomic_write_json
from rffm.records.layout import COMPARISON_FIGURE, COMPARISON_TABLE, MANIFEST_NAME, SENTINEL_NAME, qualification_folder
from rffm.records.step import Step

RULE = "plot_comparison"


def run(results_dir: str | Path, runs: list[str], out_dir: str | Path) -> Path:
    """Write comparison.png and comparison.json for the named qualified runs and references."""
    results = Path(results_dir)
    with Step(RULE, out_dir, key={}, params={"runs": sorted(runs)}) as step:
        for name in sorted(runs):
            step.consume(f"qualification_{name}", results / qualification_folder(name) / SENTINEL_NAME, [MANIFEST_NAME])
        rows = compare.collect(results, names=runs)
        groups = compare.seed_groups(rows, results)
        compare.plot(groups, rows, step.out_dir / COMPARISON_FIGURE)
        atomic_write_json(step.out_dir / COMPARISON_TABLE, {"rows": rows, "groups": groups})
        step.output(COMPARISON_FIGURE)
        step.output(COMPARISON_TABLE)
    return step.sentinel
