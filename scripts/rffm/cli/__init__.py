"""Command-line interface: `rffm <rule>` runs one workflow step (the verb is the rule's name; rffm.cli.steps), plus
the everyday commands (status, verify, ...; rffm.cli.everyday). A thin layer over functions the tests call too."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable

from rffm import __version__
from rffm.cli import steps
from rffm.cli.everyday import (
    bench_cache,
    bench_grid,
    bench_plan,
    bench_scale,
    bench_staging,
    bench_sweep,
    compare,
    config_reference,
    figures,
    independent_data,
    install_profiles,
    mlflow,
    posttrain,
    predict,
    preflight,
    prune,
    record,
    release_immutable,
    status,
    tensorboard,
    throughput,
    unlock,
    verify,
    vertex_job,
)
from rffm.errors import RffmError

# ---- the parser ----


def parser() -> argparse.ArgumentParser:
    """The argument parser for every verb.

    Longer than 60 lines on purpose: the table of every everyday verb and its flags, one verb a paragraph (the steps'
    verbs are built from the step table, cli/steps.py)."""
    top = argparse.ArgumentParser(prog="rffm", description=__doc__)
    top.add_argument("--version", action="version", version=f"rffm {__version__}")
    verbs = top.add_subparsers(dest="command", required=True)

    def verb(func: Callable, help_text: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(func.__name__, help=help_text, description=help_text)
        sub.set_defaults(func=func)
        return sub

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

    steps.add_verbs(verbs)

    text = "Floor (random backbone) | frozen backbone | end-to-end reference: test accuracy, high-SNR accuracy, macro-F1, wall time."
    sub = verb(compare, text)
    sub.add_argument("results_dir", nargs="?", default="results")
    config_option(sub)
    help_records = "where the records the config's `design` names are (default: workflow/docs/records)"
    sub.add_argument("--records", default="workflow/docs/records", help=help_records)
    sub.add_argument(
        "--json", action="store_true", help="print the rows as one JSON object on stdout, nothing else (the table goes to stderr)"
    )
    sub = verb(status, "Show every run's progress and results (reads sentinels only).")
    sub.add_argument("results_dir", nargs="?", default="results")
    config_option(sub)
    sub.add_argument("--full", action="store_true", help="re-hash every file as `rffm verify` does (default: fast check)")
    sub.add_argument("--cost", action="store_true", help="per stage: jobs, predicted against measured seconds, peak RSS")
    sub.add_argument("--throughput", metavar="FILE", help="with --cost: the throughput record to predict from (default: the config's)")
    sub.add_argument(
        "--json", action="store_true", help="print the rows as one JSON object on stdout, nothing else (the table goes to stderr)"
    )
    text = "Write a RadioML 2018-layout file from the second, independent generator (scikit-commpy's modems, pulses and fading)."
    sub = verb(independent_data, text)
    sub.add_argument("--out", required=True, help="the HDF5 file to write")
    sub.add_argument("--per-class-snr", type=int, default=20, help="examples per (class, SNR): 11 classes x 26 SNRs each")
    sub.add_argument("--length", type=int, default=1024, help="IQ samples per example (default: 1024, as RadioML 2018)")
    sub.add_argument("--seed", type=int, default=0, help="the generator's seed (every example's draws follow from it)")
    text = "Add the finished jobs of a results tree (their work and seconds) to a throughput record: what the plan predicts cost from."
    sub = verb(throughput, text)
    sub.add_argument("results_dir", nargs="?", default="results")
    config_option(sub)
    sub.add_argument("--out", required=True, metavar="FILE", help="the throughput record (created, or added to)")
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
    text = "Clear the immutable flag (chattr +i: the ledger entries of a run as root) under FOLDERs, so `make clean` can remove them."
    sub = verb(release_immutable, text)
    sub.add_argument("folders", nargs="+", metavar="FOLDER")
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
    text = "Run a measuring command (after --) and write its printed JSON with commit, date, machine and command as a record."
    sub = verb(record, text)
    sub.add_argument("name", help="the record's name: RECORDS/NAME.json")
    sub.add_argument(
        "command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command and its arguments (after NAME --; options first)"
    )
    sub.add_argument("--out-dir", default="workflow/docs/records", help="the records folder (default: workflow/docs/records)")
    sub.add_argument("--cwd", help="run the command in this folder (its git HEAD is the record's commit; default: here)")
    sub.add_argument("--note", help="what the command alone does not say, e.g. 'from a clean clone, setup included'")
    help_reads = "a file or results tree the command reads or builds that its arguments do not name (e.g. results for make run)"
    sub.add_argument("--reads", action="append", metavar="PATH", help=help_reads + "; its digests go into the record (repeatable)")
    text = "Rewrite every figure the docs mark (<!-- rec NAME PATH FORMAT -->) from the records; --check: only list the differences."
    text += " Either way, a figure neither from a record nor declared <!-- const --> is an error."
    sub = verb(figures, text)
    help_docs = "the documents (default: every Markdown document of the checkout: README.md, config/, profiles/, workflow/docs/)"
    sub.add_argument("docs", nargs="*", help=help_docs)
    sub.add_argument("--records", default="workflow/docs/records", help="the records folder (default: workflow/docs/records)")
    help_check = "change nothing; exit 1 when a marked figure differs from its record or a figure is neither recorded nor a constant"
    sub.add_argument("--check", action="store_true", help=help_check)

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
    sub.add_argument("--arch", type=steps._json, help='backbone arch overrides as JSON, e.g. \'{"dim": 192, "depth": 6}\'')
    sub.add_argument("--config", help="a config whose backbone is benched instead, e.g. config/examples/wavesfm_like.yaml")
    text = (
        "An 8-member sweep against the same 8 heads as 8 separate runs, each arm run by Snakemake at the same --cores: "
        "wall-clock and measured cache-bytes ratios; exit 1 when a member's checkpoint differs from its separate run's."
    )
    sub = benches.add_parser("sweep", help=text, description=text)
    sub.set_defaults(func=bench_sweep)
    sub.add_argument("--samples", type=int, default=22000, help="examples (the default dataset's size)")
    sub.add_argument("--epochs", type=int, default=10, help="epochs of each arm (the default run's)")
    sub.add_argument("--work-dir", help="where to put the temporary data (default: system temp dir)")
    sub.add_argument("--threads", type=int, default=1, help="torch threads per epoch job (the config's epoch_threads default)")
    sub.add_argument("--device", default="cpu", help="cpu or cuda")
    sub.add_argument("--cores", type=int, default=2, help="snakemake --cores of both arms")
    sub.add_argument("--grid", type=steps._json, help="the sweep as JSON instead of the default 8 members: '{\"train.lr\": [0.003, 0.01]}'")
    sub.add_argument("--config", help="take dataset, backbone and train block from this config's first run, e.g. config/examples/tiny.yaml")
    sub.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    text = (
        "A grid of R runs on one hidden-state cache, co-located per cache against per run (cache.colocate), each arm executed as a "
        "cluster places its group jobs: backbone passes over the data (from the build records), CPU-seconds and wall time; exit 1 "
        "when the passes are not 1 and R + 1 or the arms' artifacts differ."
    )
    sub = benches.add_parser("grid", help=text, description=text)
    sub.set_defaults(func=bench_grid)
    sub.add_argument("--runs", type=int, default=4, help="runs in the grid (R), on one (dataset, backbone)")
    sub.add_argument("--epochs", type=int, default=2, help="epochs of each run")
    sub.add_argument("--cores", type=int, default=2, help="snakemake --cores of each arm (per-run: that many one-core runs at once)")
    sub.add_argument(
        "--config",
        default="config/examples/wavesfm_like.yaml",
        help="the grid's dataset, backbone and train block: this config's first run, looked up over config/config.yaml "
        "(default: config/examples/wavesfm_like.yaml; `make example-weights` first)",
    )
    sub.add_argument("--work-dir", help="where to put the temporary work folder (default: system temp dir)")
    sub.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    text = (
        "A study of R runs x E epochs on one cache: rffm's dry run beside a bare Snakefile of the same shape, on the local, "
        "SLURM and Google Batch profiles: CPU-seconds, jobs, group jobs, cache builds (last line: JSON)."
    )
    sub = benches.add_parser("plan", help=text, description=text)
    sub.set_defaults(func=bench_plan)
    sub.add_argument("--runs", type=int, nargs="+", default=[100, 1000], help="study sizes R (default: 100 1000)")
    sub.add_argument("--epochs", type=int, default=10, help="epochs of each run")
    sub.add_argument("--profiles", nargs="+", choices=["local", "slurm", "gcp-batch"], default=["local", "slurm", "gcp-batch"])
    sub.add_argument("--work-dir", help="where to put the temporary work folder (default: system temp dir)")
    sub.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    text = (
        "RadioML 2018 size end to end (2,555,904 x 1,024) at fractions of it, smallest first: staged, cached, a grid "
        "trained and qualified; per stage throughput, peak RSS, predicted against measured seconds, planned against used disk "
        "(last line: JSON)."
    )
    sub = benches.add_parser("scale", help=text, description=text)
    sub.set_defaults(func=bench_scale)
    help_fractions = "sizes as fractions of RadioML 2018's (default: 1/512 1/64 1/8 1)"
    sub.add_argument("--fractions", nargs="+", default=["1/512", "1/64", "1/8", "1"], help=help_fractions)
    sub.add_argument("--runs", type=int, default=3, help="runs in the grid on the one cache")
    sub.add_argument("--epochs", type=int, default=2, help="epochs of each run")
    sub.add_argument("--cores", type=int, default=2, help="snakemake --cores")
    sub.add_argument("--work-dir", help="where to put the work folder (default: the current directory; the full size needs 45 GB)")
    sub.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    help_shared = "run even while other snakemake or rffm processes share the cores (timings then not the machine's own)"
    sub.add_argument("--shared", action="store_true", help=help_shared)
    text = "Generate RML2018-layout files, stage them; print throughput / raw read bandwidth and peak RSS at two sizes 4x apart."
    sub = benches.add_parser("staging", help=text, description=text)
    sub.set_defaults(func=bench_staging)
    sub.add_argument("--size-gb", type=float, default=1.6, help="size of the large generated file (the small one is 4x smaller)")
    sub.add_argument("--work-dir", help="where to put the scratch directory (default: the current directory); removed afterwards")
    sub.add_argument("--keep", action="store_true", help="keep the generated files")
    sub.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every measurement; each figure is the fastest")
    return top


def chosen_parser(top: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub-)parser the parsed arguments went to (`rffm bench plan`: the `plan` parser)."""
    current = top
    while True:
        verbs = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)  # argparse keeps no public handle
        name = getattr(args, verbs.dest, None) if verbs else None
        if name not in (verbs.choices if verbs else {}):
            return current
        current = verbs.choices[name]


def console() -> None:
    """The `rffm` console script (and `python -m rffm`): main(), then a normal exit."""
    code = main()
    # Objects frozen out of the garbage collector: the collection at exit would otherwise walk every object that torch,
    # matplotlib and the rest created (more CPU than many a step's own work) to free memory the exit frees anyway.
    gc.freeze()
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    """The `rffm` command line: run one verb, return its exit code (tests call it in-process)."""
    top = parser()
    args, unknown = top.parse_known_args(argv)
    if unknown:  # a mistyped flag: the usage of the verb it was given to, not the top-level list of every verb
        chosen_parser(top, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        result = args.func(args)
    except RffmError as exc:
        print(f"rffm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `rffm status | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 0
    return int(result or 0)
