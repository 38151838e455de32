"""What the workflow checks while Snakemake builds its plan (before any job runs or any file is deleted), and
what it records when it starts: each a function rules/common.smk calls in one line with Snakemake's `workflow`.

A refusal is a PlanRefused (Snakemake prints its lines as they are); nothing here writes, but on_start."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from rffm import config as rffm_config
from rffm.backbone_kinds import PYTHON
from rffm.cloud.preflight import pinned_image_problem
from rffm.config.invocation import HERE, NODES, command_line
from rffm.data import cache_plan
from rffm.errors import PlanRefused, RffmError
from rffm.model.usercode import user_source
from rffm.ops.unlock import lock_line, record_owner
from rffm.records import launch, ledger, plans
from rffm.records.layout import RUNS, epochs_folder, qualification_folder
from rffm.records.store import open_store


def planning(workflow: Any) -> bool:
    """Whether this Snakemake is the one planning (not a job, nor a remote executor's worker)."""
    return workflow.is_main_process and not workflow.remote_exec


def refused(error: RffmError) -> PlanRefused:
    return PlanRefused(f"rffm: {error}")


def check_config(config: dict[str, Any], workflow: Any) -> None:
    """The one validator: readable problems, then the schema's defaults; the config files and, where jobs
    and files are on this machine, the machine."""
    if given := dict(workflow.config_settings.config or {}):  # --config: its nested values came as strings
        rffm_config.typed_overrides(config, given, rffm_config.load_schema())
    try:
        rffm_config.check(config, **rffm_config.snakemake_settings(workflow))
    except RffmError as error:
        raise refused(error) from None


def note_node_checks(workflow: Any, config: dict[str, Any]) -> None:
    """One line on stderr when the jobs run on cluster nodes or VMs: their scratch and GPU cannot be checked here."""
    if planning(workflow) and rffm_config.where_jobs_run(workflow) == NODES:
        print(
            f"rffm: scratch ({config['scratch']}) and device ({config['device']}) are checked on each compute node "
            "when its job starts, not while planning: the executor runs the jobs there",
            file=sys.stderr,
        )


# The Google Batch executors' names (rffm's and upstream's): one VM per job, its accelerators from nvidia_gpu.
GOOGLE_BATCH = ("rffm-googlebatch", "googlebatch")


@dataclasses.dataclass(frozen=True)
class GpuBooking:
    """What a cluster books for the GPU jobs of a group, as the command line and the profile say while planning."""

    build: int | None  # GPUs one build_cache job books (None: booked in a way the plan cannot count, e.g. gres)
    epoch: int | None  # GPUs one train_epoch job books
    at_once: int | None = None  # the most epochs a group job runs at once (--cores, --resources); None: no limit
    per_vm: str = ""  # on Google Batch, why `epoch` is the VM's count, never summed over the group (e.g. its machine type)


def group_gpus(booking: GpuBooking | None, runs: int) -> str:
    """The GPUs one group job holds, as Snakemake books them for a group (profiles/README.md: its widest layer: the
    members that can run at once) with `runs` runs' epochs in it; "" when the plan cannot know (then nothing is said)."""
    if booking is None or booking.build is None or booking.epoch is None:
        return ""
    at_once = min(runs, booking.at_once or runs)
    if booking.per_vm:  # the VM's GPUs, however many epochs run at once (they take the GPUs in turn)
        return f"{booking.epoch} GPU{'s' if booking.epoch != 1 else ''} ({booking.per_vm})"
    gpus = max(booking.build, at_once * booking.epoch)
    limit = f", {at_once} epoch{'s' if at_once > 1 else ''} at once" if at_once < runs else ""
    return f"{gpus} GPU{'s' if gpus != 1 else ''}{limit}" if gpus else "no GPU"


def cache_readers(config: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    """The runs that read each (dataset, backbone) cache, in config order (one pass: the plan's groups look them up)."""
    readers: dict[tuple[str, str], list[str]] = {}
    for name, run in config["runs"].items():
        readers.setdefault((run["dataset"], run["backbone"]), []).append(name)
    return readers


@dataclasses.dataclass(frozen=True)
class Colocation:
    """The group of every cache build and of every run's epochs on a cluster (workflow/rules/common.smk: groups)."""

    builds: dict[tuple[str, str], str]  # (dataset, backbone) -> the group of its build_cache job
    epochs: dict[str, str]  # run -> the group of its train_epoch jobs
    parts: dict[tuple[str, str], list[list[str]]]  # (dataset, backbone) -> its readers, one list per group job


def colocation(config: dict[str, Any]) -> Colocation:
    """Each cache's readers split into group jobs: per-cache, at most cache.runs_per_group runs each (the first with
    the cache's build; each other builds its own copy on its node), so no group grows with the study; per-run, one
    group job per run and one for the build. A cache one run reads is grouped with that run either way."""
    mode, size = config["cache"]["colocate"], config["cache"]["runs_per_group"]
    builds: dict[tuple[str, str], str] = {}
    epochs: dict[str, str] = {}
    parts: dict[tuple[str, str], list[list[str]]] = {}
    for key, runs in cache_readers(config).items():
        name = f"cache_{key[0]}__{key[1]}"
        if len(runs) == 1:
            builds[key] = epochs[runs[0]] = f"train_{runs[0]}"
            parts[key] = [runs]
            continue
        builds[key] = name
        if mode == "per-run":
            parts[key] = [[run] for run in runs]
            epochs.update({run: f"train_{run}" for run in runs})
            continue
        parts[key] = [runs[i : i + size] for i in range(0, len(runs), size)]
        for index, part in enumerate(parts[key]):
            epochs.update({run: part_group(*key, index) for run in part})
    return Colocation(builds, epochs, parts)


def part_groups(placed: Colocation) -> dict[str, int]:
    """The group jobs of a cache part without its build: {group: its runs}. Their runs' chains of epochs share no job,
    so each part is as many unconnected components as it has runs."""
    return {
        group: len(part)
        for (dataset, backbone), parts in placed.parts.items()
        for index, part in enumerate(parts)
        if index > 0 and len(part) > 1 and placed.epochs[part[0]] == (group := part_group(dataset, backbone, index))
    }


def part_group(dataset: str, backbone: str, index: int) -> str:
    """The name of a cache's part `index` (0: the one with the build)."""
    name = f"cache_{dataset}__{backbone}"
    return name if index == 0 else f"{name}__part{index + 1}"


_KEPT_WHOLE: set[int] = set()  # the group settings keep_parts_whole has completed (Snakemake's, by id)


def keep_parts_whole(workflow: Any, parts: dict[str, int]) -> None:
    """Make each part one group job (one node or VM, one copy of the cache), as the plan says: Snakemake submits each
    connected component of a group as a job of its own unless --group-components allows more, so each part's run count
    (`parts`: part_groups) is set as its group's components, what the user passed with --group-components kept.

    Called from the group callable: Snakemake replaces its group settings with the command line's after reading the
    Snakefile and reads them once the DAG's groups are known, so this is the moment they are the ones it will use."""
    settings = workflow.group_settings
    if id(settings) in _KEPT_WHOLE or not parts:
        return
    settings.group_components = type(settings.group_components)({**parts, **dict(settings.group_components)})
    _KEPT_WHOLE.add(id(settings))


def groups_apply(workflow: Any) -> bool:
    """Whether the plan carries groups: not where every job runs on this machine (Snakemake's local executor ignores
    them, and checking a grouped job's readiness walks its whole group: a cost that buys nothing here)."""
    return rffm_config.where_jobs_run(workflow) != HERE


def colocation_lines(config: dict[str, Any], booking: GpuBooking | None = None) -> list[str]:
    """One line per cache several runs read (where cache.colocate decides): how its build and its readers' epochs are
    grouped on a cluster (workflow/rules/common.smk: groups), how many cache builds that implies and the GPUs each
    group job holds (`booking`: gpu_booking)."""
    mode = config["cache"]["colocate"]
    placed = colocation(config)
    lines = []
    for (dataset, backbone), runs in cache_readers(config).items():
        epochs = [config["runs"][run]["train"]["epochs"] for run in runs]
        plural = "s" if len(runs) > 1 else ""
        work = f"{len(runs)} run{plural} x {epochs[0]} epochs" if len(set(epochs)) == 1 else f"{len(runs)} runs, {sum(epochs)} epochs"
        head = f"note: plan: cache {dataset}__{backbone}: "
        if len(runs) == 1:  # grouped with its one run either way: nothing to choose, nothing to say
            continue
        parts = placed.parts[(dataset, backbone)]
        if mode == "per-run":
            gpus = group_gpus(booking, 1)
            lines.append(
                f"{head}{len(runs) + 1} cache builds (its own job and one on each run's node), {work} in {len(runs)} group jobs"
                f"{f', each holding {gpus}' if gpus else ''} (cache.colocate: per-run)"
            )
        elif len(parts) == 1:
            gpus = group_gpus(booking, len(runs))
            lines.append(
                f"{head}1 cache build, {work} in one group job{f' holding {gpus}' if gpus else ''} "
                f"(cache_{dataset}__{backbone}: one VM or node; cache.colocate: per-cache)"
            )
        else:
            size = config["cache"]["runs_per_group"]
            gpus = group_gpus(booking, size)
            lines.append(
                f"{head}{len(parts)} cache builds, {work} in {len(parts)} group jobs of at most {size} runs"
                f"{f', each holding at most {gpus}' if gpus else ''} (cache.runs_per_group: {size}; cache_{dataset}__{backbone}"
                " builds the cache, each other group job builds its own copy on its VM or node once that one ends; "
                "cache.colocate: per-cache)"
            )
    return lines


def note_cost(workflow: Any, config: dict[str, Any]) -> None:
    """The plan's predicted hours per stage (and per group job on cluster nodes or VMs), one line each on stderr, from
    the config's throughput record (rffm.plan.cost); on a dry run without one, how to measure it."""
    if not planning(workflow) or not (config.get("throughput") or getattr(workflow.output_settings, "dryrun", False)):
        return
    from rffm.plan import cost

    groups: dict[str, str] = {}
    if rffm_config.where_jobs_run(workflow) == NODES:
        placed = colocation(config)
        groups = {**{f"{d}__{b}": group for (d, b), group in placed.builds.items()}, **placed.epochs}
    try:
        lines = cost.plan_lines(config, config["results"], groups)
    except RffmError as error:
        raise refused(error) from None
    for line in lines:
        print(line, file=sys.stderr)


# Google Cloud's accelerator-optimized machine types and the GPUs each comes with (a2/a3: the count ends the name).
G2_GPUS = {"g2-standard-24": 2, "g2-standard-48": 4, "g2-standard-96": 8}  # every other g2-standard: one L4
COUNTED_MACHINE = re.compile(r"^a\d-\w+-(\d+)g$")


def machine_gpus(machine_type: str) -> int | None:
    """The GPUs a Google Cloud machine type comes with (g2-standard-48: 4 L4), None when its name does not say."""
    if machine_type.startswith("g2-standard-"):
        return G2_GPUS.get(machine_type, 1)
    return int(found[1]) if (found := COUNTED_MACHINE.match(machine_type)) else None


def booked_count(resources: dict[str, Any], executor: str | None) -> tuple[int | None, str]:
    """The GPUs one job's resources book on `executor` (0: none; None: not countable here, e.g. SLURM's gres) and, on
    Google Batch where the VM's count is not summed over a group, why (nvidia_gpu naming a type, the machine type)."""
    given = {name: _raw(value) for name, value in resources.items()}
    if executor == "slurm":
        if given.get("gpu", "0") not in ("", "0"):
            return (int(given["gpu"]) if given["gpu"].isdigit() else None), ""
        return (None if books_gpu(resources) else 0), ""
    if executor not in GOOGLE_BATCH:
        return None, ""
    if gpu := given.get("nvidia_gpu", ""):  # a count is summed over a group's layer; a type is one accelerator
        return (int(gpu), "") if gpu.isdigit() else (1, f"nvidia_gpu: one {gpu} per VM")
    machine = given.get("googlebatch_machine_type", "")
    return ((count, f"{machine}: {count} per VM") if (count := machine_gpus(machine)) else (None, "")) if machine else (0, "")


def epochs_at_once(limits: dict[str, int | None], needs: dict[str, Any]) -> int | None:
    """How many epoch jobs fit the global limits (--cores as _cores, --resources) side by side; None: no limit."""
    fits = []
    for name, limit in limits.items():
        need = _raw(needs.get(name))
        if limit and need.isdigit() and int(need):
            fits.append(max(1, int(limit) // int(need)))
    return min(fits, default=None)


def gpu_booking(workflow: Any, config: dict[str, Any]) -> GpuBooking | None:
    """What the cluster run this command line plans books for build_cache and train_epoch (the profile's
    set-resources; --cores and --resources bound the epochs a group job runs at once); None when it cannot tell."""
    args = command_line(str(workflow.main_snakefile), profiles=True)
    if args is None:
        return None
    build, build_type = booked_count(overwritten_resources(workflow, "build_cache"), args.executor)
    epoch_resources = overwritten_resources(workflow, "train_epoch")
    epoch, epoch_type = booked_count(epoch_resources, args.executor)
    threads = int(_raw((args.set_threads or {}).get("train_epoch")) or config["epoch_threads"])
    limits = {"_cores": args.cores, **{name: resource.value for name, resource in (args.resources or {}).items()}}
    needs = {**epoch_resources, "_cores": min(threads, args.cores or threads)}  # --cores caps every job's threads
    return GpuBooking(build, epoch, epochs_at_once(limits, needs), per_vm=epoch_type or build_type)


def note_colocation(workflow: Any, config: dict[str, Any]) -> None:
    """On cluster nodes or VMs, how each cache's jobs are grouped, one line each on stderr (colocation_lines)."""
    if planning(workflow) and rffm_config.where_jobs_run(workflow) == NODES:
        for line in colocation_lines(config, gpu_booking(workflow, config)):
            print(line, file=sys.stderr)


def worker_container(environ: dict[str, str] = os.environ) -> str | None:
    """The worker image (envs/Dockerfile) every job runs in, pinned by digest (RFFM_WORKER_IMAGE), or None."""
    from snakemake.exceptions import WorkflowError

    image = environ.get("RFFM_WORKER_IMAGE") or None
    if image and (problem := pinned_image_problem(image)):
        raise WorkflowError(problem)
    return f"docker://{image}" if image else None


def results_store(workflow: Any, results: str) -> str:
    """Where the steps keep the results store: the results tree, under the default storage prefix when one is set."""
    from snakemake.exceptions import WorkflowError

    prefix = workflow.storage_settings.default_storage_prefix
    if "$" in (prefix or ""):  # profiles/gcp-batch reads the bucket from the environment: name a missing variable first
        raise WorkflowError(
            f"default-storage-prefix {prefix!r} names an environment variable that is not set. "
            "Fix: export it (profiles/README.md, Google Cloud)."
        )
    return f"{prefix.rstrip('/')}/{results}" if prefix else results


def overwritten_resources(workflow: Any, rule: str) -> dict[str, Any]:
    """What the profile asks for a rule (set-resources), e.g. build_cache's disk on clusters."""
    settings = workflow.resource_settings.overwrite_resources.get(rule, {})
    return {key: getattr(value, "raw", value) for key, value in settings.items()}


def refuse_unfit_caches(workflow: Any, config: dict[str, Any], results: str, scratch: str, disk: dict[str, Any]) -> None:
    """Caches that cannot fit the scratch disk (or a dataset length the backbone does not take) stop the plan, -n included."""
    if planning(workflow) and (problems := cache_plan.refusals(config, results, scratch, disk)):
        raise PlanRefused("rffm: " + "\n  ".join(problems))


# How a SLURM job books a GPU (snakemake-executor-plugin-slurm): the gpu, gpu_model or gres resource, or sbatch's own
# options in slurm_extra.
SLURM_GPU_OPTION = re.compile(r"--gpus|--gres[= ]\S*gpu|(^|\s)-G\s*[1-9]")


def _raw(resource: Any) -> str:
    """A resource's value as given (profile or command line), without the quotes a command line expression keeps."""
    return str(getattr(resource, "raw", resource) or "").strip().strip("'\"")


def books_gpu(resources: Any) -> bool:
    """Whether a rule's SLURM resources ask for a GPU."""
    given = {name: _raw(resource) for name, resource in resources.items()}
    return (
        given.get("gpu", "0") not in ("", "0")
        or bool(given.get("gpu_model"))
        or "gpu" in given.get("gres", "")
        or bool(SLURM_GPU_OPTION.search(given.get("slurm_extra", "")))
    )


def refuse_unbooked_gpus(workflow: Any) -> None:
    """On SLURM, a rule that computes on CUDA (its `device` resource: the config's `device`) and books no GPU stops
    the plan, -n included: its job would wait in the queue only to find no GPU on its node. Whether the node's GPU
    is visible to torch is checked there, when the job starts (rffm.runtime.device)."""
    if not planning(workflow) or rffm_config.where_jobs_run(workflow) != NODES:
        return
    args = command_line(str(workflow.main_snakefile), profiles=True)  # read once already: where_jobs_run
    if args is None or args.executor != "slurm":
        return
    unbooked = {
        rule.name: device
        for rule in workflow.rules
        if (device := _raw(rule.resources.get("device"))).startswith("cuda") and not books_gpu(rule.resources)
    }
    if unbooked:
        raise PlanRefused(
            f"rffm: {', '.join(f'{name} (device {device})' for name, device in unbooked.items())}: their SLURM jobs book no "
            "GPU (no gpu, gpu_model or gres resource), so they would run on nodes without one. Fix: book one GPU each in the "
            f"profile's set-resources ({'; '.join(f'{name}: {{gpu: 1}}' for name in unbooked)}), as profiles/slurm/config.yaml "
            "does, or compute on the CPU: `device: cpu` under the profile's config:"
        )


def print_lock(workflow: Any) -> None:
    """A lock a killed run left, on stderr (read only; Snakemake's own paragraph follows)."""
    if planning(workflow) and not workflow.subprocess_exec and (line := lock_line(os.getcwd())):
        print(line, file=sys.stderr)


def user_code(backbone: dict[str, Any], name: str) -> str:
    """import_backbone's param for `source: python`: the digest of the user's package source ("" otherwise)."""
    if backbone["source"] != PYTHON:
        return ""
    python = backbone["python"]
    try:
        return user_source_digest(python["entry_point"], python.get("import_path"), f"backbones.{name}")
    except RffmError as error:
        raise refused(error) from None


@functools.cache  # one read of the user's files per plan (every epoch and selection job of its runs asks)
def user_source_digest(entry_point: str, import_path: str | None, where: str) -> str:
    """The sha256 of the user's package source."""
    return user_source(entry_point, import_path, where)["sha256"]


class FrozenRuns:
    """Refuses, while the plan is built, to train or select again a run that spent its test exposure."""

    def __init__(self, workflow: Any, store: str, selection_source: Callable[[str], dict[str, Any]]) -> None:
        self.workflow, self.store, self.selection_source = workflow, store, selection_source
        self.qualified: dict[str, list] | None = None
        self.passed: set[str] = set()  # each of a run's epoch, selection and qualify jobs asks: checked once per plan

    def runs_qualified(self) -> dict[str, list]:
        """Runs the ledger holds an entry for (read once, by the submitting Snakemake only)."""
        if not planning(self.workflow):
            return {}
        try:  # a damaged ledger entry stops the plan before any job, with the one line
            return ledger.runs_qualified(open_store(self.store))
        except RffmError as error:
            raise refused(error) from None

    def refuse(self, run: str) -> None:
        """Stop when the run was qualified and its settings changed since, or its ledger entry is not the one recorded."""
        if run in self.passed:
            return
        if self.qualified is None:
            self.qualified = self.runs_qualified()
        if problem := ledger.frozen_run_problem(self.qualified.get(run, []), self.selection_source(run)):
            raise PlanRefused(f"rffm: {problem}")
        if planning(self.workflow):
            self.refuse_changed_entry(run)
        self.passed.add(run)

    def refuse_changed_entry(self, run: str) -> None:
        """Stop (before Snakemake deletes a forced qualify's outputs, which record the entry) when the run's ledger
        entry is not the one its qualification recorded: deleted, edited, put back."""
        store = open_store(self.store)
        folder = qualification_folder(run)
        recorded, name = ledger.recorded_link(lambda file: store.read(f"{folder}/{file}"))
        if recorded is not None:
            where = f"{store.where(folder)}/{name}"
            if problem := ledger.recorded_entry_problem(store, recorded["key"], recorded, where):
                raise PlanRefused(f"rffm: {problem}")


def on_start(workflow: Any, config: dict[str, Any], store: str, launch_profile: str) -> None:
    """Note this host as the lock's owner (for `rffm unlock`), record the launch profile of every run and
    which config files (and --config values) planned it (for the everyday commands)."""
    record_owner(os.getcwd())
    results = open_store(store)
    try:
        launch.record_launch(launch_profile, workflow.basedir, results, list(config["runs"]))
    except RffmError as error:  # before any job: stop with the one line
        raise refused(error) from None
    settings = workflow.config_settings
    plans.record_plans(
        config,
        rffm_config.snakemake_settings(workflow)["files"],
        dict(settings.config or {}),
        results,
        replaced=bool(settings.replace_workflow_config and settings.overwrite_config),
        cwd=os.getcwd(),
        snakefile=str(workflow.main_snakefile),
    )


def command_line_targets(workflow: Any) -> list[str]:
    """The targets of the `snakemake` command line that is parsing this workflow (Snakemake hands them to the
    workflow only after parsing it); none for a job, an API caller (rffm posttrain) or an unreadable line."""
    if not planning(workflow):
        return []
    args = command_line(str(workflow.main_snakefile))
    return sorted(args.targets or []) if args is not None else []


def check_targets(workflow: Any, config: dict[str, Any], results: str) -> None:
    """One line for a target nothing here can make (a misspelt rule or run id, an epoch beyond a run's plan),
    naming what is configured, instead of Snakemake's MissingRuleException or a plan beyond the config."""
    runs = {**config["runs"], **config["references"]}
    prefix = os.path.normpath(results).split("/")
    for target in command_line_targets(workflow):
        parts = os.path.normpath(target).split("/")
        if workflow.is_rule(target) or (len(parts) == 1 and os.path.exists(target)):
            continue
        if len(parts) == 1:
            targets = ", ".join(sorted(r.name for r in workflow.rules))
            raise PlanRefused(
                f"rffm: target {target!r}: the workflow has no such target. Fix: name one of its rules ({targets}) "
                f"or a file under {results}/"
            )
        rest = parts[len(prefix) :] if parts[: len(prefix)] == prefix else []
        if len(rest) < 2 or rest[0] != RUNS:
            continue
        if rest[1] not in runs:
            raise PlanRefused(
                f"rffm: target {target}: {rest[1]!r} is no configured run or reference (configured: "
                f"{', '.join(sorted(runs)) or 'none'}). Fix: name one of them, or add the run to the config"
            )
        if len(rest) > 3 and "/".join(rest[:3]) == epochs_folder(rest[1]) and rest[1] in config["runs"] and rest[3].isdigit():
            planned = config["runs"][rest[1]]["train"]["epochs"]
            if not 1 <= int(rest[3]) <= planned:
                raise PlanRefused(
                    f"rffm: target {target}: runs.{rest[1]}.train.epochs plans epochs 1 to {planned}, not {rest[3]}. "
                    f"Fix: name an epoch from 1 to {planned}, or raise runs.{rest[1]}.train.epochs (a qualified run "
                    "is frozen: give it a new id)"
                )
