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
    torch.use_deterministic_algorithms(True)


def cmd_stage(args: argparse.Namespace) -> None:
    from rffm.staging import stage

    stage(args.spec, args.out_dir)


def cmd_pretrain(args: argparse.Namespace) -> None:
    _torch_setup(args.threads)
    from rffm.pretrain import create

    create(args.spec, args.dataset_dir, args.out_dir)


def cmd_import_backbone(args: argparse.Namespace) -> None:
    from rffm.pretrain import import_checkpoint

    import_checkpoint(args.spec, args.out_dir)


def cmd_build_cache(args: argparse.Namespace) -> None:
    _torch_setup(args.threads)
    from rffm.cache import build

    build(args.dataset_dir, args.backbone_dir, args.out_dir, args.provenance, batch_size=args.batch_size, full_hash=args.full_hash)


def cmd_train_epoch(args: argparse.Namespace) -> None:
    _torch_setup(args.threads)
    from rffm import checkpoints
    from rffm.train import run_epoch

    store = checkpoints.store_from_env()  # set by `rffm posttrain` from AIP_CHECKPOINT_DIR
    if store and checkpoints.restore(store, args.spec, args.cache_dir, args.epoch, args.previous_dir, args.out_dir):
        return
    run_epoch(args.spec, args.cache_dir, args.epoch, args.previous_dir, args.out_dir)
    if store:
        checkpoints.mirror(args.out_dir, store, args.spec["run"], args.epoch)


def cmd_select(args: argparse.Namespace) -> None:
    from rffm.selection import select

    select(args.spec, args.epoch_dirs, args.out_dir)


def cmd_qualify(args: argparse.Namespace) -> None:
    _torch_setup(args.threads)
    from rffm.qualify import qualify

    qualify(args.spec, args.selection_dir, args.dataset_dir, args.backbone_dir, args.epoch_dirs, args.cache_provenance, args.out_dir)
    print(f"run manifest: {Path(args.out_dir) / 'run_manifest.json'}")


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
    from rffm.status import collect, render

    rows = collect(args.results_dir)
    if not rows:
        print(f"no runs under {args.results_dir}/runs")
        return 1
    print(render(rows))
    return 0


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
        return sub

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
    sub.add_argument("--batch-size", type=int, default=256, help="examples per backbone forward (does not change outputs)")
    sub.add_argument("--full-hash", action="store_true", help="also record each cache file's full sha256")
    for flag in ("--dataset-dir", "--backbone-dir", "--out-dir", "--provenance"):
        sub.add_argument(flag, required=True)
    sub = command("train-epoch", cmd_train_epoch, "Train one epoch of the head from cached hidden states.", threads=True)
    sub.add_argument("--cache-dir", required=True)
    sub.add_argument("--epoch", type=int, required=True)
    sub.add_argument("--previous-dir")
    sub.add_argument("--out-dir", required=True)
    sub = command("select", cmd_select, "Select the best epoch into an immutable artifact.")
    sub.add_argument("--epoch-dirs", nargs="+", required=True)
    sub.add_argument("--out-dir", required=True)
    sub = command("qualify", cmd_qualify, "Evaluate the selected artifact once on the test split.", threads=True)
    for flag in ("--selection-dir", "--dataset-dir", "--backbone-dir", "--cache-provenance", "--out-dir"):
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
    sub = command("status", cmd_status, "Show every run's progress and results (reads sentinels only).", spec=False)
    sub.add_argument("results_dir", nargs="?", default="results")
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
