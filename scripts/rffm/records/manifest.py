"""The terminal run manifest: what was run, on what, with which result, where and how."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
from pathlib import Path
from typing import Any

from rffm.records import provenance
from rffm.records.files import sha256_json
from rffm.records.layout import PROVENANCE_NAME, SENTINEL_NAME
from rffm.records.pipeline import BY_RULE, REFERENCE_STEPS, SELECTION_STEPS
from rffm.records.sentinel import epoch_metrics, read_sentinel, record_digest

SCHEMA_VERSION = 1
PROCEDURE = "final_qualification"
# Per-step provenance the manifest reports (executor-agnostic; `provider` holds the provider's own facts).
STEP_KEYS = ("executor", "job_id", "host", "device", "gpus", "image", "provider")


def step_provenance(directory: Path) -> dict[str, Any]:
    """A step's checked provenance (sealed, and belonging to the sentinel beside it)."""
    return provenance.read(Path(directory) / PROVENANCE_NAME, Path(directory) / SENTINEL_NAME)


def collect_steps(kind: str, folders: dict[str, Any]) -> dict[str, Any]:
    """Per-rule provenance records of the steps a run of `kind` consumed: the pipeline table's steps whose code decides
    its artifact, each read from `folders[<its row's consumed_as>]` (a list of folders: every job's)."""
    rules = MANIFEST_STEPS[kind]
    out, read = {}, set()
    for rule in rules:
        role = BY_RULE[rule].consumed_as
        if role in read:  # one folder that either of two rules builds (the backbone's): its record names which
            continue
        read.add(role)
        if isinstance(folders[role], (list, tuple)):
            jobs = [step_provenance(Path(d)) for d in folders[role]]
            out[rule] = {**(jobs[-1] if jobs else {}), "jobs": jobs}
        else:
            record = step_provenance(Path(folders[role]))
            out[record.get("rule", rule)] = record
    return out


def source_revision(workflow_dir: str | Path | None) -> dict[str, Any]:
    """Git commit and dirty flag of the checkout the code ran from (RFFM_SOURCE_REVISION in containers)."""
    if os.environ.get("RFFM_SOURCE_REVISION"):
        return {"source_revision": os.environ["RFFM_SOURCE_REVISION"], "dirty": os.environ.get("RFFM_SOURCE_DIRTY") == "1"}
    if workflow_dir is None:
        return {"source_revision": None, "dirty": None}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=workflow_dir, capture_output=True, text=True, check=True).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=workflow_dir, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"source_revision": None, "dirty": None}
    return {"source_revision": commit, "dirty": bool(status.strip())}


def versions() -> dict[str, str | None]:
    """Installed versions of rffm, Snakemake and torch."""
    out = {}
    for package in ("rffm", "snakemake", "torch"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = None
    return out


FROZEN_BACKBONE = "frozen_backbone"  # a head trained on a frozen backbone's cached hidden states (qualify)
END_TO_END = "end_to_end"  # a reference model trained from IQ end to end (qualify_reference)
KINDS = (FROZEN_BACKBONE, END_TO_END)
MANIFEST_STEPS = {FROZEN_BACKBONE: SELECTION_STEPS, END_TO_END: REFERENCE_STEPS}  # the ledger's policy, a kind's steps


def build(
    kind: str,
    spec: dict[str, Any],
    dataset_sentinel: dict[str, Any],
    selection: dict[str, Any],
    qualified: dict[str, Any],
    steps: dict[str, Any],
    *,
    backbone_sentinel: dict[str, Any] | None = None,
    epoch_dirs: list = (),
    launch_record: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest of a run of `kind` (SPEC section 5 keys) from its qualification {metrics, link} and consumed records.

    frozen_backbone takes the backbone sentinel, the epoch folders and the launch record; end_to_end the model's config.
    """
    if kind not in KINDS:
        raise ValueError(f"manifest kind {kind!r}: one of {KINDS}")
    body = {
        "schema_version": SCHEMA_VERSION,
        "run_id": spec["run"],
        "procedure": PROCEDURE,
        "dataset": dataset_part(dataset_sentinel),
        "training": {"params": spec["train"]},
        "selection": selection_part(selection),
        "qualification": qualification_part(qualified),
    }
    if kind == END_TO_END:
        return {
            **body,
            "kind": kind,
            "model": model,
            "provenance": {
                "versions": versions(),
                "steps": {rule: {key: record.get(key) for key in (*STEP_KEYS, "duration_s")} for rule, record in steps.items()},
            },
        }
    # frozen_backbone: the kind SPEC section 5 was written for (its manifest carries no `kind` key)
    body["training"]["epochs"] = epoch_rows(epoch_dirs, selection)
    return {
        **body,
        "backbone": {
            "name": backbone_sentinel["backbone"]["name"],
            "source": backbone_sentinel["backbone"]["source"],
            "fingerprint": backbone_sentinel["backbone"]["fingerprint"],
            **user_backbone(backbone_sentinel["backbone"]),
        },
        "provenance": frozen_provenance(steps, launch_record),
    }


def frozen_provenance(steps: dict[str, Any], launch_record: dict[str, Any] | None) -> dict[str, Any]:
    """Where a frozen-backbone run ran: the checkout's revision, versions, each step's host and times (each epoch job's),
    the launch profile and the epochs restored from the memo."""
    return {
        **source_revision(Path(__file__).resolve().parent),
        "versions": versions(),
        "device": steps.get("qualify", {}).get("device"),
        "steps": {
            rule: {key: record.get(key) for key in STEP_KEYS}
            | ({"jobs": [{k: j.get(k) for k in ("epoch", *STEP_KEYS)} for j in record["jobs"]]} if "jobs" in record else {})
            for rule, record in steps.items()
        },
        "launch_profile": launch_record,
        "restored_epochs": restored_epochs(steps.get("train_epoch", {}).get("jobs", [])),
    }


def dataset_part(dataset_sentinel: dict[str, Any]) -> dict[str, Any]:
    """The manifest's dataset: its name, source, sentinel and split digests, classes and counts."""
    dataset = dataset_sentinel["dataset"]
    return {
        "name": dataset["name"],
        "source": dataset["source"],
        "sentinel_sha256": sha256_json(dataset_sentinel),
        "splits": {name: record_digest(record) for name, record in dataset_sentinel["outputs"].items()},
        "classes": dataset["classes"],
        "counts": dataset["counts"],
    }


def selection_part(selection: dict[str, Any]) -> dict[str, Any]:
    """The manifest's selection: the chosen epoch (and sweep member) and its artifact in the results store."""
    chosen = {key: selection[key] for key in ("epoch", "metric", "mode", "value", "artifact_sha256", "artifact_path")}
    return chosen | ({"member": selection["member"], "settings": selection["settings"]} if "member" in selection else {})


def qualification_part(qualified: dict[str, Any]) -> dict[str, Any]:
    """The manifest's qualification: the test figures, the exposure count and the ledger entry they came from."""
    metrics = qualified["metrics"]
    figures = ("accuracy", "macro_f1", "accuracy_high_snr", "accuracy_by_snr", "accuracy_by_class", "exposure_count")
    return {key: metrics[key] for key in figures} | {"test_count": metrics["count"], "ledger_entry": qualified["link"]}


def epoch_rows(epoch_dirs: list, selection: dict[str, Any]) -> list[dict[str, Any]]:
    """Every epoch's metrics as its (checked) sentinel vouches for them; of a sweep, the chosen member's."""
    rows = []
    for directory in epoch_dirs:
        m = epoch_metrics(read_sentinel(Path(directory) / SENTINEL_NAME), selection.get("member"))
        rows.append({key: m[key] for key in ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "val_macro_f1")})
    return rows


def user_backbone(record: dict[str, Any]) -> dict[str, Any]:
    """What the manifest says of a user's backbone (source python or export): entry point, parameter count, package version."""
    out = {key: record[key] for key in ("parameters", "model_class") if record.get(key) is not None}
    if "python" in record:
        out["entry_point"] = record["python"]["entry_point"]
        out["kwargs"] = record["python"].get("kwargs", {})
        code = record["user_source"]
        out["package"] = {"name": code["package"], "version": code["version"], "source_sha256": code["sha256"]}
    return out


def restored_epochs(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The epochs restored from the memo instead of trained by this run: the entry, and where it was trained.

    Under `provenance` (a preempted run's manifest differs from an uninterrupted one's only there)."""
    return [
        {
            "epoch": job.get("epoch"),
            "memo_entry": job["restored_from"],
            "trained_by": {key: (job.get("computed_by") or {}).get(key) for key in ("executor", "job_id", "host", "device")},
        }
        for job in jobs
        if job.get("restored_from")
    ]
