"""The everyday commands (status, verify, compare, prune, ...) and the benchmarks: each calls one function the tests call too."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rffm.errors import RffmError
from rffm.records.layout import RUNS, TENSORBOARD, run_folder


def _judged(args: argparse.Namespace) -> tuple[dict | None, object]:
    """(the config read, the judgment of the tree): the tree's plan records, `--config` where they agree (or with
    --by-config); a tree without records: --config, else config/config.yaml when its `results` is this tree."""
    from rffm.config import for_results, load
    from rffm.records.plans import judge

    given = load(args.config) if args.config else None
    judgment = judge(args.results_dir, given, args.by_config)
    if judgment.config is None and not args.config:
        given = for_results(args.results_dir) or None
        judgment = judge(args.results_dir, given, True)
    for note in judgment.notes:
        print(f"note: {note}", file=sys.stderr if getattr(args, "json", False) else sys.stdout)
    return given, judgment


def compare(args: argparse.Namespace) -> int:
    from rffm.ops.compare import collect, design_records, render, seed_groups

    given, judgment = _judged(args)
    rows = collect(args.results_dir, judgment.config, unknown=judgment.unknown)
    if not rows:
        print(f"no qualified runs or references under {args.results_dir}/{RUNS}", file=sys.stderr if args.json else sys.stdout)
        return 1
    groups = seed_groups(rows, args.results_dir)
    design_records(given or judgment.config, groups, args.records)  # the design is what the config says now
    _print_rows(rows, render(rows, groups), args.json, groups=groups)
    return 0


def status(args: argparse.Namespace) -> int:
    from rffm.ops.status import collect, render

    given, judgment = _judged(args)
    if args.cost:
        return status_cost(args, given or judgment.config)
    rows = collect(args.results_dir, judgment, full=args.full)
    if not rows:
        print(f"no runs under {args.results_dir}/{RUNS}", file=sys.stderr if args.json else sys.stdout)
        return 1
    _print_rows(rows, render(rows, full=args.full), args.json)
    return 0


def status_cost(args: argparse.Namespace, config: dict | None) -> int:
    """`rffm status --cost`: per stage, the predicted seconds (the throughput record) against the measured ones."""
    import json

    from rffm.plan import cost

    if config is None:
        print(f"{args.results_dir}: no plan to cost (no config, no plan records). Fix: pass --config FILE", file=sys.stderr)
        return 1
    record = args.throughput or config.get("throughput")
    jobs, unknown = cost.planned_jobs(config, args.results_dir)
    lines = cost.fit(cost.read_record(record, "--throughput")) if record else {}
    stages = cost.by_stage(jobs, cost.predict(jobs, lines, config["device"]), args.results_dir)
    table = cost.render_stages(stages, record)
    for line in unknown:
        print(f"note: {line}", file=sys.stderr)
    if args.json:
        print(table, file=sys.stderr, flush=True)
        print(json.dumps({"throughput": record, "stages": stages}, sort_keys=True))
    else:
        print(table)
    return 0


def throughput(args: argparse.Namespace) -> int:
    """`rffm throughput`: add the finished jobs of a results tree to a throughput record (the plan's cost)."""
    from rffm.plan import cost

    given, judgment = _judged(args)
    config = given or judgment.config
    if config is None:
        print(f"{args.results_dir}: no plan to read (no config, no plan records). Fix: pass --config FILE", file=sys.stderr)
        return 1
    jobs, unknown = cost.planned_jobs(config, args.results_dir)
    for line in unknown:
        print(f"note: {line}", file=sys.stderr)
    points = cost.record_points(args.results_dir, jobs)
    if not points:
        print(f"{args.results_dir}: no finished job of the plan to measure. Fix: run the workflow (snakemake) first", file=sys.stderr)
        return 1
    record = cost.write_record(args.out, points)
    print(f"{args.out}: {len(points)} job(s) of {args.results_dir} recorded ({len(record['points'])} in all)")
    return 0


def _print_rows(rows: list[dict], table: str, as_json: bool, **more: list[dict]) -> None:
    """The table on stdout; with --json the rows (and `more`, e.g. compare's groups) as one JSON line on stdout and
    the table on stderr (`| jq` reads it)."""
    if not as_json:
        print(table)
        return
    from rffm.report.measurement import rows_json

    print(table, file=sys.stderr, flush=True)
    print(rows_json(rows, **more))


def verify(args: argparse.Namespace) -> int:
    from rffm.ops.verify import verify_tree

    config, judgment = _judged(args)
    report = verify_tree(args.results_dir, config, args.scratch, judgment)
    for problem in report.broken:
        print(f"BROKEN {problem}")
    for folder in report.stale:
        print(f"STALE {Path(args.results_dir) / folder} (the plan no longer has it; `rffm prune` removes it)")
    for note in report.notes:
        print(f"note: {note}")
    for line in report.protection:
        print(f"ledger {line}")
    if not report.checked:
        print(f"no sentinels of the current plan under {args.results_dir}")
        return 1
    print(f"{report.checked} sentinels checked, {len(report.broken)} problem(s), {len(report.stale)} stale folder(s)")
    return 1 if report.broken else 0


def prune(args: argparse.Namespace) -> int:
    from rffm.errors import ConfigError
    from rffm.ops.prune import prune as remove

    _, judgment = _judged(args)
    if judgment.config is None:
        raise ConfigError(f"{args.results_dir}: no config plans this tree, so nothing can be called stale. Fix: pass --config FILE")
    folders, kept = remove(args.results_dir, judgment, delete=args.delete, qualified=args.delete_qualified)
    kept_dirs = [Path(args.results_dir) / run_folder(run) for run in kept]
    for folder in folders:
        held = any(folder.is_relative_to(run) for run in kept_dirs)
        print(f"{'removed' if args.delete and not held else 'stale'} {folder}")
    if not folders:
        print(f"nothing stale under {args.results_dir}")
    elif not args.delete:
        but = " (but the qualified runs below)" if kept else ""
        print(f"{len(folders)} stale folder(s); `{_prune_command(args, ['--delete'])}` removes them{but}")
    for run in kept:
        print(
            f"kept {run_folder(run)}: qualified (its test result); prune deletes a qualified run only when it is named. "
            f"Fix: {_prune_command(args, ['--delete', '--delete-qualified', run])}"
        )
    return 0


def _prune_command(args: argparse.Namespace, extra: list[str]) -> str:
    """This prune command again with more options (as the user typed its tree and configs)."""
    import shlex

    words = ["rffm", "prune", args.results_dir]
    words += ["--config", *args.config] if args.config else []
    words += ["--by-config"] if args.by_config else []
    return shlex.join(words + extra)


def unlock(args: argparse.Namespace) -> int:
    from rffm.ops.unlock import unlock as clear

    status, message = clear(args.directory)
    print(message)
    return status  # 0: a dead run's lock removed; 1: not locked; 3: a lock left alone (live, or not judged here)


def predict(args: argparse.Namespace) -> int:
    from rffm.ops.predict import predict as classify
    from rffm.ops.predict import render, summary

    result = classify(
        args.model, args.input, top_k=args.top_k, batch_size=args.batch_size, stride=args.stride, allow_test=args.i_know_this_is_test
    )
    fmt = args.format or ("json" if args.out and args.out.endswith(".json") else "csv")
    if args.out:
        Path(args.out).write_text(render(result, fmt))
        print(f"{summary(result)} -> {args.out}")
    else:
        sys.stdout.write(render(result, fmt))
        print(summary(result), file=sys.stderr)
    return 0


def vertex_job(args: argparse.Namespace) -> int:
    from rffm.cloud import vertex

    body = vertex.custom_job(
        image=args.image,
        config=args.config,
        output_uri=args.output,
        display_name=args.display_name,
        strategy=args.strategy,
        timeout_hours=args.timeout_hours,
        boot_disk_gb=args.boot_disk_gb,
        procedure=args.procedure,
        max_wait_hours=args.max_wait_hours,
        service_account=args.service_account,
    )
    print(f"Vertex AI CustomJob request (checked against aiplatform_v1.CustomJob): {vertex.write(body, args.out)}")
    return 0


def mlflow(args: argparse.Namespace) -> int:
    from rffm.ops.tracking import log_results

    for run, what in log_results(args.results_dir, args.tracking_uri, args.experiment).items():
        print(f"{run}: {what}")
    return 0


def install_profiles(args: argparse.Namespace) -> int:
    """Link every profile that can be linked; exit 2 naming each one left alone (with its Fix), 0 when all are."""
    from rffm.cloud.profiles import CHECKOUT
    from rffm.cloud.profiles import install_profiles as install

    linked, refused = install(args.checkout or CHECKOUT)
    for line in linked:
        print(line)
    for line in refused:  # one line per name left alone, each as the CLI prints an error; the others are linked
        print(f"rffm {args.command}: error: {line}", file=sys.stderr)
    return 2 if refused else 0


def release_immutable(args: argparse.Namespace) -> int:
    from rffm.ops.clean import release_immutable as release

    released, refused = release(Path(folder) for folder in args.folders)
    for line in released:
        print(line)
    for line in refused:
        print(f"rffm {args.command}: error: {line}", file=sys.stderr)
    return 2 if refused else 0


def preflight(args: argparse.Namespace) -> int:
    from rffm.cloud.preflight import preflight as check
    from rffm.cloud.profiles import CHECKOUT

    problems, checked = check(args.profile, Path(args.checkout) if args.checkout else CHECKOUT)
    for line in problems:
        print(f"PROBLEM {line}")
    for line in checked if not problems else []:
        print(f"checked {line}")
    if problems:
        print(f"{len(problems)} problem(s); nothing was submitted")
    return 1 if problems else 0


def posttrain(args: argparse.Namespace) -> int:
    from rffm.cloud.posttrain import posttrain as run

    return run(args.config, args.hidden_state_cache_directory, args.procedure, args.directory, args.cores, args.snakefile)


def tensorboard(args: argparse.Namespace) -> int:
    from rffm.runtime.tensorboard import export, log_dir_from_env

    log_dir = args.log_dir or log_dir_from_env() or str(Path(args.results_dir) / TENSORBOARD)
    try:
        written = export(args.results_dir, log_dir)
    except ImportError:
        raise RffmError("tensorboardX is not installed. Fix: pip install 'rffm[tensorboard]'") from None
    for run, count in written.items():
        print(f"{run}: {count} epoch(s) -> {log_dir}/{run}")
    if not written:
        print(f"no finished epochs under {args.results_dir}/{RUNS}")
        return 1
    print(f"view with: tensorboard --logdir {log_dir}")
    return 0


def config_reference(args: argparse.Namespace) -> int:
    from rffm.ops import config_reference as reference

    schema = args.schema or reference.SCHEMA
    if args.check or args.write:
        document = args.check or args.write
        if reference.update(document, schema, write=bool(args.write)):
            print(f"{document}: configuration reference is up to date")
        elif args.write:
            print(f"{document}: configuration reference rewritten from {schema}")
        else:
            print(f"{document}: configuration reference is out of date with {schema}. Fix: rffm config_reference --write {document}")
            return 1
        return 0
    print(reference.render(schema), end="")
    return 0


def record(args: argparse.Namespace) -> int:
    from rffm.report.measurement import record as write_record

    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    write_record(args.name, command, Path(args.out_dir), Path(args.cwd) if args.cwd else None, args.note, args.reads or [])
    return 0


def figures(args: argparse.Namespace) -> int:
    from rffm.report.figures import documents
    from rffm.report.figures import main as regenerate

    return regenerate(args.docs or documents(Path(".")), Path(args.records), check=args.check)


def bench_cache(args: argparse.Namespace) -> int:
    from rffm.bench.cache import main as bench

    return bench(args.samples, args.work_dir, args.threads, args.repeats, args.oom_limit, args.arch, args.device, args.config)


def bench_sweep(args: argparse.Namespace) -> int:
    from rffm.bench.sweep import main as bench

    return bench(args.samples, args.epochs, args.work_dir, args.threads, args.device, args.cores, args.grid, args.config, args.keep)


def bench_grid(args: argparse.Namespace) -> int:
    from rffm.bench.grid import main as bench

    return bench(args.runs, args.epochs, args.cores, args.config, args.work_dir, args.keep)


def bench_plan(args: argparse.Namespace) -> int:
    from rffm.bench.plan import main as bench

    return bench(args)


def independent_data(args: argparse.Namespace) -> int:
    try:
        from rffm.data.independent import generate
    except ImportError as error:
        print(f"rffm independent_data: {error}. Fix: pip install 'rffm[independent]'", file=sys.stderr)
        return 1
    count = generate(args.out, args.per_class_snr, args.length, args.seed)
    print(f"{args.out}: {count} examples (RadioML 2018 layout; stage it with source: radioml2018 and select.classes)")
    return 0


def bench_scale(args: argparse.Namespace) -> int:
    from rffm.bench.scale import main as bench

    return bench(args.fractions, args.runs, args.epochs, args.cores, args.work_dir, args.keep, args.shared)


def bench_staging(args: argparse.Namespace) -> int:
    from rffm.bench.staging import main as bench

    return bench(args)
