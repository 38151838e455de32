"""`rffm bench plan`: what a study's dry run costs as it grows, rffm's workflow beside a bare Snakefile of its shape.

The study: the tiny config (config/examples/tiny.yaml) with R runs on its one cache, each a copy of its first run with
its own seed and `--epochs` epochs. For each R (default 100 and 1,000) and each profile (local; profiles/slurm;
profiles/gcp-batch against an in-memory GCS emulator on 127.0.0.1, as the tests use), two dry runs side by side,
`snakemake -n --quiet rules` of the default target in an empty working folder:

    rffm  workflow/Snakefile with the study's config
    bare  scripts/rffm/bench/bare.smk: rffm's rules and their edges (stage, backbone, cache, each run's chain of epochs,
          selection, its figure, qualification, export, manifest summary) as shell rules with one output each and
          lookups for inputs, grouped as rffm groups them on that profile (rffm.plan.planning.colocation; none locally)

Measured per dry run: CPU-seconds (user + system) of the `snakemake` process, from the kernel's rusage of this
process's children; jobs (the plan's total); group jobs and cache builds (from rffm's plan note on a cluster; the
DAG's build_cache jobs locally). Reported: rffm / bare CPU-seconds per profile and R, and rffm's CPU-seconds at the
largest R over the smallest (linear: about their ratio of runs). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import re
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rffm import config as rffm_config
from rffm.bench import work_folder
from rffm.bench.scheduled import SNAKEFILE
from rffm.plan import planning

ROOT = SNAKEFILE.parents[1]
BARE = Path(__file__).with_name("bare.smk")
TINY = ROOT / "config" / "examples" / "tiny.yaml"
PROFILES = ("local", "slurm", "gcp-batch")
BUCKET = "rffm-bench-plan"
# what profiles/gcp-batch reads from the environment (profiles/README.md, Google Cloud); no request leaves 127.0.0.1
BATCH_ENV = {
    "RFFM_GCP_PROJECT": "rffm-bench",
    "RFFM_GCS_BUCKET": BUCKET,
    "RFFM_BATCH_SERVICE_ACCOUNT": "rffm-batch@rffm-bench.iam.gserviceaccount.com",
    "RFFM_WORKER_IMAGE": "us-central1-docker.pkg.dev/rffm-bench/rffm/worker@sha256:" + "0" * 64,
}
NOTE = re.compile(r"note: plan: cache \S+: (\d+|1) cache builds?, .* in (one|\d+) group jobs?")


def study(runs: int, epochs: int) -> dict[str, Any]:
    """The tiny config with `runs` copies of its first run (seeds 0 .. runs-1, `epochs` epochs each, no profiling)."""
    config = yaml.safe_load(TINY.read_text())
    first = next(iter(config["runs"].values()))
    first.pop("profiling", None)
    config["runs"] = {}
    for seed in range(runs):
        run = copy.deepcopy(first)
        run["train"].update(seed=seed, epochs=epochs)
        config["runs"][f"r{seed:04d}"] = run
    return config


def bare_config(config: dict[str, Any], grouped: bool) -> dict[str, Any]:
    """The bare Snakefile's config: each run's cache and epochs, and rffm's groups where the profile has groups."""
    runs = {n: {"dataset": r["dataset"], "backbone": r["backbone"], "epochs": r["train"]["epochs"]} for n, r in config["runs"].items()}
    bare: dict[str, Any] = {"runs": runs}
    if grouped:
        filled = copy.deepcopy(config)
        schema = rffm_config.load_schema()
        rffm_config.fill_defaults(filled, schema, schema)
        placed = planning.colocation(filled)
        bare["groups"] = {"builds": {f"{d}__{b}": g for (d, b), g in placed.builds.items()}, "epochs": placed.epochs}
    return bare


@contextlib.contextmanager
def bench_bucket() -> Iterator[str]:
    """The Cloud Storage emulator with the bench's bucket while the block runs; its URL."""
    from rffm.cloud.emulator import gcs_emulator

    try:
        import gcp_storage_emulator.server  # noqa: F401  (gcs_emulator's)
        from google.cloud import storage
    except ImportError:
        raise SystemExit("rffm bench plan: the gcp-batch profile needs gcp-storage-emulator. Fix: pip install -e '.[dev]'") from None
    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)  # a dry run's every missing object is its "error"
    with gcs_emulator() as url:
        try:
            os.environ["STORAGE_EMULATOR_HOST"] = url
            storage.Client(project=BATCH_ENV["RFFM_GCP_PROJECT"]).create_bucket(BUCKET)
            yield url
        finally:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)


def dry_run(snakefile: Path, configfile: Path, work: Path, profile: str, env: dict[str, str]) -> tuple[float, str]:
    """CPU-seconds of one `snakemake -n --quiet rules` (its rusage as this process's child) and its output."""
    command = [str(Path(sys.executable).with_name("snakemake")), "-s", str(snakefile), "-d", str(work), "-n", "--quiet", "rules"]
    command += ["--configfile", str(configfile)]
    if snakefile == SNAKEFILE:
        command.append("--replace-workflow-config")
    if profile != "local":
        command += ["--profile", str(ROOT / "profiles" / profile)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"rffm bench plan: {' '.join(command)} failed ({done.returncode}):\n{output[-3000:]}")
    return round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2), output


def plan_counts(output: str) -> dict[str, int]:
    """Jobs, build_cache jobs and (from rffm's colocation note) cache builds and group jobs of a dry run."""
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", output, flags=re.MULTILINE))
    counts = {"jobs": int(stats["total"]), "build_cache_jobs": int(stats.get("build_cache", 0))}
    if found := NOTE.search(output):
        counts["cache_builds"] = int(found[1])
        counts["group_jobs"] = 1 if found[2] == "one" else int(found[2])
    return counts


def measure(work: Path, runs: int, epochs: int, profile: str, env: dict[str, str]) -> dict[str, Any]:
    """rffm's and the bare Snakefile's dry runs of one study on one profile, side by side."""
    config = study(runs, epochs)
    folder = work / f"{profile}-{runs}"
    folder.mkdir(parents=True)
    rffm_file = folder / "config.yaml"
    rffm_file.write_text(yaml.safe_dump(config, sort_keys=False))
    bare_file = folder / "bare.json"
    bare_file.write_text(json.dumps(bare_config(config, grouped=profile != "local")))
    rffm_cpu, rffm_out = dry_run(SNAKEFILE, rffm_file, folder / "rffm", profile, env)
    bare_cpu, bare_out = dry_run(BARE, bare_file, folder / "bare", profile, env)
    rffm_counts, bare_counts = plan_counts(rffm_out), plan_counts(bare_out)
    if rffm_counts["jobs"] != bare_counts["jobs"]:
        raise SystemExit(f"rffm bench plan: {profile}, {runs} runs: rffm plans {rffm_counts['jobs']} jobs, bare {bare_counts['jobs']}")
    if profile == "local":
        rffm_counts.update(cache_builds=rffm_counts["build_cache_jobs"], group_jobs=0)
    return {"profile": profile, "runs": runs, "epochs": epochs, "rffm_cpu_s": rffm_cpu, "bare_cpu_s": bare_cpu,
            "ratio": round(rffm_cpu / bare_cpu, 2), **rffm_counts}  # fmt: skip


def run(work: Path, runs: list[int], epochs: int, profiles: list[str], report=print) -> dict[str, Any]:
    """Every (profile, R) pair measured; the ratios the issue bounds."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    rows = []
    for profile in profiles:
        with bench_bucket() if profile == "gcp-batch" else contextlib.nullcontext():
            profile_env = {**env, **BATCH_ENV, "STORAGE_EMULATOR_HOST": os.environ.get("STORAGE_EMULATOR_HOST", "")}
            for count in runs:
                row = measure(work, count, epochs, profile, profile_env if profile == "gcp-batch" else env)
                report(f"{profile:10} {count:5} runs x {epochs} epochs: rffm {row['rffm_cpu_s']:7.2f} CPU-s, bare "
                       f"{row['bare_cpu_s']:7.2f} ({row['ratio']}x); {row['jobs']} jobs, {row['group_jobs']} group jobs, "
                       f"{row['cache_builds']} cache builds")  # fmt: skip
                rows.append(row)
    growth = {
        p: round(by[-1]["rffm_cpu_s"] / by[0]["rffm_cpu_s"], 2) for p in profiles if len(by := [r for r in rows if r["profile"] == p]) > 1
    }
    largest = max(runs)
    worst = max(r["ratio"] for r in rows if r["runs"] == largest)
    return {"bench": "plan", "epochs": epochs, "runs": runs, "rows": rows, "growth": growth,
            "worst_ratio_at_largest": worst, "runs_ratio": round(largest / min(runs), 2), "cpus": os.cpu_count()}  # fmt: skip


def main(args: argparse.Namespace) -> int:
    """Entry point of `rffm bench plan`."""
    with work_folder("rffm-bench-plan-", args.work_dir, args.keep) as work:
        result = run(work, args.runs, args.epochs, args.profiles, report=lambda line: print(line, flush=True))
    print(json.dumps(result, sort_keys=True))
    return 0
