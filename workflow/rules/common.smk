import json
import os
import re
import shlex
import sys

from rffm.config.invocation import report_only
from rffm.data.sources import input_files as source_input_files
from rffm.plan import planning
from rffm.records import layout, ledger, pipeline
from rffm.records.code import code_digest
from rffm.records.layout import SPLITS, CACHED_SPLITS, split_file
from rffm.model.taps import spec_for
from rffm.training import sweep

# One validator: readable problems, then the schema's defaults (the only place defaults live).
planning.check_config(config, workflow)
# On cluster nodes or VMs, scratch and the GPU are theirs: checked when each job starts; the plan says so.
planning.note_node_checks(workflow, config)
# ... and how each cache's build and its readers' epochs are grouped there (cache.colocate, cache.runs_per_group).
planning.note_colocation(workflow, config)

# Rules call the `rffm` console script installed beside the Python running Snakemake,
# whether or not its environment is activated (bash strict mode kept).
shell.prefix(
    f"set -euo pipefail; export PATH={shlex.quote(os.path.dirname(sys.executable))}:$PATH; "
)

# The worker image (envs/Dockerfile) every job runs in, pinned by digest; declared as the workflow's container.
WORKER_CONTAINER = planning.worker_container()

RESULTS = config["results"].rstrip("/")
SCRATCH = config["scratch"].rstrip("/")
THREADS = config["threads"]
# A tracked param per step: the digest of its rffm.steps module and what that imports, so an edit reruns it.
CODE = {step.rule: code_digest(step.module) for step in pipeline.STEPS}


def names_pattern(names):
    """A wildcard constraint matching exactly these names (nothing when empty)."""
    return "|".join(re.escape(name) for name in sorted(names)) or "(?!)"


def backbones_built_by(rule):
    """The backbones whose source this rule builds (rffm.records.pipeline)."""
    sources = pipeline.BY_RULE[rule].backbone_sources
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
STORE = planning.results_store(workflow, RESULTS)


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
    return f"{RESULTS}/{layout.dataset_folder(dataset)}/{name}"


def backbone_file(backbone, name):
    return f"{RESULTS}/{layout.backbone_folder(backbone)}/{name}"


def cache_file(dataset, backbone, name):
    return f"{RESULTS}/{layout.cache_folder(dataset, backbone)}/{name}"


def epoch_file(run, epoch, name):
    return f"{RESULTS}/{layout.epoch_folder(run, epoch)}/{name}"


def selection_file(run, name):
    return f"{RESULTS}/{layout.selection_folder(run)}/{name}"


def qualification_file(run, name):
    return f"{RESULTS}/{layout.qualification_folder(run)}/{name}"


def export_file(run, name):
    return f"{RESULTS}/{layout.export_folder(run)}/{name}"


def profiling_file(run, name):
    return f"{RESULTS}/{layout.profiling_folder(run)}/{name}"


def report_file(run, part, name):
    return f"{RESULTS}/{layout.report_folder(run, part)}/{name}"


def comparison_file(name):
    return f"{RESULTS}/{layout.COMPARISON_FOLDER}/{name}"


def log_path(rule, name=""):
    return f"{RESULTS}/{layout.log_file(rule, name)}"


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
    """The run's config for selection and qualification (profiling and export never change results)."""
    run = ledger.result_config(run_config(wildcards.run))
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
    """What a run's selected artifact comes from (config, code, a user module's source); its ledger entry records it."""
    backbone = config["runs"][run]["backbone"] if run in config["runs"] else None
    user = (
        planning.user_code(config["backbones"][backbone], backbone) if backbone else ""
    )
    return ledger.selection_source(config, run, CODE, user)


# ---- execution settings (resources: how a step runs, never what it computes) ----
# Snakemake's rerun triggers (mtime, params, input, software-env, code) never look at resources,
# so changing any of these plans no job; tests/workflow/test_execution_settings.py proves it.

DEVICE = config["device"]
BACKBONE_BATCH = config["cache"]["batch_size"]
DISK_HEADROOM = str(config["cache"]["disk_headroom"])
BATCH_PROFILE = f"{SCRATCH}/batch_profile.json"
LAUNCH_PROFILE = config.get("launch_profile", "")
# The memo store (the config calls it checkpoint_store).
MEMO_STORE = config.get("checkpoint_store", "")
# How a step that builds a cache where it is missing runs: build_cache, and an epoch on a node without one.
CACHE_RESOURCES = {
    "device": DEVICE,
    "backbone_batch": BACKBONE_BATCH,
    "disk_headroom": DISK_HEADROOM,
    "batch_profile": BATCH_PROFILE,
    "scratch": SCRATCH,
    "store": STORE,
}
# what the profile asks for build_cache (set-resources): the cache planner's disk on clusters
BUILD_CACHE_DISK = planning.overwritten_resources(workflow, "build_cache")


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


# ---- groups: on a cluster, one job (one node or VM) per cache part or per run (config cache.colocate) ----
# The cache never leaves the node that built it, so its readers go to it: per-cache, a cache's build and the epochs of
# the first cache.runs_per_group runs reading it are one group job, each further part of at most that many runs another
# that builds its own copy; per-run, each run's epochs are one group job that builds its own copy (a cache several runs
# read is also built by its own job). Looked up in one table built once (rffm.plan.planning.colocation); local runs
# carry no groups (planning.groups_apply).
GROUPS = planning.colocation(config) if planning.groups_apply(workflow) else None
# a part's runs share no job: Snakemake would submit each as its own job (planning.keep_parts_whole)
WHOLE_PARTS = planning.part_groups(GROUPS) if GROUPS else {}


def cache_group(wildcards):
    """The build of a cache: with its first readers, or the one run that reads it, or its own job."""
    return GROUPS and GROUPS.builds[(wildcards.dataset, wildcards.backbone)]


def epoch_group(wildcards):
    """The epochs of a run: with its cache's build and other readers' epochs (per-cache) or its own job."""
    planning.keep_parts_whole(workflow, WHOLE_PARTS)
    return GROUPS and GROUPS.epochs[wildcards.run]


# ---- input functions ----


def dataset_source_files(wildcards):
    """The configured input files of a dataset (none for synthetic): new content restages it."""
    return source_input_files(
        {"name": wildcards.dataset, **config["datasets"][wildcards.dataset]}
    )


def backbone_inputs(wildcards):
    dataset = config["backbones"][wildcards.backbone]["dataset"]
    return {
        "dataset": dataset_file(dataset, layout.SENTINEL_NAME),
        "train": ancient(dataset_file(dataset, split_file("train"))),
    }


def imported_checkpoint(wildcards):
    return ancient(config["backbones"][wildcards.backbone]["path"])


def cache_sources(dataset, backbone):
    """What a cache is built from, as files (an epoch on a fresh node builds it too)."""
    return ancient(
        [dataset_file(dataset, layout.SENTINEL_NAME)]
        + [dataset_file(dataset, split_file(s)) for s in CACHED_SPLITS]
        + [
            backbone_file(backbone, layout.SENTINEL_NAME),
            backbone_file(backbone, layout.BACKBONE_NAME),
        ]
    )


def cache_inputs(wildcards):
    return {
        "dataset": dataset_file(wildcards.dataset, layout.SENTINEL_NAME),
        "backbone": backbone_file(wildcards.backbone, layout.SENTINEL_NAME),
        "sources": cache_sources(wildcards.dataset, wildcards.backbone),
    }


# A step checks the sentinels it consumes and their links to the sentinels before them: those must be
# on the job's machine too (a storage provider only fetches declared inputs), as ancient inputs.
def cache_record(run):
    cfg = run_config(run)
    return cache_file(cfg["dataset"], cfg["backbone"], layout.SENTINEL_NAME)


def epoch_inputs(wildcards):
    FROZEN.refuse(wildcards.run)
    cfg = run_config(wildcards.run)
    inputs = {
        "cache": cache_record(wildcards.run),
        "sources": cache_sources(cfg["dataset"], cfg["backbone"]),
    }
    epoch = int(wildcards.epoch)
    if epoch > 1:
        inputs["previous"] = epoch_file(wildcards.run, epoch - 1, layout.SENTINEL_NAME)
        before = (
            [epoch_file(wildcards.run, epoch - 2, layout.SENTINEL_NAME)]
            if epoch > 2
            else []
        )
        inputs["previous_checkpoint"] = ancient(
            [epoch_file(wildcards.run, epoch - 1, layout.CHECKPOINT_NAME), *before]
        )
    return inputs


def previous_epoch_arg(wildcards, input):
    if "previous" not in input.keys():
        return ""
    return f"--previous-dir {os.path.dirname(input.previous)}"


def selection_inputs(wildcards):
    FROZEN.refuse(wildcards.run)
    return {
        "epochs": [
            epoch_file(wildcards.run, e, layout.SENTINEL_NAME)
            for e in run_epochs(wildcards.run)
        ],
        "files": ancient(
            [
                epoch_file(wildcards.run, e, name)
                for e in run_epochs(wildcards.run)
                for name in (layout.METRICS_NAME, layout.CHECKPOINT_NAME)
            ]
            + [cache_record(wildcards.run)]
        ),
    }


# a run that spent its test exposure is never trained, selected or qualified again from changed settings,
# whatever the target (validation_selection too: it would reselect the qualified run in place)
FROZEN = planning.FrozenRuns(workflow, STORE, selection_source)


def qualify_inputs(wildcards):
    FROZEN.refuse(wildcards.run)
    cfg = run_config(wildcards.run)
    dataset, backbone = cfg["dataset"], cfg["backbone"]
    provenance = [
        dataset_file(dataset, layout.PROVENANCE_NAME),
        backbone_file(backbone, layout.PROVENANCE_NAME),
        cache_file(dataset, backbone, layout.PROVENANCE_NAME),
        selection_file(wildcards.run, layout.PROVENANCE_NAME),
        *(
            epoch_file(wildcards.run, e, name)
            for e in run_epochs(wildcards.run)
            for name in (layout.PROVENANCE_NAME, layout.SENTINEL_NAME)
        ),
    ]
    return {
        "selection": selection_file(wildcards.run, layout.SENTINEL_NAME),
        "selection_json": ancient(selection_file(wildcards.run, layout.SELECTION_NAME)),
        "backbone": backbone_file(backbone, layout.SENTINEL_NAME),
        "weights": ancient(backbone_file(backbone, layout.BACKBONE_NAME)),
        "dataset": dataset_file(dataset, layout.SENTINEL_NAME),
        "test": ancient(dataset_file(dataset, split_file("test"))),
        "cache": ancient(cache_file(dataset, backbone, layout.SENTINEL_NAME)),
        "records": ancient(provenance),
    }


def qualify_dirs(wildcards, input):
    return {
        "dataset": os.path.dirname(input.dataset),
        "backbone": os.path.dirname(input.backbone),
        "cache": os.path.dirname(input.cache),
        "selection": os.path.dirname(input.selection),
        "epochs": " ".join(
            os.path.dirname(f)
            for f in input.records
            if f.endswith(layout.SENTINEL_NAME)
        ),
    }


# ---- targets ----


def all_selections():
    return [selection_file(run, layout.SENTINEL_NAME) for run in config["runs"]]


def all_manifests():
    return [qualification_file(run, layout.MANIFEST_NAME) for run in config["runs"]]


# ---- report figures (rules/report.smk) ----


def profiling_summary(wildcards):
    """The cache lifecycle summary of a profiled run (runs.<run>.profiling)."""
    return profiling_file(wildcards.run, layout.CACHE_LIFECYCLE_SUMMARY)


def profiled_epochs(run):
    """The epochs that trace themselves when a run is profiled: 1 and 2."""
    return [e for e in run_epochs(run) if e <= 2]


def profiling_inputs(wildcards):
    cfg = run_config(wildcards.run)
    epochs = profiled_epochs(wildcards.run)
    return {
        "cache": cache_record(wildcards.run),
        "epochs": [epoch_file(wildcards.run, e, layout.SENTINEL_NAME) for e in epochs],
        "timings": ancient(
            [cache_file(cfg["dataset"], cfg["backbone"], layout.PROVENANCE_NAME)]
            + [epoch_file(wildcards.run, e, layout.PROVENANCE_NAME) for e in epochs]
            + [
                dataset_file(cfg["dataset"], layout.SENTINEL_NAME),
                backbone_file(cfg["backbone"], layout.SENTINEL_NAME),
            ]
        ),
    }


def manifest_inputs(wildcards):
    cfg = run_config(wildcards.run)
    return {
        "qualification": qualification_file(wildcards.run, layout.SENTINEL_NAME),
        "manifest": ancient(qualification_file(wildcards.run, layout.MANIFEST_NAME)),
        "linked": ancient(
            [
                qualification_file(wildcards.run, layout.PROVENANCE_NAME),
                selection_file(wildcards.run, layout.SENTINEL_NAME),
                dataset_file(cfg["dataset"], layout.SENTINEL_NAME),
                backbone_file(cfg["backbone"], layout.SENTINEL_NAME),
            ]
        ),
    }


def validation_reports(run):
    return [
        report_file(run, "validation", name)
        for name in (layout.TRAINING_CURVES, layout.SELECTION_EVIDENCE)
    ]


def final_reports(run):
    """Every report figure of a run; the lifecycle chart only when profiling is configured."""
    files = validation_reports(run)
    files.append(report_file(run, "qualification", layout.MANIFEST_SUMMARY))
    if run_config(run).get("profiling"):
        files.append(report_file(run, "profiling", layout.CACHE_LIFECYCLE))
    return files


def all_validation_reports():
    return [f for run in config["runs"] for f in validation_reports(run)]


# `snakemake --report` runs nothing and stops at the first report file of its target's jobs that does not exist: there
# a target names only what the runs have made so far (a run only validation-selected: its validation figures; the
# report's text, report/workflow.rst, says which sections are absent).
REPORT_ONLY = report_only(workflow)


def made_so_far(*targets):
    """A target rule's files (lists of them); under `snakemake --report` those that exist."""
    files = [f for target in targets for f in target]
    return [f for f in files if os.path.exists(f)] if REPORT_ONLY else files


def all_final_reports():
    return [f for run in config["runs"] for f in final_reports(run)]


# ---- end-to-end references (rules/reference.smk) ----


def reference_spec(wildcards):
    """A reference's config; its sweep as [key, values] pairs (the grid's order), as a run's."""
    reference = config["references"][wildcards.reference]
    return as_json({"run": wildcards.reference, **reference, **sweep_pairs(reference)})


def reference_members(wildcards):
    """A reference sweep's members named in train_reference's command, so `snakemake -n -p` shows them."""
    reference = config["references"][wildcards.reference]
    label = sweep.plan_label(
        {"run": wildcards.reference, **sweep_pairs(reference)}, "references"
    )
    return f"--members {shlex.quote(label)}" if label else ""


def reference_train_inputs(wildcards):
    FROZEN.refuse(wildcards.reference)
    dataset = config["references"][wildcards.reference]["dataset"]
    return {
        "dataset": dataset_file(dataset, layout.SENTINEL_NAME),
        "splits": ancient(
            [dataset_file(dataset, split_file(s)) for s in ("train", "val")]
        ),
    }


def reference_qualify_inputs(wildcards):
    FROZEN.refuse(wildcards.reference)
    dataset = config["references"][wildcards.reference]["dataset"]
    return {
        "selection": selection_file(wildcards.reference, layout.SENTINEL_NAME),
        "selection_files": ancient(
            [
                selection_file(wildcards.reference, n)
                for n in (
                    layout.SELECTION_NAME,
                    layout.HISTORY_NAME,
                    layout.PROVENANCE_NAME,
                )
            ]
        ),
        "dataset": dataset_file(dataset, layout.SENTINEL_NAME),
        "test": ancient(dataset_file(dataset, split_file("test"))),
        "records": ancient(dataset_file(dataset, layout.PROVENANCE_NAME)),
    }


def all_reference_selections():
    """Each reference's epoch chosen on val: its training job's record (train_reference reads no test split)."""
    return [selection_file(r, layout.SENTINEL_NAME) for r in config["references"]]


def all_reference_manifests():
    return [qualification_file(r, layout.MANIFEST_NAME) for r in config["references"]]


COMPARISON = comparison_file(layout.COMPARISON_FIGURE)


def comparison_reports():
    """The floor | frozen | end-to-end figure, once the config has an end-to-end reference to compare with."""
    return [COMPARISON] if config["references"] else []


def comparison_inputs(wildcards):
    """Every qualified result, and the records its wall time is summed from."""
    names = [*config["runs"], *config["references"]]
    timings = [
        file(n, layout.PROVENANCE_NAME)
        for n in names
        for file in (selection_file, qualification_file)
    ]
    for run, cfg in config["runs"].items():
        timings += [backbone_file(cfg["backbone"], layout.PROVENANCE_NAME)]
        timings += [cache_file(cfg["dataset"], cfg["backbone"], layout.PROVENANCE_NAME)]
        timings += [epoch_file(run, e, layout.PROVENANCE_NAME) for e in run_epochs(run)]
    return {
        "qualifications": [qualification_file(n, layout.SENTINEL_NAME) for n in names],
        "manifests": ancient(
            [qualification_file(n, layout.MANIFEST_NAME) for n in names]
        ),
        "timings": ancient(timings),
    }


def comparison_root(wildcards, input):
    """results/ as the job sees it (local copies under a storage provider): the root of the first qualification."""
    first = [*config["runs"], *config["references"]][0]
    folder = os.path.dirname(input.qualifications[0])
    return layout.root_of(folder, layout.qualification_folder(first))


# ---- the exported classifier (rules/export.smk) ----


def export_inputs(wildcards):
    """The qualification (its test result, never the test split), the selected head, the backbone and the val split."""
    cfg = run_config(wildcards.run)
    dataset, backbone = cfg["dataset"], cfg["backbone"]
    return {
        "qualification": qualification_file(wildcards.run, layout.SENTINEL_NAME),
        "selection": selection_file(wildcards.run, layout.SENTINEL_NAME),
        "backbone": backbone_file(backbone, layout.SENTINEL_NAME),
        "dataset": dataset_file(dataset, layout.SENTINEL_NAME),
        "cache": ancient(cache_file(dataset, backbone, layout.SENTINEL_NAME)),
        # the sentinels the selection consumed: a Batch VM has only the declared inputs
        "epochs": ancient(
            [
                epoch_file(wildcards.run, e, layout.SENTINEL_NAME)
                for e in run_epochs(wildcards.run)
            ]
        ),
        "files": ancient(
            [
                qualification_file(wildcards.run, layout.MANIFEST_NAME),
                selection_file(wildcards.run, layout.SELECTION_NAME),
                selection_file(wildcards.run, layout.MODEL_CARD),
                backbone_file(backbone, layout.BACKBONE_NAME),
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
    """The exports of the runs that ask for one (runs.<run>.export)."""
    return [
        export_file(run, layout.SENTINEL_NAME)
        for run, spec in config["runs"].items()
        if spec["export"]
    ]


# ---- when the workflow starts executing (never on -n or --lint) ----


def on_start():
    """Note the lock's owner, record the launch profile and the plan of every run (rffm.plan.planning)."""
    planning.on_start(workflow, config, STORE, LAUNCH_PROFILE)


# ---- bring your own backbone (rffm.model.encoder): the cache's encoder, the user's code, the cache planner ----
ENCODER_KEYS = ("adapter", "taps", "keep")


def cache_encoder(wildcards):
    """build_cache's param: how the backbone is called and read (adapter, taps, keep); changing it rebuilds the cache only."""
    return as_json(spec_for(config["backbones"][wildcards.backbone]))


def user_code(wildcards):
    """import_backbone's param for `source: python`: the digest of the user's package source (an edit reruns the import)."""
    return planning.user_code(
        config["backbones"][wildcards.backbone], wildcards.backbone
    )


# Caches that cannot fit the scratch disk (or a dataset length the backbone does not take) stop the plan, -n included.
planning.refuse_unfit_caches(workflow, config, RESULTS, SCRATCH, BUILD_CACHE_DISK)
# What the plan will cost, from a throughput record of this backbone on this device (config `throughput`), once
# every refusal above has had its say (a refused plan prints its one line, nothing else).
planning.note_cost(workflow, config)
# A lock a killed run left (read only; Snakemake's own paragraph follows).
planning.print_lock(workflow)


# ---- the targets named on the command line (checked at the Snakefile's end, once all rules exist) ----


def check_targets():
    planning.check_targets(workflow, config, RESULTS)
