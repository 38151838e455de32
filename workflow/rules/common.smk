import json
import os
import re
import shlex
import sys

from snakemake.exceptions import WorkflowError

from rffm import config as rffm_config
from rffm.data.sources import input_files as source_input_files
from rffm.errors import PlanRefused, RffmError
from rffm.records import launch, ledger, plans
from rffm.records.code import code_digest
from rffm.records.layout import (
    SPLITS,
    CACHED_SPLITS,
    backbone_folder,
    cache_folder,
    dataset_folder,
    run_folder,
    split_file,
)
from rffm.records.store import open_store
from rffm.data import cache_plan
from rffm.model.taps import spec_for
from rffm.model.usercode import user_source
from rffm.training import sweep
from rffm.ops.preflight import pinned_image_problem
from rffm.ops.unlock import lock_line, record_owner

# One validator: readable problems, then the schema's defaults (the only place defaults live).
# It also reads the config files (repeated keys) and, where jobs and files are on this machine, checks them.
try:
    rffm_config.check(config, **rffm_config.snakemake_settings(workflow))
except RffmError as error:
    # PlanRefused is a SystemExit: Snakemake prints the lines as they are (no "WorkflowError in file" frame)
    raise PlanRefused(f"rffm: {error}") from None

# Rules call the `rffm` console script installed beside the Python running Snakemake,
# whether or not its environment is activated (bash strict mode kept).
shell.prefix(
    f"set -euo pipefail; export PATH={shlex.quote(os.path.dirname(sys.executable))}:$PATH; "
)

# The worker image (envs/Dockerfile) every job runs in, pinned by digest; declared as the workflow's container.
WORKER_IMAGE = os.environ.get("RFFM_WORKER_IMAGE") or None
if WORKER_IMAGE and (IMAGE_PROBLEM := pinned_image_problem(WORKER_IMAGE)):
    raise WorkflowError(IMAGE_PROBLEM)
WORKER_CONTAINER = f"docker://{WORKER_IMAGE}" if WORKER_IMAGE else None

RESULTS = config["results"].rstrip("/")
SCRATCH = config["scratch"].rstrip("/")
THREADS = config["threads"]
STEPS = (
    "stage_dataset",
    "pretrain_backbone",
    "import_backbone",
    "build_cache",
    "train_epoch",
    "select_checkpoint",
    "qualify",
    "plot_training",
    "summarize_manifest",
    "summarize_profiling",
    "plot_cache_lifecycle",
    "train_reference",
    "qualify_reference",
    "plot_comparison",
    "export",
)
# A tracked param per step: the digest of its rffm.steps module and what that imports, so an edit reruns it.
CODE = {rule: code_digest(f"steps.{rule}") for rule in STEPS}


def names_pattern(names):
    """A wildcard constraint matching exactly these names (nothing when empty)."""
    return "|".join(re.escape(name) for name in sorted(names)) or "(?!)"


def backbones_with_source(*sources):
    return [n for n, b in config["backbones"].items() if b["source"] in sources]


wildcard_constraints:
    dataset=names_pattern(config["datasets"]),
    backbone=names_pattern(config["backbones"]),
    run=names_pattern(config["runs"]),
    reference=names_pattern(config["references"]),
    epoch=r"[1-9][0-9]*",


# ---- the results store ----
# With a default storage provider (Google Batch: a GCS prefix) every rule output goes through it; the
# steps also write what must outlive Snakemake's bookkeeping (ledger, artifacts, memo of epochs, launch
# records, traces) into the same place themselves (rffm.records.store). The hidden-state cache is never
# a workflow file: node-local under `scratch`, built by whoever needs it (rffm.data.cache_local).
PREFIX = workflow.storage_settings.default_storage_prefix
# profiles/gcp-batch reads the bucket from the environment: name a missing variable first.
if "$" in (PREFIX or ""):
    raise WorkflowError(
        f"default-storage-prefix {PREFIX!r} names an environment variable that is not set. "
        "Fix: export it (profiles/README.md, Google Cloud)."
    )
STORE = f"{PREFIX.rstrip('/')}/{RESULTS}" if PREFIX else RESULTS


# Directories are derived from the job's own input/output paths, which under a storage provider
# are local copies (.snakemake/storage/...), not the configured paths.
def output_dir(name):
    return lambda wildcards, output: os.path.dirname(getattr(output, name))


def input_dir(name):
    return lambda wildcards, input: os.path.dirname(getattr(input, name))


def input_dirs(name):
    return lambda wildcards, input: " ".join(
        os.path.dirname(f) for f in getattr(input, name)
    )


def dataset_file(dataset, name):
    return f"{RESULTS}/{dataset_folder(dataset)}/{name}"


def backbone_file(backbone, name):
    return f"{RESULTS}/{backbone_folder(backbone)}/{name}"


def cache_file(dataset, backbone, name):
    return f"{RESULTS}/{cache_folder(dataset, backbone)}/{name}"


def run_file(run, name):
    return f"{RESULTS}/{run_folder(run)}/{name}"


def epoch_file(run, epoch, name):
    return f"{RESULTS}/runs/{run}/epochs/{epoch}/{name}"


def as_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def run_config(run):
    return config["runs"][run]


def run_epochs(run):
    return range(1, run_config(run)["train"]["epochs"] + 1)


# ---- step specs passed to the rffm CLI (tracked params: what a step computes) ----


def dataset_spec(wildcards):
    return as_json({"name": wildcards.dataset, **config["datasets"][wildcards.dataset]})


def backbone_spec(wildcards):
    """A backbone's build or import params; its adapter, taps and keep are build_cache's (cache_encoder)."""
    backbone = config["backbones"][wildcards.backbone]
    kept = {k: v for k, v in backbone.items() if k not in ENCODER_KEYS}
    return as_json({"name": wildcards.backbone, **kept})


def epoch_spec(wildcards):
    """Everything an epoch depends on; deliberately not the total epoch count."""
    run = run_config(wildcards.run)
    train = {k: v for k, v in run["train"].items() if k != "epochs"}
    return as_json({"run": wildcards.run, "train": train, **sweep_pairs(run)})


def run_spec(wildcards):
    """The run's config for selection and qualification (profiling never changes results)."""
    run = {k: v for k, v in run_config(wildcards.run).items() if k != "profiling"}
    return as_json({"run": wildcards.run, **run, **sweep_pairs(run)})


def sweep_pairs(run):
    """A run's sweep as [key, values] pairs: the order written is the grid's order (as_json sorts mapping keys)."""
    return (
        {"sweep": [[k, v] for k, v in run["sweep"].items()]} if run.get("sweep") else {}
    )


def sweep_members(wildcards):
    """The sweep's members named in the epoch job's command, so `snakemake -n` shows them (nothing for a plain run)."""
    label = sweep.plan_label(
        {"run": wildcards.run, **sweep_pairs(run_config(wildcards.run))}
    )
    return f"--members {shlex.quote(label)}" if label else ""


def selection_source(run):
    """What a run's selected artifact comes from (config and code); its ledger entry records it."""
    return ledger.selection_source(config, run, CODE)


# ---- execution settings (resources: how a step runs, never what it computes) ----
# Snakemake's rerun triggers (mtime, params, input, software-env, code) never look at resources,
# so changing any of these plans no job; tests/workflow/test_execution_settings.py proves it.

DEVICE = config["device"]
BACKBONE_BATCH = config["cache"]["batch_size"]
DISK_HEADROOM = str(config["cache"]["disk_headroom"])
BATCH_PROFILE = f"{SCRATCH}/batch_profile.json"
LAUNCH_PROFILE = config.get("launch_profile", "")
MEMO_STORE = config.get("checkpoint_store", "")
# what the profile asks for build_cache (set-resources): the cache planner's disk on clusters
BUILD_CACHE_DISK = {
    key: getattr(value, "raw", value)
    for key, value in workflow.resource_settings.overwrite_resources.get(
        "build_cache", {}
    ).items()
}


def profiling_runs(dataset, backbone):
    """Runs on this dataset and backbone that asked for profiling."""
    return [
        name
        for name, run in config["runs"].items()
        if run.get("profiling")
        and (run["dataset"], run["backbone"]) == (dataset, backbone)
    ]


def cache_profile_runs(wildcards):
    return " ".join(profiling_runs(wildcards.dataset, wildcards.backbone))


def cache_profile_batches(wildcards):
    runs = profiling_runs(wildcards.dataset, wildcards.backbone)
    return min((config["runs"][r]["profiling"]["batch_count"] for r in runs), default=0)


def epoch_profile_batches(wildcards):
    """Epochs 1 and 2 of a profiling run trace themselves; later epochs never depend on profiling."""
    profiling = run_config(wildcards.run).get("profiling")
    return profiling["batch_count"] if profiling and int(wildcards.epoch) <= 2 else 0


# ---- groups: on a cluster, one job (one node or VM) per run for its epochs ----


def cache_group(wildcards):
    """The build of a cache joins the epochs of the one run that reads it (its memo is then built once,
    on that node); a cache several runs read is built by its own job and each run's node builds its memo.
    """
    runs = [
        name
        for name, run in config["runs"].items()
        if (run["dataset"], run["backbone"]) == (wildcards.dataset, wildcards.backbone)
    ]
    return (
        f"train_{runs[0]}"
        if len(runs) == 1
        else f"cache_{wildcards.dataset}__{wildcards.backbone}"
    )


# ---- input functions ----


def dataset_source_files(wildcards):
    """The configured input files of a dataset (none for synthetic): new content restages it."""
    return source_input_files(
        {"name": wildcards.dataset, **config["datasets"][wildcards.dataset]}
    )


def backbone_inputs(wildcards):
    dataset = config["backbones"][wildcards.backbone]["dataset"]
    return {
        "dataset": dataset_file(dataset, "sentinel.json"),
        "train": ancient(dataset_file(dataset, split_file("train"))),
    }


def imported_checkpoint(wildcards):
    return ancient(config["backbones"][wildcards.backbone]["path"])


def cache_sources(dataset, backbone):
    """What a cache is built from, as files (an epoch on a fresh node builds it too)."""
    return ancient(
        [dataset_file(dataset, "sentinel.json")]
        + [dataset_file(dataset, split_file(s)) for s in CACHED_SPLITS]
        + [
            backbone_file(backbone, "sentinel.json"),
            backbone_file(backbone, "backbone.pt"),
        ]
    )


def cache_inputs(wildcards):
    return {
        "dataset": dataset_file(wildcards.dataset, "sentinel.json"),
        "backbone": backbone_file(wildcards.backbone, "sentinel.json"),
        "sources": cache_sources(wildcards.dataset, wildcards.backbone),
    }


# A step checks the sentinels it consumes and their links to the sentinels before them: those must be
# on the job's machine too (a storage provider only fetches declared inputs), as ancient inputs.
def cache_record(run):
    cfg = run_config(run)
    return cache_file(cfg["dataset"], cfg["backbone"], "sentinel.json")


def epoch_inputs(wildcards):
    cfg = run_config(wildcards.run)
    inputs = {
        "cache": cache_record(wildcards.run),
        "sources": cache_sources(cfg["dataset"], cfg["backbone"]),
    }
    epoch = int(wildcards.epoch)
    if epoch > 1:
        inputs["previous"] = epoch_file(wildcards.run, epoch - 1, "sentinel.json")
        before = (
            [epoch_file(wildcards.run, epoch - 2, "sentinel.json")] if epoch > 2 else []
        )
        inputs["previous_checkpoint"] = ancient(
            [epoch_file(wildcards.run, epoch - 1, "checkpoint.pt"), *before]
        )
    return inputs


def previous_epoch_arg(wildcards, input):
    if "previous" not in input.keys():
        return ""
    return f"--previous-dir {os.path.dirname(input.previous)}"


def selection_inputs(wildcards):
    return {
        "epochs": [
            epoch_file(wildcards.run, e, "sentinel.json")
            for e in run_epochs(wildcards.run)
        ],
        "files": ancient(
            [
                epoch_file(wildcards.run, e, name)
                for e in run_epochs(wildcards.run)
                for name in ("metrics.json", "checkpoint.pt")
            ]
            + [cache_record(wildcards.run)]
        ),
    }


def qualified_runs():
    """Runs the ledger holds an entry for (read once, by the submitting Snakemake only)."""
    if not workflow.is_main_process or workflow.remote_exec:
        return {}
    try:  # a damaged ledger entry stops the plan before any job, with the one line
        return ledger.runs_qualified(open_store(STORE))
    except RffmError as error:
        raise PlanRefused(f"rffm: {error}") from None


QUALIFIED = None


def refuse_changed_qualified_run(run):
    """Stop while the plan is built, before any job runs or any file is deleted, when a run that
    spent its test exposure would be trained or selected again from changed settings."""
    global QUALIFIED
    if QUALIFIED is None:
        QUALIFIED = qualified_runs()
    problem = ledger.frozen_run_problem(QUALIFIED.get(run, []), selection_source(run))
    if problem:
        raise PlanRefused(f"rffm: {problem}")
    if workflow.is_main_process and not workflow.remote_exec:
        refuse_changed_ledger_entry(run)


def refuse_changed_ledger_entry(run):
    """Stop while the plan is built (before Snakemake deletes a forced qualify's outputs, which record the
    entry) when the run's ledger entry is not the one its qualification recorded: deleted, edited, put back.
    """
    store = open_store(STORE)
    folder = f"runs/{run}/qualification"
    recorded, name = ledger.recorded_link(lambda file: store.read(f"{folder}/{file}"))
    if recorded is not None:
        where = f"{store.where(folder)}/{name}"
        if problem := ledger.recorded_entry_problem(
            store, recorded["key"], recorded, where
        ):
            raise PlanRefused(f"rffm: {problem}")


def qualify_inputs(wildcards):
    refuse_changed_qualified_run(wildcards.run)
    cfg = run_config(wildcards.run)
    dataset, backbone = cfg["dataset"], cfg["backbone"]
    provenance = [
        dataset_file(dataset, "provenance.json"),
        backbone_file(backbone, "provenance.json"),
        cache_file(dataset, backbone, "provenance.json"),
        run_file(wildcards.run, "selection/provenance.json"),
        *(
            epoch_file(wildcards.run, e, name)
            for e in run_epochs(wildcards.run)
            for name in ("provenance.json", "sentinel.json")
        ),
    ]
    return {
        "selection": run_file(wildcards.run, "selection/sentinel.json"),
        "selection_json": ancient(run_file(wildcards.run, "selection/selection.json")),
        "backbone": backbone_file(backbone, "sentinel.json"),
        "weights": ancient(backbone_file(backbone, "backbone.pt")),
        "dataset": dataset_file(dataset, "sentinel.json"),
        "test": ancient(dataset_file(dataset, split_file("test"))),
        "cache": ancient(cache_file(dataset, backbone, "sentinel.json")),
        "records": ancient(provenance),
    }


def qualify_dirs(wildcards, input):
    return {
        "dataset": os.path.dirname(input.dataset),
        "backbone": os.path.dirname(input.backbone),
        "cache": os.path.dirname(input.cache),
        "selection": os.path.dirname(input.selection),
        "epochs": " ".join(
            os.path.dirname(f) for f in input.records if f.endswith("sentinel.json")
        ),
    }


# ---- targets ----


def all_selections():
    return [run_file(run, "selection/sentinel.json") for run in config["runs"]]


def all_manifests():
    return [run_file(run, "qualification/run_manifest.json") for run in config["runs"]]


# ---- report figures (rules/report.smk) ----


def profiling_summary(wildcards):
    """The cache lifecycle summary of a profiled run (runs.<run>.profiling)."""
    return run_file(wildcards.run, "profiling/cache_lifecycle_summary.json")


def profiled_epochs(run):
    """The epochs that trace themselves when a run is profiled: 1 and 2."""
    return [e for e in run_epochs(run) if e <= 2]


def profiling_inputs(wildcards):
    cfg = run_config(wildcards.run)
    epochs = profiled_epochs(wildcards.run)
    return {
        "cache": cache_record(wildcards.run),
        "epochs": [epoch_file(wildcards.run, e, "sentinel.json") for e in epochs],
        "timings": ancient(
            [cache_file(cfg["dataset"], cfg["backbone"], "provenance.json")]
            + [epoch_file(wildcards.run, e, "provenance.json") for e in epochs]
            + [
                dataset_file(cfg["dataset"], "sentinel.json"),
                backbone_file(cfg["backbone"], "sentinel.json"),
            ]
        ),
    }


def manifest_inputs(wildcards):
    cfg = run_config(wildcards.run)
    return {
        "qualification": run_file(wildcards.run, "qualification/sentinel.json"),
        "manifest": ancient(run_file(wildcards.run, "qualification/run_manifest.json")),
        "linked": ancient(
            [
                run_file(wildcards.run, "qualification/provenance.json"),
                run_file(wildcards.run, "selection/sentinel.json"),
                dataset_file(cfg["dataset"], "sentinel.json"),
                backbone_file(cfg["backbone"], "sentinel.json"),
            ]
        ),
    }


def validation_reports(run):
    return [
        run_file(run, f"report/validation/{name}")
        for name in ("training_curves.png", "selection_evidence.png")
    ]


def final_reports(run):
    """Every report figure of a run; the lifecycle chart only when profiling is configured."""
    files = validation_reports(run)
    files.append(run_file(run, "report/qualification/manifest_summary.html"))
    if run_config(run).get("profiling"):
        files.append(run_file(run, "report/profiling/cache_lifecycle.png"))
    return files


def all_validation_reports():
    return [f for run in config["runs"] for f in validation_reports(run)]


def all_final_reports():
    return [f for run in config["runs"] for f in final_reports(run)]


# ---- end-to-end references (rules/reference.smk) ----


def reference_spec(wildcards):
    return as_json(
        {"run": wildcards.reference, **config["references"][wildcards.reference]}
    )


def reference_train_inputs(wildcards):
    dataset = config["references"][wildcards.reference]["dataset"]
    return {
        "dataset": dataset_file(dataset, "sentinel.json"),
        "splits": ancient(
            [dataset_file(dataset, split_file(s)) for s in ("train", "val")]
        ),
    }


def reference_qualify_inputs(wildcards):
    refuse_changed_qualified_run(wildcards.reference)
    dataset = config["references"][wildcards.reference]["dataset"]
    return {
        "selection": run_file(wildcards.reference, "selection/sentinel.json"),
        "selection_files": ancient(
            [
                run_file(wildcards.reference, f"selection/{n}")
                for n in ("selection.json", "history.json", "provenance.json")
            ]
        ),
        "dataset": dataset_file(dataset, "sentinel.json"),
        "test": ancient(dataset_file(dataset, split_file("test"))),
        "records": ancient(dataset_file(dataset, "provenance.json")),
    }


def all_reference_manifests():
    return [
        run_file(r, "qualification/run_manifest.json") for r in config["references"]
    ]


COMPARISON = f"{RESULTS}/report/comparison/comparison.png"


def comparison_reports():
    """The floor | frozen | end-to-end figure, once the config has an end-to-end reference to compare with."""
    return [COMPARISON] if config["references"] else []


def comparison_inputs(wildcards):
    """Every qualified result, and the records its wall time is summed from."""
    names = [*config["runs"], *config["references"]]
    timings = [
        run_file(n, f"{step}/provenance.json")
        for n in names
        for step in ("selection", "qualification")
    ]
    for run, cfg in config["runs"].items():
        timings += [backbone_file(cfg["backbone"], "provenance.json")]
        timings += [cache_file(cfg["dataset"], cfg["backbone"], "provenance.json")]
        timings += [epoch_file(run, e, "provenance.json") for e in run_epochs(run)]
    return {
        "qualifications": [run_file(n, "qualification/sentinel.json") for n in names],
        "manifests": ancient(
            [run_file(n, "qualification/run_manifest.json") for n in names]
        ),
        "timings": ancient(timings),
    }


# ---- the exported classifier (rules/export.smk) ----


def export_inputs(wildcards):
    """The qualification (its test result, never the test split), the selected head, the backbone and the val split."""
    cfg = run_config(wildcards.run)
    dataset, backbone = cfg["dataset"], cfg["backbone"]
    return {
        "qualification": run_file(wildcards.run, "qualification/sentinel.json"),
        "selection": run_file(wildcards.run, "selection/sentinel.json"),
        "backbone": backbone_file(backbone, "sentinel.json"),
        "dataset": dataset_file(dataset, "sentinel.json"),
        "cache": ancient(cache_file(dataset, backbone, "sentinel.json")),
        # the sentinels the selection consumed: a Batch VM has only the declared inputs
        "epochs": ancient(
            [
                epoch_file(wildcards.run, e, "sentinel.json")
                for e in run_epochs(wildcards.run)
            ]
        ),
        "files": ancient(
            [
                run_file(wildcards.run, "qualification/run_manifest.json"),
                run_file(wildcards.run, "selection/selection.json"),
                run_file(wildcards.run, "selection/model_card.json"),
                backbone_file(backbone, "backbone.pt"),
                dataset_file(dataset, split_file("val")),
            ]
        ),
    }


def export_dirs(wildcards, input):
    return {
        name: os.path.dirname(getattr(input, name))
        for name in ("qualification", "selection", "backbone", "dataset", "cache")
    }


def all_exports():
    return [run_file(run, "export/sentinel.json") for run in config["runs"]]


# ---- when the workflow starts executing (never on -n or --lint) ----


def on_start():
    """Note this host as the lock's owner (for `rffm unlock`) and record the launch profile of every run."""
    record_owner(os.getcwd())
    try:
        launch.record_launch(
            LAUNCH_PROFILE, workflow.basedir, open_store(STORE), list(config["runs"])
        )
    except RffmError as error:  # before any job: stop with the one line
        raise PlanRefused(f"rffm: {error}") from None
    record_plans()


# ---- bring your own backbone (rffm.model.encoder): the cache's encoder, the user's code, the cache planner ----
ENCODER_KEYS = ("adapter", "taps", "keep")


def cache_encoder(wildcards):
    """build_cache's param: how the backbone is called and read (adapter, taps, keep); changing it rebuilds the cache only."""
    return as_json(spec_for(config["backbones"][wildcards.backbone]))


def user_code(wildcards):
    """import_backbone's param for `source: python`: the digest of the user's package source (an edit reruns the import)."""
    backbone = config["backbones"][wildcards.backbone]
    if backbone["source"] != "python":
        return ""
    python = backbone["python"]
    try:
        where = f"backbones.{wildcards.backbone}"
        code = user_source(python["entry_point"], python.get("import_path"), where)
        return code["sha256"]
    except RffmError as error:
        raise PlanRefused(f"rffm: {error}") from None


# Caches that cannot fit the scratch disk (or a dataset length the backbone does not take) stop the plan, -n included.
if workflow.is_main_process and not workflow.remote_exec:
    if refused := cache_plan.refusals(config, RESULTS, SCRATCH, BUILD_CACHE_DISK):
        raise PlanRefused("rffm: " + "\n  ".join(refused))


# ---- while planning: a lock a killed run left (read only; Snakemake's own paragraph follows) ----
if (
    workflow.is_main_process
    and not workflow.remote_exec
    and not workflow.subprocess_exec
):
    if LOCK_LINE := lock_line(os.getcwd()):
        print(LOCK_LINE, file=sys.stderr)


# ---- the plan records (rffm.records.plans) ----


def record_plans():
    """Record which config files (and --config values) planned every run, for the everyday commands."""
    settings = workflow.config_settings
    plans.record_plans(
        config,
        rffm_config.snakemake_settings(workflow)["files"],
        dict(settings.config or {}),
        open_store(STORE),
        replaced=bool(settings.replace_workflow_config and settings.overwrite_config),
        cwd=os.getcwd(),
        snakefile=str(workflow.main_snakefile),
    )


# ---- the targets named on the command line (checked at the Snakefile's end, once all rules exist) ----


def command_line_targets():
    """The targets of the `snakemake` command line that is parsing this workflow (Snakemake hands them to the
    workflow only after parsing it); none for a job, an API caller (rffm posttrain) or an unreadable line.
    """
    if not workflow.is_main_process or workflow.remote_exec:
        return []
    if "snakemake" not in os.path.basename(os.path.dirname(sys.argv[0]) + sys.argv[0]):
        return []
    try:
        from snakemake.cli import get_argument_parser

        return sorted(get_argument_parser().parse_args(sys.argv[1:]).targets or [])
    except (
        SystemExit,
        Exception,
    ):  # whatever Snakemake's own parser makes of it, it reports itself
        return []


def check_targets():
    """One line for a target nothing here can make (a misspelt rule or run id, an epoch beyond a run's plan),
    naming what is configured, instead of Snakemake's MissingRuleException or a plan beyond the config.
    """
    runs = {**config["runs"], **config["references"]}
    prefix = os.path.normpath(RESULTS).split("/")
    for target in command_line_targets():
        parts = os.path.normpath(target).split("/")
        if workflow.is_rule(target) or (len(parts) == 1 and os.path.exists(target)):
            continue
        if len(parts) == 1:
            targets = ", ".join(sorted(r.name for r in workflow.rules))
            raise PlanRefused(
                f"rffm: target {target!r}: the workflow has no such target. Fix: name one of its rules ({targets}) "
                f"or a file under {RESULTS}/"
            )
        rest = parts[len(prefix) :] if parts[: len(prefix)] == prefix else []
        if len(rest) < 2 or rest[0] != "runs":
            continue
        if rest[1] not in runs:
            raise PlanRefused(
                f"rffm: target {target}: {rest[1]!r} is no configured run or reference (configured: "
                f"{', '.join(sorted(runs)) or 'none'}). Fix: name one of them, or add the run to the config"
            )
        if (
            len(rest) > 3
            and rest[2] == "epochs"
            and rest[1] in config["runs"]
            and rest[3].isdigit()
        ):
            planned = config["runs"][rest[1]]["train"]["epochs"]
            if not 1 <= int(rest[3]) <= planned:
                raise PlanRefused(
                    f"rffm: target {target}: runs.{rest[1]}.train.epochs plans epochs 1 to {planned}, not {rest[3]}. "
                    f"Fix: name an epoch from 1 to {planned}, or raise runs.{rest[1]}.train.epochs (a qualified run "
                    "is frozen: give it a new id)"
                )
