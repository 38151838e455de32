"""What the Snakemake invocation parsing the workflow says: the config files it read, where its jobs run (this
machine or cluster nodes, a dry run's too), whether files are local, its --config values as typed as a config
file's; and the Snakefile's own configfile checked before Snakemake reads it."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rffm.config.files import read
from rffm.config.schema import node_for
from rffm.errors import ConfigError

# Where the jobs a Snakemake plans run: on this machine, or on cluster nodes / VMs (their scratch and GPU, not ours).
HERE, NODES = "here", "nodes"


def snakemake_settings(workflow: Any) -> dict[str, Any]:
    """`check`'s keyword arguments for the workflow Snakemake is parsing (common.smk passes its `workflow`)."""
    settings = workflow.config_settings
    # Replacing the workflow config (rffm posttrain) discards the Snakefile's `configfile:`; only the given files count.
    replaced = settings.replace_workflow_config and settings.overwrite_config
    files = workflow.overwrite_configfiles if replaced else workflow.configfiles
    # With a default storage provider (profiles/gcp-batch) results and inputs are objects in a bucket, not local paths.
    local_files = workflow.storage_settings.default_storage_provider is None
    return {"files": [Path(f) for f in files], "runs_here": where_jobs_run(workflow) == HERE, "local_files": local_files}


def where_jobs_run(workflow: Any) -> str | None:
    """HERE when the jobs this Snakemake plans (or dry-runs) run on this machine, NODES when its executor runs them on
    cluster nodes or VMs, None when it plans none of its own or cannot tell (a job, --report, an API caller's dry run)."""
    if workflow.remote_exec or workflow.subprocess_exec:
        return None  # a job already on its node or VM, or in a subprocess of the local run: its Snakemake checked
    # The executor is chosen only after the Snakefile is parsed (workflow.local_exec is always True here), but the
    # command line has been read: a local run has cores and no node count, a cluster run (SLURM, Google Batch) has
    # --jobs as its node count; a dry run has neither (Snakemake swaps its executor for "dryrun"), so its command
    # line and profiles say which executor the real run would use.
    resources, dry = workflow.resource_settings, getattr(workflow.output_settings, "dryrun", False)
    if not dry and resources.nodes is None:
        return HERE if resources.cores is not None else None
    local = executor_runs_here(workflow)  # a dry run, or --jobs given (a local run may give it with --cores)
    if local is None:
        return None if dry else NODES
    return HERE if local else NODES


def executor_runs_here(workflow: Any) -> bool | None:
    """Whether the executor the `snakemake` command line names (its profiles applied) runs jobs on this machine;
    None for an API caller (rffm posttrain) or a line that cannot be read again."""
    args = command_line(str(getattr(workflow, "main_snakefile", "")), profiles=True)
    if args is None:
        return None
    if args.executor in (None, "local"):
        return True
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    try:
        return bool(ExecutorPluginRegistry().get_plugin(args.executor).common_settings.local_exec)
    except Exception:  # an executor Snakemake itself will refuse by name
        return None


def report_only(workflow: Any) -> bool:
    """Whether this `snakemake` only writes a report of local files (`--report FILE`, not `--report-after-run`):
    it runs nothing, and stops at the first file of its target's jobs marked for the report that does not exist."""
    args = command_line(str(getattr(workflow, "main_snakefile", "")))
    local_files = workflow.storage_settings.default_storage_provider is None
    return bool(args is not None and args.report and not args.report_after_run and local_files)


def command_line(main_snakefile: str, profiles: bool = False) -> Any | None:
    """Snakemake's arguments when a `snakemake` command is parsing the workflow (with `profiles`: as its --profile
    and workflow profile complete them); None for an API caller (rffm posttrain) or a line its parser refuses."""
    if "snakemake" not in os.path.basename(os.path.dirname(sys.argv[0]) + sys.argv[0]):
        return None
    return _parsed(tuple(sys.argv[1:]), main_snakefile, profiles)


@functools.cache  # one read of the line per plan, however many questions it answers
def _parsed(argv: tuple[str, ...], main_snakefile: str, profiles: bool) -> Any | None:
    from snakemake import cli

    try:
        plain = cli.get_argument_parser().parse_args(list(argv))
        if not profiles:
            return plain
        # Snakemake reads profiles from where it was started, then changes into --directory; its "Using profile"
        # line was printed then, so this second reading stays silent.
        with _inside(started_in(plain, main_snakefile)), contextlib.redirect_stderr(io.StringIO()):
            return cli.parse_args(list(argv))[1]
    except (SystemExit, Exception):  # whatever Snakemake's own parser makes of it, it reports itself
        return None


def started_in(args: Any, main_snakefile: str) -> Path | None:
    """The directory the `snakemake` command was started in (Snakemake has changed into --directory by now): the
    working directory less a relative --directory, else the Snakefile's path less the relative path it was given
    or found by (workflow/Snakefile before Snakefile: the checkout root is where runs start); None when unknown."""
    if not args.directory:
        return Path.cwd()
    directory = os.path.normpath(args.directory)
    if not os.path.isabs(directory) and str(Path.cwd()).endswith(os.sep + directory):
        return Path(str(Path.cwd()).removesuffix(os.sep + directory))
    from snakemake.common import SNAKEFILE_CHOICES

    given = [args.snakefile] if args.snakefile else sorted(map(str, SNAKEFILE_CHOICES), key=len, reverse=True)
    for relative in (os.path.normpath(g) for g in given if not os.path.isabs(g)):
        if main_snakefile.endswith(os.sep + relative):
            return Path(main_snakefile.removesuffix(os.sep + relative))
    return None


@contextlib.contextmanager
def _inside(directory: Path | None) -> Iterator[None]:
    """The working directory changed to `directory` (if known and there) for the block, then back."""
    back = os.getcwd()
    if directory is not None and directory.is_dir():
        os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(back)


def typed_overrides(config: dict[str, Any], given: dict[str, Any], schema: dict[str, Any]) -> None:
    """--config values read as the YAML scalars they spell where the schema wants a number, integer or boolean, in
    place: Snakemake reads a nested value (`cache={batch_size: 8}`) with YAML's base loader, every scalar a string."""

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*path, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, (*path, index))
        elif isinstance(value, str) and (typed := _scalar(value, _types(node_for(schema, path)))) is not None:
            _set(config, path, value, typed)

    walk(given or {}, ())


def _types(node: dict[str, Any]) -> set[str]:
    """The JSON types a schema node allows (its `type`, and its anyOf/oneOf branches' types)."""
    named = node.get("type", [])
    types = {named} if isinstance(named, str) else set(named)
    for branch in node.get("anyOf", []) + node.get("oneOf", []):
        types |= _types(branch)
    return types


def _scalar(text: str, types: set[str]) -> Any:
    """The number or boolean `text` spells in YAML (as a config file would read it) when the schema wants one and
    not a string; None otherwise (the schema then names the value)."""
    if "string" in types or not types & {"integer", "number", "boolean"}:
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if isinstance(value, bool):
        return value if "boolean" in types else None
    if isinstance(value, int) and types & {"integer", "number"}:
        return value
    return value if isinstance(value, float) and "number" in types else None


def _set(config: dict[str, Any], path: tuple[Any, ...], given: str, value: Any) -> None:
    """config at path set to value where it holds the string --config gave (--config is merged last: it always does)."""
    node: Any = config
    try:
        for part in path[:-1]:
            node = node[part]
        if node[path[-1]] == given:
            node[path[-1]] = value
    except (KeyError, IndexError, TypeError):
        return


def check_default_file(path: str | Path, workflow: Any) -> None:
    """The Snakefile's own configfile, before Snakemake loads it: an empty or non-mapping file stops with the
    workflow's one line (PlanRefused) instead of Snakemake's generic message. Files given with --configfile are
    read by Snakemake's command line before any workflow code runs, so their message stays Snakemake's."""
    from rffm.errors import PlanRefused

    settings = workflow.config_settings
    if (settings.replace_workflow_config and settings.overwrite_config) or not Path(path).is_file():
        return
    try:
        read(path)
    except ConfigError as error:
        raise PlanRefused(f"rffm: {error}") from None
