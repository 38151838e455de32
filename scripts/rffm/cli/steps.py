"""`rffm <rule>`: one verb per row of the pipeline table (rffm.records.pipeline), each option defined once here.
A verb calls rffm.steps.<rule>.run with its options by name: an option's dest is run()'s parameter."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rffm.records.pipeline import STEPS, Rule


def _json(text: str) -> dict:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def _spec(text: str) -> dict:
    """Parse a step's --spec: one entry of the config as the rule passes it, already validated and completed with the
    schema's defaults while planning (one defaults pass: the job fills nothing)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--spec is not valid JSON: {exc}") from None


def _folder(what: str) -> dict[str, Any]:
    return {"required": True, "help": what}


SOURCE_ROOT = "folder the spec's relative source paths are relative to (default: .)"
TRACE = "batches to trace (0: no trace)"

# Every option a rule's shell string passes (besides --spec, --threads, --device), by name.
FLAGS: dict[str, dict[str, Any]] = {
    "--out-dir": _folder("the step's folder: its outputs and sentinel (results/<step folder>)"),
    "--dataset-dir": _folder("the staged dataset's folder"),
    "--backbone-dir": _folder("the backbone's folder"),
    "--cache-record-dir": _folder("the cache record's folder (results/caches/<dataset>__<backbone>)"),
    "--selection-dir": _folder("the run's selection folder"),
    "--qualification-dir": _folder("the run's qualification folder"),
    "--profile-dir": _folder("the run's profiling folder"),
    "--results-dir": _folder("the results tree as the job sees it"),
    "--epoch-dirs": {"nargs": "+", "required": True, "help": "the run's epoch folders"},
    "--run": {"required": True, "dest": "run_name", "help": "the run's id"},
    "--runs": {"nargs": "+", "required": True, "help": "the qualified runs and references to compare"},
    "--summary": {"required": True, "dest": "summary_path", "help": "the profiled run's cache lifecycle summary"},
    "--source-root": {"default": ".", "help": SOURCE_ROOT},
    "--epoch": {"type": int, "required": True},
    "--previous-dir": {"help": "the previous epoch's folder (none for epoch 1)"},
    "--members": {"default": "", "help": "the sweep's members as the plan names them (checked against the spec)"},
    "--source": {"type": _json, "required": True, "help": "what the selection came from (recorded in the ledger entry)"},
    "--launch-profile": {"default": "", "help": "name of the profile this launch recorded under runs/<run>/launch/"},
    "--batch-size": {"type": int, "required": True, "help": "largest backbone batch (adapts down on OOM)"},
    "--batch-profile": {"help": "batch-profile JSON shared by backbone passes on this node"},
    "--disk-headroom": {"type": float, "required": True, "help": "required free scratch space / cache size (0: no check)"},
    "--scratch": {"required": True, "help": "this node's directory for the hidden-state caches"},
    "--store": {"help": "the results store: a directory or gs://bucket/prefix (every rule passes it)"},
    "--memo-store": {"default": "", "help": "the memo store of completed epochs (config checkpoint_store; default: the results store)"},
    "--profile-runs": {"nargs": "*", "default": [], "help": "runs whose profiling folders get the build's trace"},
    "--profile-batches": {"type": int, "default": 0, "help": TRACE},
    "--encoder": {
        "type": _json,
        "metavar": "JSON",
        "help": "JSON: the backbone's input adapter, taps and keep (rffm.model.encoder.spec_for)",
    },
}


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """One verb per pipeline step, named after its rule."""
    for step in STEPS:
        sub = verbs.add_parser(step.rule, help=step.help, description=step.help)
        sub.set_defaults(func=run_step, step=step)
        if step.spec:
            sub.add_argument(
                "--spec", type=_spec, required=True, help=f"JSON: one entry of `{step.spec}`, completed while planning (the rule's params)"
            )
        if step.torch:
            sub.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
            sub.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (outputs are bit-identical only on CPU)")
        for flag in step.flags:
            sub.add_argument(flag, **FLAGS[flag])


def _dest(flag: str) -> str:
    return FLAGS[flag].get("dest", flag.removeprefix("--").replace("-", "_"))


def run_step(args: argparse.Namespace) -> None:
    """Run rffm.steps.<rule>.run with the verb's options; print the file the step names when done."""
    step: Rule = args.step
    options = {_dest(flag): getattr(args, _dest(flag)) for flag in step.flags}
    if step.spec:
        options["spec"] = args.spec
    if step.torch:  # threads and determinism before the step's module imports torch's users
        from rffm.runtime.device import resolve, setup

        setup(args.threads)
        options["device"], options["threads"] = resolve(args.device), args.threads
    if "source_root" in options:  # the configured source files lie there (a storage provider's download folder)
        options["out_dir"] = os.path.abspath(options["out_dir"])
        root = options.pop("source_root")
        if root and root != ".":
            os.chdir(root)
    module = importlib.import_module(f"rffm.{step.module}")
    call = ADAPTERS.get(step.rule, module.run)
    parameters = inspect.signature(module.run).parameters
    if "device" not in parameters:  # a torch step that always runs on the CPU
        options.pop("device", None)
    with contextlib.ExitStack() as held:
        if "out_dir" in options:  # the step's progress keeps a heartbeat for `rffm status` (results/running/)
            from rffm.runtime.progress import running_step

            held.enter_context(running_step(options["out_dir"]))
        if "device" in options and "scratch" in options:  # a member of a group job (build_cache, train_epoch)
            options.update(held.enter_context(node_devices(options["device"], options["scratch"], "devices" in parameters)))
        sentinel = call(**options)
    if step.prints:
        what, name = step.prints
        print(f"{what}: {Path(sentinel).parent / name}")


@contextlib.contextmanager
def node_devices(device: str, scratch: str, every: bool) -> Iterator[dict[str, Any]]:
    """The device options of a group job's member, its GPUs held while it runs (rffm.runtime.device.pinned): an epoch
    its own GPU; a cache build (a run() taking `devices`) every free one, one worker each."""
    from rffm.runtime.device import pinned

    with pinned(device, scratch, every=every) as devices:
        yield {"device": devices[0], **({"devices": devices} if every else {})}


def _train_epoch(**options: Any) -> Path:
    """train_epoch takes its cache options as one dict (a fresh node builds the cache with them)."""
    from rffm.steps import train_epoch

    train_epoch.check_planned_members(options["spec"], options.pop("members"))
    cache_options = {key: options.pop(key) for key in ("batch_size", "disk_headroom", "batch_profile")}
    options["memo_store"] = options["memo_store"] or None
    return train_epoch.run(**options, cache_options=cache_options)


def _train_reference(**options: Any) -> Path:
    """train_reference is handed its sweep's members as the plan names them, checked like an epoch's."""
    from rffm.steps import train_reference
    from rffm.training import sweep

    sweep.check_planned(options["spec"], options.pop("members"), "references")
    return train_reference.run(**options)


ADAPTERS: dict[str, Callable[..., Any]] = {"train_epoch": _train_epoch, "train_reference": _train_reference}
