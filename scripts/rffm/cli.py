"""Command-line interface: `rffm <rule>` runs one workflow step (the verb is the rule's name), plus the
everyday commands (status, verify, ...). A thin layer: every verb calls one function the tests call too."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rffm import __version__
from rffm.errors import RffmError


def _spec(section: str) -> Callable[[str], dict]:
    """Parse a step's --spec: one entry of the config's `section`, completed with the schema's defaults."""

    def parse(text: str) -> dict:
        from rffm.config import entry_defaults

        try:
            return entry_defaults(section, json.loads(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--spec is not valid JSON: {exc}") from None

    return parse


def _json(text: str) -> dict:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def _torch(args: argparse.Namespace) -> str:
    """Set up torch for a heavy step (threads, determinism) and resolve its device."""
    from rffm.runtime.device import resolve, setup

    setup(args.threads)
    return resolve(args.device)


# ---- the steps: one verb per rule ----


def _from_source_root(args: argparse.Namespace) -> str:
    """The absolute output folder; then work in --source-root, where the rule found the configured source
    files (a storage provider's download folder on Google Batch), so relative config paths resolve there."""
    out_dir = os.path.abspath(args.out_dir)
    if args.source_root and args.source_root != ".":
        os.chdir(args.source_root)
    return out_dir


def stage_dataset(args: argparse.Namespace) -> None:
    from rffm.steps import stage_dataset

    stage_dataset.run(args.spec, _from_source_root(args))


def pretrain_backbone(args: argparse.Namespace) -> None:
    device = _torch(args)
    from rffm.steps import pretrain_backbone

    pretrain_backbone.run(args.spec, args.dataset_dir, args.out_dir, device=device)


def import_backbone(args: argparse.Namespace) -> None:
    from rffm.steps import import_backbone

    import_backbone.run(args.spec, _from_source_root(args))


def _cache_options(args: argparse.Namespace) -> dict:
    """How a cache is built where it is missing (build_cache, or an epoch on a fresh node)."""
    return {"batch_size": args.batch_size, "disk_headroom": args.disk_headroom, "batch_profile": args.batch_profile}


def build_cache(args: argparse.Namespace) -> None:
    device = _torch(args)
    from rffm.steps import build_cache

    inputs = (args.dataset_dir, args.backbone_dir, args.out_dir, args.scratch)
    profiling = {"profile_runs": args.profile_runs or [], "profile_batches": args.profile_batches}
    encoder = json.loads(args.encoder) if args.encoder else None
    build_cache.run(*inputs, **_cache_options(args), spec=encoder, device=device, store=args.store, **profiling)


def train_epoch(args: argparse.Namespace) -> None:
    device = _torch(args)
    from rffm.steps import train_epoch

    inputs = (args.spec, args.cache_record_dir, args.epoch, args.previous_dir, args.out_dir)
    memo = {"store": args.store, "memo_store": args.memo_store or None}
    train_epoch.check_planned_members(args.spec, args.members)
    train_epoch.run(
        *inputs, scratch=args.scratch, cache_options=_cache_options(args), device=device, **memo, profile_batches=args.profile_batches
    )


def select_checkpoint(args: argparse.Namespace) -> None:
    from rffm.steps import select_checkpoint

    select_checkpoint.run(args.spec, args.epoch_dirs, args.out_dir, store=args.store)


def qualify(args: argparse.Namespace) -> None:
    device = _torch(args)
    from rffm.steps import qualify

    sentinel = qualify.run(
        args.spec,
        args.selection_dir,
        args.dataset_dir,
        args.backbone_dir,
        args.cache_record_dir,
        args.epoch_dirs,
        args.out_dir,
        source=args.source,
        batch_size=args.batch_size,
        store=args.store,
        batch_profile=args.batch_profile,
        device=device,
        launch_profile=args.launch_profile or None,
    )
    print(f"run manifest: {Path(sentinel).parent / 'run_manifest.json'}")


def train_reference(args: argparse.Namespace) -> None:
    _torch(args)
    from rffm.steps import train_reference

    train_reference.run(args.spec, args.dataset_dir, args.out_dir, store=args.store)


def qualify_reference(args: argparse.Namespace) -> None:
    _torch(args)
    from rffm.steps import qualify_reference

    sentinel = qualify_reference.run(args.spec, args.selection_dir, args.dataset_dir, args.out_dir, source=args.source, store=args.store)
    print(f"run manifest: {Path(sentinel).parent / 'run_manifest.json'}")


def plot_training(args: argparse.Namespace) -> None:
    from rffm.steps import plot_training

    plot_training.run(args.run, args.epoch_dirs, args.selection_dir, args.out_dir)


def summarize_manifest(args: argparse.Namespace) -> None:
    from rffm.steps import summarize_manifest

    summarize_manifest.run(args.run, args.qualification_dir, args.out_dir)


def summarize_profiling(args: argparse.Namespace) -> None:
    from rffm.steps import summarize_profiling

    summarize_profiling.run(args.run, args.cache_record_dir, args.epoch_dirs, args.profile_dir, store=args.store)


def plot_cache_lifecycle(args: argparse.Namespace) -> None:
    from rffm.steps import plot_cache_lifecycle

    plot_cache_lifecycle.run(args.run, args.summary, args.out_dir)


def plot_comparison(args: argparse.Namespace) -> None:
    from rffm.steps import plot_comparison

    plot_comparison.run(args.results_dir, args.runs, args.out_dir)


def export(args: argparse.Namespace) -> None:
    _torch(args)
    from rffm.steps import export as step

    dirs = (args.qualification_dir, args.selection_dir, args.dataset_dir, args.backbone_dir, args.cache_record_dir)
    sentinel = step.run(args.spec, *dirs, args.out_dir, store=args.store)
    print(f"exported classifier: {Path(sentinel).parent / step.CARD}")


# ---- everyday commands ----


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
        print(f"note: {note}")
    return given, judgment


def compare(args: argparse.Namespace) -> int:
    from rffm.ops.compare import collect, render

    _, judgment = _judged(args)
    rows = collect(args.results_dir, judgment.config, unknown=judgment.unknown)
    if not rows:
        print(f"no qualified runs or references under {args.results_dir}/runs")
        return 1
    print(render(rows))
    return 0


def status(args: argparse.Namespace) -> int:
    from rffm.ops.status import collect, render

    _, judgment = _judged(args)
    rows = collect(args.results_dir, judgment, full=args.full)
    if not rows:
        print(f"no runs under {args.results_dir}/runs")
        return 1
    print(render(rows, full=args.full))
    return 0


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
    kept_dirs = [Path(args.results_dir) / "runs" / run for run in kept]
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
            f"kept runs/{run}: qualified (its test result); prune deletes a qualified run only when it is named. "
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
    from rffm.ops import vertex

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
    from rffm.ops.profiles import CHECKOUT
    from rffm.ops.profiles import install_profiles as install

    for line in install(args.checkout or CHECKOUT):
        print(line)
    return 0


def preflight(args: argparse.Namespace) -> int:
    from rffm.ops.preflight import preflight as check
    from rffm.ops.profiles import CHECKOUT

    problems, checked = check(args.profile, Path(args.checkout) if args.checkout else CHECKOUT)
    for line in problems:
        print(f"PROBLEM {line}")
    for line in checked if not problems else []:
        print(f"checked {line}")
    if problems:
        print(f"{len(problems)} problem(s); nothing was submitted")
    return 1 if problems else 0


def posttrain(args: argparse.Namespace) -> int:
    from rffm.ops.posttrain import posttrain as run

    return run(args.config, args.hidden_state_cache_directory, args.procedure, args.directory, args.cores, args.snakefile)


def tensorboard(args: argparse.Namespace) -> int:
    from rffm.runtime.tensorboard import export, log_dir_from_env

    log_dir = args.log_dir or log_dir_from_env() or str(Path(args.results_dir) / "tensorboard")
    try:
        written = export(args.results_dir, log_dir)
    except ImportError:
        raise RffmError("tensorboardX is not installed. Fix: pip install 'rffm[tensorboard]'") from None
    for run, count in written.items():
        print(f"{run}: {count} epoch(s) -> {log_dir}/{run}")
    if not written:
        print(f"no finished epochs under {args.results_dir}/runs")
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


def bench_cache(args: argparse.Namespace) -> int:
    from rffm.bench.cache import main as bench

    return bench(args.samples, args.work_dir, args.threads, args.repeats, args.oom_limit, args.arch, args.device, args.config)


def bench_sweep(args: argparse.Namespace) -> int:
    from rffm.bench.sweep import main as bench

    return bench(args.samples, args.epochs, args.work_dir, args.threads, args.device)


def bench_staging(args: argparse.Namespace) -> int:
    from rffm.bench.staging import main as bench

    return bench(args)


# ---- the parser ----


def parser() -> argparse.ArgumentParser:
    """The argument parser for every verb."""
    top = argparse.ArgumentParser(prog="rffm", description=__doc__)
    top.add_argument("--version", action="version", version=f"rffm {__version__}")
    verbs = top.add_subparsers(dest="command", required=True)

    def verb(func: Callable, help_text: str, spec: str = "", torch: bool = False, *flags: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(func.__name__, help=help_text, description=help_text)
        sub.set_defaults(func=func)
        if spec:
            sub.add_argument("--spec", type=_spec(spec), required=True, help=f"JSON: one entry of `{spec}` (the rule passes its params)")
        if torch:
            sub.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
            sub.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (outputs are bit-identical only on CPU)")
        for flag in flags:
            sub.add_argument(flag, required=True)
        return sub

    def backbone_pass(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--batch-size", type=int, required=True, help="largest backbone batch (adapts down on OOM)")
        sub.add_argument("--batch-profile", help="batch-profile JSON shared by backbone passes on this node")

    def config_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--config",
            nargs="+",
            metavar="FILE",
            help="workflow config file(s), merged in order: what the current plan is (default: the plan the workflow "
            "recorded for each run under runs/<run>/launch/; a tree without records: config/config.yaml when its "
            "`results` is RESULTS_DIR); runs it plans otherwise than recorded are judged by the record",
        )
        sub.add_argument("--by-config", action="store_true", help="judge by --config even where the tree recorded another plan")

    def store_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--store", help="the results store: a directory or gs://bucket/prefix (default: the results tree)")

    def cache_options(sub: argparse.ArgumentParser) -> None:
        backbone_pass(sub)
        sub.add_argument("--disk-headroom", type=float, required=True, help="required free scratch space / cache size (0: no check)")
        sub.add_argument("--scratch", required=True, help="this node's directory for the hidden-state cache")
        store_option(sub)

    sub = verb(stage_dataset, "Stage a dataset into canonical HDF5 splits.", "datasets", False, "--out-dir")
    sub.add_argument("--source-root", default=".", help="folder the spec's relative source paths are relative to (default: .)")
    text = "Build a backbone: self-supervised pretraining or random init."
    verb(pretrain_backbone, text, "backbones", True, "--dataset-dir", "--out-dir")
    text = "Import a user backbone (checkpoint, python entry point + weights, torch.export program) after checking its sha256."
    sub = verb(import_backbone, text, "backbones", False, "--out-dir")
    sub.add_argument("--source-root", default=".", help="folder the spec's relative checkpoint path is relative to (default: .)")
    sub = verb(build_cache, "Build the hidden-state cache (node-local) and its record.", "", True, "--dataset-dir", "--backbone-dir")
    sub.add_argument("--out-dir", required=True, help="the record's folder: results/caches/<dataset>__<backbone>")
    cache_options(sub)
    sub.add_argument("--profile-runs", nargs="*", help="runs whose profiling folders get the build's trace")
    sub.add_argument("--profile-batches", type=int, default=0, help="batches to trace (0: no trace)")
    sub.add_argument("--encoder", help="JSON: the backbone's input adapter, taps and keep option (rffm.model.encoder.spec_for)")
    sub = verb(train_epoch, "Train one epoch of the head from cached hidden states.", "runs", True, "--cache-record-dir", "--out-dir")
    sub.add_argument("--epoch", type=int, required=True)
    sub.add_argument("--previous-dir")
    cache_options(sub)
    sub.add_argument("--memo-store", help="where completed epochs are kept for resuming (default: the results store)")
    sub.add_argument("--profile-batches", type=int, default=0, help="batches to trace (0: no trace)")
    sub.add_argument("--members", default="", help="the sweep's members as the plan names them (checked against the spec)")
    sub = verb(select_checkpoint, "Select the best epoch into an immutable artifact.", "runs", False, "--out-dir")
    sub.add_argument("--epoch-dirs", nargs="+", required=True)
    store_option(sub)
    sub = verb(
        qualify,
        "Evaluate the selected artifact once on the test split; write the run manifest.",
        "runs",
        True,
        "--selection-dir",
        "--dataset-dir",
        "--backbone-dir",
        "--cache-record-dir",
        "--out-dir",
    )
    sub.add_argument("--epoch-dirs", nargs="+", required=True)
    sub.add_argument("--source", type=_json, required=True, help="what the selection came from (recorded in the ledger entry)")
    sub.add_argument("--launch-profile", help="name of the profile this launch recorded under runs/<run>/launch/")
    backbone_pass(sub)
    store_option(sub)
    text = "Train an end-to-end reference CNN from scratch; select its epoch on val into an immutable artifact."
    sub = verb(train_reference, text, "references", True, "--dataset-dir", "--out-dir")
    store_option(sub)
    text = "Evaluate an end-to-end reference's selected CNN once on the test split; write its manifest."
    sub = verb(qualify_reference, text, "references", True, "--selection-dir", "--dataset-dir", "--out-dir")
    sub.add_argument("--source", type=_json, required=True, help="what the selection came from (recorded in the ledger entry)")
    store_option(sub)
    text = "Plot the floor | frozen backbone | end-to-end comparison of the qualified runs."
    sub = verb(plot_comparison, text, "", False, "--results-dir", "--out-dir")
    sub.add_argument("--runs", nargs="+", required=True, help="the qualified runs and references to compare")
    text = "Plot training curves and selection evidence from sentinels."
    sub = verb(plot_training, text, "", False, "--run", "--selection-dir", "--out-dir")
    sub.add_argument("--epoch-dirs", nargs="+", required=True)
    verb(summarize_manifest, "Render a run manifest as an HTML table.", "", False, "--run", "--qualification-dir", "--out-dir")
    text = "Summarize a profiled run's cache lifecycle timings."
    sub = verb(summarize_profiling, text, "", False, "--run", "--cache-record-dir", "--profile-dir")
    sub.add_argument("--epoch-dirs", nargs="+", required=True)
    store_option(sub)
    verb(plot_cache_lifecycle, "Plot a profiled run's cache lifecycle summary.", "", False, "--run", "--summary", "--out-dir")
    text = "Export the qualified classifier (.pt2, ONNX, safetensors, model card), checked on the validation split."
    dirs = ("--qualification-dir", "--selection-dir", "--dataset-dir", "--backbone-dir", "--cache-record-dir", "--out-dir")
    sub = verb(export, text, "runs", True, *dirs)
    store_option(sub)

    text = "Floor (random backbone) | frozen backbone | end-to-end reference: test accuracy, high-SNR accuracy, macro-F1, wall time."
    sub = verb(compare, text)
    sub.add_argument("results_dir", nargs="?", default="results")
    config_option(sub)
    sub = verb(status, "Show every run's progress and results (reads sentinels only).")
    sub.add_argument("results_dir", nargs="?", default="results")
    config_option(sub)
    sub.add_argument("--full", action="store_true", help="re-hash every file as `rffm verify` does (default: fast check)")
    sub = verb(verify, "Re-check a results tree: sentinels, links, provenance, ledger, artifacts (stale folders listed, not failed).")
    sub.add_argument("results_dir", nargs="?", default="results")
    config_option(sub)
    sub.add_argument("--scratch", help="where this machine keeps the hidden-state caches (default: the config's `scratch`)")
    sub = verb(prune, "List (or with --delete remove) what the config no longer plans; never the ledger, artifacts or memo.")
    sub.add_argument("results_dir", nargs="?", default="results")
    config_option(sub)
    sub.add_argument("--delete", action="store_true", help="remove the stale folders (default: only list them)")
    sub.add_argument(
        "--delete-qualified", nargs="+", default=[], metavar="RUN", help="with --delete: also these stale qualified runs' folders"
    )
    text = "Remove the Snakemake lock of a run that was killed (never the lock of a live one); exit 0 removed, 1 not locked, 3 left alone."
    sub = verb(unlock, text)
    sub.add_argument("directory", nargs="?", default=".", help="the workflow's working directory (default: .)")
    sub = verb(predict, "Classify a SigMF recording, an HDF5 split or a RadioML file with an exported classifier (.pt2).")
    sub.add_argument("model", help="an export folder (results/runs/<run>/export) or its model.pt2")
    sub.add_argument("input", help="a .sigmf-meta/.sigmf-data recording, an HDF5 split (iq [N, 2, L]) or a RadioML file")
    sub.add_argument("--out", help="write the rows here (.csv or .json; default: CSV on stdout)")
    sub.add_argument("--format", choices=["csv", "json"], help="output format (default: by --out's suffix, else csv)")
    sub.add_argument("--top-k", type=int, default=3, help="classes (with probabilities) per window (default: 3)")
    sub.add_argument("--batch-size", type=int, default=256, help="windows per program call (default: 256)")
    sub.add_argument("--stride", type=int, help="SigMF: samples between window starts (default: the model's input length)")
    sub.add_argument("--i-know-this-is-test", action="store_true", help="read a staged test split anyway (it belongs to qualification)")
    text = "Write a Vertex AI CustomJob request (one g2-standard-8 + L4 worker running `rffm posttrain`), checked offline."
    sub = verbs.add_parser("vertex-job", help=text, description=text)
    sub.set_defaults(func=vertex_job)
    sub.add_argument("--image", required=True, help="the worker image, pinned by digest: <image>@sha256:<64 hex>")
    sub.add_argument("--config", required=True, help="the workflow config as the worker sees it (e.g. /gcs/<bucket>/rffm/config.yaml)")
    sub.add_argument("--output", required=True, help="base output directory gs://<bucket>/<prefix> (AIP_MODEL_DIR, AIP_CHECKPOINT_DIR)")
    sub.add_argument("--out", default="vertex-job.json", help="where to write the request (default: vertex-job.json)")
    sub.add_argument("--display-name", default="rffm-posttrain")
    sub.add_argument("--strategy", default="SPOT", choices=["SPOT", "FLEX_START", "STANDARD"], help="scheduling.strategy (default: SPOT)")
    sub.add_argument("--timeout-hours", type=float, default=24.0, help="scheduling.timeout (default: 24)")
    sub.add_argument("--max-wait-hours", type=float, help="FLEX_START: how long to wait for the GPU (default: 24)")
    sub.add_argument("--boot-disk-gb", type=int, default=500, help="pd-ssd boot disk holding the hidden-state cache (default: 500)")
    sub.add_argument("--procedure", choices=["validation_selection", "final_qualification"], default="final_qualification")
    sub.add_argument("--service-account", help="the service account the job runs as")
    text = "Log every qualified run (params, epoch metrics, test result, figures, exported model) to MLflow, once."
    sub = verb(mlflow, text)
    sub.add_argument("results_dir", nargs="?", default="results")
    sub.add_argument("--tracking-uri", help="MLflow tracking URI (default: the file store mlruns/ beside RESULTS_DIR)")
    sub.add_argument("--experiment", default="rffm", help="MLflow experiment name (default: rffm)")
    text = "Link Snakemake's user profile directory to this checkout's profiles, so `snakemake --profile gcp-batch|slurm` finds them."
    sub = verb(install_profiles, text)
    sub.add_argument("--checkout", help="the rffm checkout whose profiles/ to link (default: the one this rffm is installed from)")
    sub = verb(preflight, "Check what a Google Batch run needs before anything is submitted (bucket, image, variables, IAM, network).")
    sub.add_argument("--profile", default="gcp-batch", help="a profile name under the checkout's profiles/, or its directory")
    sub.add_argument("--checkout", help="the rffm checkout whose profiles/ to read (default: the one this rffm is installed from)")
    sub = verb(
        posttrain,
        "Run the whole workflow in this process (Snakemake API, local executor), for single-job launchers "
        "(a Cloud Batch job, a Vertex AI custom job); honours AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR.",
    )
    sub.add_argument("--config", action="append", required=True, help="config YAML (repeat to merge several); replaces config/config.yaml")
    sub.add_argument("--hidden-state-cache-directory", required=True, help="local scratch directory for the hidden-state cache")
    sub.add_argument("--procedure", choices=["validation_selection", "final_qualification"], default="final_qualification")
    sub.add_argument("--directory", default=".", help="working directory: results (relative paths), .snakemake state (default: .)")
    sub.add_argument("--cores", type=int, help="CPU cores for the local executor (default: all)")
    sub.add_argument("--snakefile", help="workflow Snakefile (default: RFFM_SNAKEFILE, else workflow/Snakefile of this checkout)")
    sub = verb(tensorboard, "Write TensorBoard event logs of every finished epoch's metrics.")
    sub.add_argument("results_dir", nargs="?", default="results")
    sub.add_argument("--log-dir", help="default: $AIP_TENSORBOARD_LOG_DIR, else $RFFM_TENSORBOARD_DIR, else RESULTS_DIR/tensorboard")
    sub = verb(config_reference, "Print the configuration reference (Markdown) from the schema.")
    sub.add_argument("--schema", help="config schema (default: workflow/schemas/config.schema.yaml of this checkout)")
    mode = sub.add_mutually_exclusive_group()
    mode.add_argument("--check", metavar="DOC", help="exit 1 unless DOC's generated section matches the schema")
    mode.add_argument("--write", metavar="DOC", help="rewrite DOC's generated section from the schema")

    bench = verbs.add_parser("bench", help="Benchmarks that print measured ratios (last line: JSON).")
    benches = bench.add_subparsers(dest="bench", required=True)
    sub = benches.add_parser("cache", help="Hidden-state cache: P1, P2, P3, P5 and peak RSS at 1x/4x data.")
    sub.set_defaults(func=bench_cache)
    sub.add_argument("--samples", type=int, default=22000, help="examples at 1x (the default dataset's size)")
    sub.add_argument("--work-dir", help="where to put the temporary data (default: system temp dir)")
    sub.add_argument("--threads", type=int, default=2)
    sub.add_argument("--repeats", type=int, default=5, help="interleaved repeats per timing (the fastest is reported)")
    sub.add_argument("--oom-limit", type=int, default=100, help="injected out-of-memory threshold (rows) for P5")
    sub.add_argument("--device", default="cpu", help="cpu or cuda (the GPU path: pinned memory, non-blocking copies, BF16 autocast)")
    sub.add_argument("--arch", type=_json, help='backbone arch overrides as JSON, e.g. \'{"dim": 192, "depth": 6}\'')
    sub.add_argument("--config", help="a config whose backbone is benched instead, e.g. config/examples/wavesfm_like.yaml")
    text = "An 8-member sweep against the same 8 heads as 8 separate runs: wall-time and cache-bytes ratios."
    sub = benches.add_parser("sweep", help=text, description=text)
    sub.set_defaults(func=bench_sweep)
    sub.add_argument("--samples", type=int, default=22000, help="examples (the default dataset's size)")
    sub.add_argument("--epochs", type=int, default=10, help="epochs of each arm (the default run's)")
    sub.add_argument("--work-dir", help="where to put the temporary data (default: system temp dir)")
    sub.add_argument("--threads", type=int, default=1, help="torch threads per epoch job (the rule's epoch_threads default)")
    sub.add_argument("--device", default="cpu", help="cpu or cuda")
    text = "Generate RML2018-layout files, stage them; print throughput / raw read bandwidth and peak RSS at two sizes 4x apart."
    sub = benches.add_parser("staging", help=text, description=text)
    sub.set_defaults(func=bench_staging)
    sub.add_argument("--size-gb", type=float, default=1.6, help="size of the large generated file (the small one is 4x smaller)")
    sub.add_argument("--work-dir", help="where to put the scratch directory (default: the current directory); removed afterwards")
    sub.add_argument("--keep", action="store_true", help="keep the generated files")
    sub.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every measurement; each figure is the fastest")
    return top


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rffm` console script."""
    args = parser().parse_args(argv)
    from rffm.records.step import THREADS

    THREADS.clear()  # a verb called in-process after a threaded one (tests) records no thread count of its own
    try:
        result = args.func(args)
    except RffmError as exc:
        print(f"rffm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `rffm status | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 0
    return int(result or 0)
