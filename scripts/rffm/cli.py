"""Command-line interface: a thin layer over the step functions (`rffm <command> --help`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rffm.errors import RffmError


def _spec(text: str) -> dict:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--spec is not valid JSON: {exc}") from None


def _torch_setup(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)


def _device(name: str) -> str:
    """'auto' -> cuda when available, else cpu."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def cmd_stage(args: argparse.Namespace) -> None:
    from rffm.staging import stage

    stage(args.spec, args.out_dir)


def cmd_pretrain(args: argparse.Namespace) -> None:
    _torch_setup(args.threads)
    from rffm.pretrain import create

    create(args.spec, args.dataset_dir, args.out_dir, device=_device(args.device))


def cmd_import_backbone(args: argparse.Namespace) -> None:
    from rffm.pretrain import import_checkpoint

    import_checkpoint(args.spec, args.out_dir)


def cmd_build_cache(args: argparse.Namespace) -> None:
    _torch_setup(args.threads)
    from rffm.cache import build

    build(
        args.dataset_dir,
        args.backbone_dir,
        args.out_dir,
        args.provenance,
        batch_size=args.batch_size,
        full_hash=args.full_hash,
        batch_profile=args.batch_profile,
        disk_headroom=args.disk_headroom,
        device=_device(args.device),
        profile_dirs=args.profile_dir,
        profile_batches=args.profile_batches,
    )


def cmd_train_epoch(args: argparse.Namespace) -> None:
    _torch_setup(args.threads)
    from rffm import checkpoints
    from rffm.train import run_epoch

    store = checkpoints.store_from_env()  # set by `rffm posttrain` from AIP_CHECKPOINT_DIR
    if store and checkpoints.restore(store, args.spec, args.cache_dir, args.epoch, args.previous_dir, args.out_dir):
        return
    run_epoch(
        args.spec,
        args.cache_dir,
        args.epoch,
        args.previous_dir,
        args.out_dir,
        device=_device(args.device),
        profile_dir=(args.profile_dir or [None])[0],
        profile_batches=args.profile_batches,
    )
    if store:
        checkpoints.mirror(args.out_dir, store, args.spec["run"], args.epoch)


def cmd_select(args: argparse.Namespace) -> None:
    from rffm.selection import select

    select(args.spec, args.epoch_dirs, args.out_dir)


def cmd_qualify(args: argparse.Namespace) -> None:
    _torch_setup(args.threads)
    from rffm.qualify import qualify

    qualify(
        args.spec,
        args.selection_dir,
        args.dataset_dir,
        args.backbone_dir,
        args.epoch_dirs,
        args.cache_provenance,
        args.out_dir,
        batch_size=args.batch_size,
        batch_profile=args.batch_profile,
        device=_device(args.device),
    )
    print(f"run manifest: {Path(args.out_dir) / 'run_manifest.json'}")


def cmd_plot_training(args: argparse.Namespace) -> None:
    from rffm.report import plot_training

    plot_training(args.run, args.epoch_dirs, args.selection_dir, args.out_dir)


def cmd_summarize_manifest(args: argparse.Namespace) -> None:
    from rffm.report import summarize_manifest

    summarize_manifest(args.run, args.qualification_dir, args.out_dir)


def cmd_plot_cache_lifecycle(args: argparse.Namespace) -> None:
    from rffm.report import plot_cache_lifecycle

    plot_cache_lifecycle(args.run, args.summary, args.out_dir)


def cmd_tensorboard(args: argparse.Namespace) -> int:
    from rffm.tensorboard import export, log_dir_from_env

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


def cmd_config_reference(args: argparse.Namespace) -> int:
    from rffm import configdoc

    schema = args.schema or configdoc.SCHEMA
    if args.check or args.write:
        document = args.check or args.write
        if configdoc.update(document, schema, write=bool(args.write)):
            print(f"{document}: configuration reference is up to date")
        elif args.write:
            print(f"{document}: configuration reference rewritten from {schema}")
        else:
            print(f"{document}: configuration reference is out of date with {schema}. Fix: rffm config-reference --write {document}")
            return 1
        return 0
    print(configdoc.render(schema), end="")
    return 0


def cmd_posttrain(args: argparse.Namespace) -> int:
    from rffm.posttrain import posttrain

    return posttrain(args.config, args.hidden_state_cache_directory, args.procedure, args.directory, args.cores, args.snakefile)


def cmd_verify(args: argparse.Namespace) -> int:
    from rffm.verify import verify_tree

    checked, problems = verify_tree(args.results_dir, args.scratch)
    for problem in problems:
        print(f"BROKEN {problem}")
    if not checked:
        print(f"no sentinels under {args.results_dir}")
        return 1
    print(f"{checked} sentinels checked, {len(problems)} problem(s)")
    return 1 if problems else 0


def cmd_status(args: argparse.Namespace) -> int:
    from rffm.status import collect, default_plan, load_plan, render

    config = load_plan(args.config) if args.config else default_plan(args.results_dir)
    rows = collect(args.results_dir, config, full=args.full)
    if not rows:
        print(f"no runs under {args.results_dir}/runs")
        return 1
    print(render(rows, full=args.full))
    return 0


def cmd_profile_summary(args: argparse.Namespace) -> None:
    from rffm.profiling import write

    write(args.run, args.cache_provenance, args.epoch_dirs, args.profile_dir)


def cmd_bench_cache(args: argparse.Namespace) -> int:
    from rffm.bench_cache import main as bench

    return bench(args.samples, args.work_dir, args.threads, args.repeats, args.oom_limit, args.arch, args.device)


def cmd_bench_staging(args: argparse.Namespace) -> int:
    from rffm.bench_staging import main as bench

    return bench(args)


def parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    top = argparse.ArgumentParser(prog="rffm", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)

    def command(name: str, func, help_text: str, spec: bool = True, threads: bool = False) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(func=func)
        if spec:
            sub.add_argument("--spec", type=_spec, required=True, help="JSON step spec (the rule passes its params)")
        if threads:
            sub.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
            sub.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (outputs are bit-identical only on CPU)")
        return sub

    def backbone_pass_options(sub: argparse.ArgumentParser, default_batch: int) -> None:
        sub.add_argument("--batch-size", type=int, default=default_batch, help="largest backbone batch (adapts down on OOM)")
        sub.add_argument("--batch-profile", help="batch-profile JSON shared by backbone passes on this node")

    def profiling_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--profile-dir", nargs="*", help="write Chrome traces and the lifecycle summary here")
        sub.add_argument("--profile-batches", type=int, default=0, help="batches to trace (0: no trace)")

    sub = command("stage", cmd_stage, "Stage a dataset into canonical HDF5 splits.")
    sub.add_argument("--out-dir", required=True)
    sub = command("pretrain", cmd_pretrain, "Build a backbone: masked-patch pretraining or random init.", threads=True)
    sub.add_argument("--dataset-dir", required=True)
    sub.add_argument("--out-dir", required=True)
    sub = command("import-backbone", cmd_import_backbone, "Import a user backbone checkpoint after checking its sha256.")
    sub.add_argument("--out-dir", required=True)
    sub = command(
        "build-cache", cmd_build_cache, "Run the frozen backbone over train and val into the BF16 cache.", spec=False, threads=True
    )
    backbone_pass_options(sub, 256)
    profiling_options(sub)
    sub.add_argument("--full-hash", action="store_true", help="also record each cache file's full sha256")
    sub.add_argument("--disk-headroom", type=float, default=1.1, help="required free scratch space / cache size (0: no check)")
    for flag in ("--dataset-dir", "--backbone-dir", "--out-dir", "--provenance"):
        sub.add_argument(flag, required=True)
    sub = command("train-epoch", cmd_train_epoch, "Train one epoch of the head from cached hidden states.", threads=True)
    sub.add_argument("--cache-dir", required=True)
    sub.add_argument("--epoch", type=int, required=True)
    sub.add_argument("--previous-dir")
    sub.add_argument("--out-dir", required=True)
    profiling_options(sub)
    sub = command("select", cmd_select, "Select the best epoch into an immutable artifact.")
    sub.add_argument("--epoch-dirs", nargs="+", required=True)
    sub.add_argument("--out-dir", required=True)
    sub = command("qualify", cmd_qualify, "Evaluate the selected artifact once on the test split.", threads=True)
    for flag in ("--selection-dir", "--dataset-dir", "--backbone-dir", "--cache-provenance", "--out-dir"):
        sub.add_argument(flag, required=True)
    sub.add_argument("--epoch-dirs", nargs="+", required=True)
    backbone_pass_options(sub, 512)
    sub = command("plot-training", cmd_plot_training, "Plot training curves and selection evidence from sentinels.", spec=False)
    sub.add_argument("--epoch-dirs", nargs="+", required=True)
    for flag in ("--run", "--selection-dir", "--out-dir"):
        sub.add_argument(flag, required=True)
    sub = command("summarize-manifest", cmd_summarize_manifest, "Render a run manifest as an HTML table.", spec=False)
    for flag in ("--run", "--qualification-dir", "--out-dir"):
        sub.add_argument(flag, required=True)
    sub = command("plot-cache-lifecycle", cmd_plot_cache_lifecycle, "Plot a profiled cache lifecycle summary.", spec=False)
    for flag in ("--run", "--summary", "--out-dir"):
        sub.add_argument(flag, required=True)
    sub = command("tensorboard", cmd_tensorboard, "Write TensorBoard event logs of every finished epoch's metrics.", spec=False)
    sub.add_argument("results_dir", nargs="?", default="results")
    sub.add_argument("--log-dir", help="default: $AIP_TENSORBOARD_LOG_DIR, else $RFFM_TENSORBOARD_DIR, else RESULTS_DIR/tensorboard")
    sub = command("config-reference", cmd_config_reference, "Print the configuration reference (Markdown) from the schema.", spec=False)
    sub.add_argument("--schema", help="config schema (default: workflow/schemas/config.schema.yaml of this checkout)")
    mode = sub.add_mutually_exclusive_group()
    mode.add_argument("--check", metavar="DOC", help="exit 1 unless DOC's generated section matches the schema")
    mode.add_argument("--write", metavar="DOC", help="rewrite DOC's generated section from the schema")
    sub = command("profile-summary", cmd_profile_summary, "Summarize a profiled run's cache lifecycle timings.", spec=False)
    for flag in ("--run", "--cache-provenance", "--profile-dir"):
        sub.add_argument(flag, required=True)
    sub.add_argument("--epoch-dirs", nargs="+", required=True)
    sub = command(
        "posttrain",
        cmd_posttrain,
        "Run the whole workflow in this process (Snakemake API, local executor), for single-job launchers "
        "(a Cloud Batch job, a Vertex AI custom job); honours AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR.",
        spec=False,
    )
    sub.add_argument("--config", action="append", required=True, help="config YAML (repeat to merge several); replaces config/config.yaml")
    sub.add_argument("--hidden-state-cache-directory", required=True, help="local scratch directory for the hidden-state cache")
    sub.add_argument("--procedure", choices=["validation_selection", "final_qualification"], default="final_qualification")
    sub.add_argument("--directory", default=".", help="working directory: results (relative paths), .snakemake state (default: .)")
    sub.add_argument("--cores", type=int, help="CPU cores for the local executor (default: all)")
    sub.add_argument("--snakefile", help="workflow Snakefile (default: RFFM_SNAKEFILE, else workflow/Snakefile of this checkout)")
    sub = command("verify", cmd_verify, "Re-check every sentinel and upstream link under a results tree.", spec=False)
    sub.add_argument("results_dir")
    sub.add_argument("--scratch", help="also check the hidden-state caches under this scratch directory")
    bench = commands.add_parser("bench", help="Benchmarks that print measured ratios (last line: JSON).")
    benches = bench.add_subparsers(dest="bench", required=True)
    sub = benches.add_parser("cache", help="Hidden-state cache: P1, P2, P3, P5 and peak RSS at 1x/4x data.")
    sub.set_defaults(func=cmd_bench_cache)
    sub.add_argument("--samples", type=int, default=22000, help="examples at 1x (the default dataset's size)")
    sub.add_argument("--work-dir", help="where to put the temporary data (default: system temp dir)")
    sub.add_argument("--threads", type=int, default=2)
    sub.add_argument("--repeats", type=int, default=5, help="interleaved repeats per timing (the fastest is reported)")
    sub.add_argument("--oom-limit", type=int, default=100, help="injected out-of-memory threshold (rows) for P5")
    sub.add_argument("--device", default="cpu", help="cpu or cuda (the GPU path: pinned memory, non-blocking copies, BF16 autocast)")
    sub.add_argument("--arch", type=_spec, help='backbone arch overrides as JSON, e.g. \'{"dim": 192, "depth": 6}\'')
    sub = command("status", cmd_status, "Show every run's progress and results (reads sentinels only).", spec=False)
    sub.add_argument("results_dir", nargs="?", default="results")
    sub.add_argument(
        "--config",
        nargs="+",
        metavar="FILE",
        help="workflow config file(s), merged in order, for planned epochs and the selection metric "
        "(default: config/config.yaml when its `results` is RESULTS_DIR)",
    )
    sub.add_argument("--full", action="store_true", help="re-hash every file as `rffm verify` does (default: fast check)")
    text = "Generate RML2018-layout files, stage them; print throughput / raw read bandwidth and peak RSS at two sizes 4x apart."
    sub = benches.add_parser("staging", help=text, description=text)
    sub.set_defaults(func=cmd_bench_staging)
    sub.add_argument("--size-gb", type=float, default=1.6, help="size of the large generated file (the small one is 4x smaller)")
    sub.add_argument("--work-dir", help="where to put the scratch directory (default: the current directory); removed afterwards")
    sub.add_argument("--keep", action="store_true", help="keep the generated files")
    sub.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every measurement; each figure is the fastest")
    return top


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rffm` console script."""
    args = parser().parse_args(argv)
    try:
        result = args.func(args)
    except RffmError as exc:
        print(f"rffm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return int(result or 0)
