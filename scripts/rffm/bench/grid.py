"""`rffm bench grid`: a grid of R runs on one hidden-state cache, co-located per cache against per run (issue 36).

The grid: R plain runs on one (dataset, backbone) — `--config`'s first run (default: the WavesFM-shaped example
backbone, config/examples/wavesfm_like.yaml, on the default config's synthetic data; `make example-weights` first),
its train block with seeds 0 .. R-1, `--epochs` epochs each, not exported; paths in that config are read from the
current directory, as Snakemake reads them. Its dataset and backbone are made first, in one working folder that each
arm then starts from (not timed). Locally Snakemake ignores groups, so the bench executes each arm the way a cluster
places its group jobs (cache.colocate; workflow/docs/concepts.md, "Co-location by cache"), every job by the real
Snakemake scheduler, a node standing for a scratch folder that starts empty:

    per-cache  one group job on one node: one `snakemake --cores <cores>` of the whole grid (each run's validation
               selection) on one scratch: build_cache builds the cache there and every epoch of every run reads it.
    per-run    the cache record's own job (`snakemake --cores <cores>` to the record, its own scratch), then one
               `snakemake --cores 1 --nolock` per run to its selection, each on a fresh scratch of its own, so each
               run's first epoch builds the cache again (the node-local memo) before it trains. The run's jobs wait
               for the record, as the group jobs do on a cluster; then they run side by side, <cores> at a time: on a
               cluster each run is a node of its own, here a core of its own, so both arms hold the same cores and
               the per-run arm gains the parallelism it buys on a cluster, as far as this machine's cores allow.

Measured, per arm: backbone forward passes over the data set, counted from the build records (the cache record's
provenance `built` and each epoch's provenance `cache_build`, present when the epoch built the cache itself), with
the forward batches those records count; CPU-seconds (user + system) of every process the arm started, from the
kernel's rusage of this process's children; wall time, the clock around the arm's scheduler runs. Reported:

    forwards     per-cache / per-run backbone passes over the data (the invariant: 1 and R + 1)
    cpu_ratio    per-cache CPU-seconds / per-run CPU-seconds
    wall_ratio   per-cache wall time / per-run wall time
    artifacts_identical  the selected heads (results/artifacts/, by content) of the two arms are the same bytes

The bench exits 1 when an invariant fails (forwards other than 1 and R + 1, or artifacts that differ). The last line
printed is one JSON object.
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from rffm.bench import work_folder
from rffm.bench.scheduled import SNAKEFILE, jobs_run, snakemake, write_config
from rffm.records.files import read_json, sha256_file
from rffm.records.layout import (
    ARTIFACTS,
    PROVENANCE_NAME,
    SENTINEL_NAME,
    backbone_folder,
    cache_folder,
    dataset_folder,
    epoch_folder,
    selection_folder,
)

DEFAULT_CONFIG = SNAKEFILE.parents[1] / "config" / "config.yaml"  # where wavesfm_like.yaml's dataset (synth) is
EXAMPLE = "config/examples/wavesfm_like.yaml"
ARMS = ("per-cache", "per-run")
FACTS = "bench_grid.json"  # the arms' measured facts, in the work folder (conclude reads them)
SETTINGS = ("threads", "epoch_threads", "cache")  # the top-level settings the grid takes from the configs


def absolute(backbone: dict[str, Any]) -> dict[str, Any]:
    """A backbone's spec with its weights path and user-code import path made absolute from the current directory."""
    spec = {**backbone}
    if "path" in spec:
        spec["path"] = str(Path(spec["path"]).resolve())
    if "import_path" in spec.get("python", {}):
        spec["python"] = {**spec["python"], "import_path": str(Path(spec["python"]["import_path"]).resolve())}
    return spec


def grid_config(like: str, runs: int, epochs: int) -> dict[str, Any]:
    """The grid's workflow config: `like`'s first run's dataset and backbone (looked up in `like` over the default
    config), R runs of its train block with seeds 0 .. R-1; scratch and cache.colocate are the arms'."""
    default, given = (yaml.safe_load(Path(path).read_text()) or {} for path in (DEFAULT_CONFIG, like))
    merged = {key: {**default.get(key, {}), **given.get(key, {})} for key in ("datasets", "backbones")}
    first = next(iter(given["runs"].values()))
    backbone = absolute(merged["backbones"][first["backbone"]])
    datasets = {first["dataset"], *([backbone["dataset"]] if "dataset" in backbone else [])}
    train = {**first["train"], "epochs": epochs}
    grid = {
        f"grid{i + 1}": {"dataset": first["dataset"], "backbone": first["backbone"], "train": {**train, "seed": i}, "export": False}
        for i in range(runs)
    }
    settings = {key: given.get(key, default.get(key)) for key in SETTINGS if key in given or key in default}
    return {
        "results": "results",
        **settings,
        "device": "cpu",
        "datasets": {name: merged["datasets"][name] for name in sorted(datasets)},
        "backbones": {first["backbone"]: backbone},
        "runs": grid,
    }


def node_config(work: Path, base: dict[str, Any], arm: str, node: str) -> Path:
    """The config file of one node's scheduler run: the grid with the arm's cache.colocate and the node's own scratch."""
    config = {**base, "scratch": str(work / "nodes" / node), "cache": {**base.get("cache", {}), "colocate": arm}}
    return write_config(work / f"config-{node}.yaml", config)


def cache_record(base: dict[str, Any]) -> str:
    """The grid's cache record (its sentinel), as a target."""
    run = next(iter(base["runs"].values()))
    return f"results/{cache_folder(run['dataset'], run['backbone'])}/{SENTINEL_NAME}"


def selection(run: str) -> str:
    """A run's validation selection (its sentinel), as a target."""
    return f"results/{selection_folder(run)}/{SENTINEL_NAME}"


def cpu_seconds() -> float:
    """User + system CPU-seconds of every child process this process has waited for (and of theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(arm: Callable[[], list[str]]) -> dict[str, Any]:
    """Run an arm: its wall seconds, its processes' CPU-seconds, the jobs its scheduler runs ran and how many there were."""
    before, started = cpu_seconds(), time.perf_counter()
    outputs = arm()
    wall, cpu = time.perf_counter() - started, cpu_seconds() - before
    jobs: dict[str, int] = {}
    for output in outputs:
        for rule, count in jobs_run(output).items():
            jobs[rule] = jobs.get(rule, 0) + count
    return {"wall_s": wall, "cpu_s": cpu, "jobs": dict(sorted(jobs.items())), "scheduler_runs": len(outputs)}


def per_cache(work: Path, base: dict[str, Any], cores: int) -> list[str]:
    """One group job on one node: the whole grid in one scheduler run on one scratch; its output."""
    configfile = node_config(work, base, "per-cache", "node")
    return [snakemake(work, configfile, cores, [selection(run) for run in base["runs"]])]


def per_run(work: Path, base: dict[str, Any], cores: int) -> list[str]:
    """The cache record's job on its own node, then each run's group on a node of its own (a fresh scratch, one core),
    `cores` of them at once; their outputs."""
    outputs = [snakemake(work, node_config(work, base, "per-run", "cache"), cores, [cache_record(base)])]
    nodes = [(node_config(work, base, "per-run", run), selection(run)) for run in base["runs"]]
    with ThreadPoolExecutor(max_workers=cores) as pool:
        outputs += pool.map(lambda node: snakemake(work, node[0], 1, [node[1]], "--nolock"), nodes)
    return outputs


def cache_builds(results: Path, base: dict[str, Any]) -> dict[str, Any]:
    """The backbone's passes over the data set an arm made, from the build records: where, and their forward batches."""
    run = next(iter(base["runs"].values()))
    record = read_json(results / cache_folder(run["dataset"], run["backbone"]) / PROVENANCE_NAME)
    builds = {"build_cache": record["batch_stats"]} if record.get("built") else {}
    for name, spec in base["runs"].items():
        for epoch in range(1, spec["train"]["epochs"] + 1):
            details = read_json(results / epoch_folder(name, epoch) / PROVENANCE_NAME)
            if "cache_build" in details:
                builds[f"{name}/{epoch}"] = details["cache_build"]["batch_stats"]
    batches = sum(split["successes"] for stats in builds.values() for split in stats.values())
    return {"forwards": len(builds), "forward_batches": batches, "built_by": list(builds)}


def artifacts(results: Path) -> dict[str, str]:
    """{name: sha256} of the selected heads an arm wrote (results/artifacts/, named by content)."""
    root = results / ARTIFACTS
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def conclude(work: Path) -> int:
    """Count each arm's backbone passes from its records, compare the arms' artifacts, print the figures (the last line
    JSON); 1 when an invariant fails. Reads the facts main() left in `work` and the arms' results there."""
    facts = read_json(work / FACTS)
    base, arms = facts["config"], facts["arms"]
    runs = len(base["runs"])
    builds = {arm: cache_builds(work / arm / "results", base) for arm in ARMS}
    digests = {arm: artifacts(work / arm / "results") for arm in ARMS}
    expected = {"per-cache": 1, "per-run": runs + 1}
    problems = [
        f"{work / arm / 'results'}: the {arm} arm built the cache {builds[arm]['forwards']} times ({', '.join(builds[arm]['built_by'])}), "
        f"not {expected[arm]}: a bug in co-location or in the bench (--keep keeps the work folder to read)"
        for arm in ARMS
        if builds[arm]["forwards"] != expected[arm]
    ]
    identical = bool(digests["per-cache"]) and digests["per-cache"] == digests["per-run"]
    if not identical:
        problems.append(
            f"{work}/per-run/results/{ARTIFACTS}: the selected heads differ from the per-cache arm's ({sorted(digests['per-run'])} vs "
            f"{sorted(digests['per-cache'])}): co-location must never change a result (--keep keeps the work folder to read)"
        )
    wall, cpu = ({arm: arms[arm][key] for arm in ARMS} for key in ("wall_s", "cpu_s"))
    result = {
        "bench": "grid",
        "runs": runs,
        "epochs": facts["epochs"],
        "cores": facts["cores"],
        "config": facts["like"],
        "per_cache_forwards": builds["per-cache"]["forwards"],
        "per_run_forwards": builds["per-run"]["forwards"],
        "per_cache_forward_batches": builds["per-cache"]["forward_batches"],
        "per_run_forward_batches": builds["per-run"]["forward_batches"],
        "per_run_built_by": builds["per-run"]["built_by"],
        "per_cache_cpu_s": round(cpu["per-cache"], 2),
        "per_run_cpu_s": round(cpu["per-run"], 2),
        "cpu_ratio": round(cpu["per-cache"] / cpu["per-run"], 3),
        "per_cache_s": round(wall["per-cache"], 2),
        "per_run_s": round(wall["per-run"], 2),
        "wall_ratio": round(wall["per-cache"] / wall["per-run"], 3),
        "per_cache_jobs": arms["per-cache"]["jobs"],
        "per_run_jobs": arms["per-run"]["jobs"],
        "per_cache_scheduler_runs": arms["per-cache"]["scheduler_runs"],
        "per_run_scheduler_runs": arms["per-run"]["scheduler_runs"],
        "artifacts": len(digests["per-cache"]),
        "artifacts_identical": identical,
        "invariants_hold": not problems,
    }
    passes = f"per-cache {result['per_cache_forwards']}, per-run {result['per_run_forwards']} (expected 1 and {runs + 1})"
    print(f"backbone passes over the data (from the build records): {passes}")
    print(f"CPU-seconds: per-cache {result['per_cache_cpu_s']} / per-run {result['per_run_cpu_s']} = {result['cpu_ratio']}")
    print(f"wall, --cores {facts['cores']}: per-cache {result['per_cache_s']} s / per-run {result['per_run_s']} s = {result['wall_ratio']}")
    for problem in problems:
        print(problem, file=sys.stderr)
    print(json.dumps(result))
    return 1 if problems else 0


def main(runs: int, epochs: int, cores: int, like: str = EXAMPLE, work_dir: str | None = None, keep: bool = False) -> int:
    """Make the grid's dataset and backbone once, run each arm as a cluster places it; print the figures, the last line JSON."""
    with work_folder("rffm-bench-grid-", work_dir, keep) as work:
        base = grid_config(like, runs, epochs)
        prepared = work / "prepared"
        prepared.mkdir()
        run = next(iter(base["runs"].values()))
        made = [f"results/{dataset_folder(run['dataset'])}/{SENTINEL_NAME}", f"results/{backbone_folder(run['backbone'])}/{SENTINEL_NAME}"]
        snakemake(prepared, node_config(prepared, base, "per-cache", "prepared"), cores, made)
        arms = {}
        for arm, execute in zip(ARMS, (per_cache, per_run), strict=True):
            folder = shutil.copytree(prepared, work / arm, symlinks=True, copy_function=shutil.copy2)
            arms[arm] = measured(lambda execute=execute, folder=folder: execute(folder, base, cores))
            print(f"{arm}: {arms[arm]['wall_s']:.1f} s, {arms[arm]['cpu_s']:.1f} CPU-s, jobs {arms[arm]['jobs']}", flush=True)
        facts = {"config": base, "like": like, "epochs": epochs, "cores": cores, "arms": arms}
        (work / FACTS).write_text(json.dumps(facts))
        return conclude(work)
