"""The selection rule: which epoch a run keeps, by its validation metric (ties go to the earliest epoch)."""

from __future__ import annotations

import io
from typing import Any

from rffm.errors import ConfigError, IntegrityError
from rffm.records.files import sha256_bytes
from rffm.records.layout import ARTIFACTS, artifact_name
from rffm.records.ranking import scorer
from rffm.records.store import Store, create_addressed
from rffm.training import sweep

RULE_TEXT = "best value of the metric; ties go to the earliest epoch"
SWEEP_RULE_TEXT = "best value of the metric over every (member, epoch); ties go to the earliest epoch, then the first member in grid order"


def choose(metrics_by_epoch: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any]:
    """The best epoch by metric and mode; ties go to the earliest epoch."""
    if not metrics_by_epoch:
        raise ConfigError("selection needs at least one epoch")
    if metric not in metrics_by_epoch[0]:
        raise ConfigError(f"runs.*.selection.metric: {metric!r} is not an epoch metric; choose one of {sorted(metrics_by_epoch[0])}")
    score = scorer(metric, mode)
    return max(sorted(metrics_by_epoch, key=lambda m: m["epoch"]), key=lambda m: (score(m), -m["epoch"]))


def best(metrics_by_epoch: list[dict[str, Any]], selection: dict[str, str]) -> dict[str, Any] | None:
    """The best of the epochs that carry the run's selection metric (None when none does yet)."""
    scored = [m for m in metrics_by_epoch if selection["metric"] in m]
    return choose(scored, selection["metric"], selection["mode"]) if scored else None


def evidence(chosen: dict[str, Any], candidates: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any]:
    """What was chosen, among what and by which rule, as a selection records it."""
    return {
        "metric": metric,
        "mode": mode,
        "epoch": chosen["epoch"],
        "value": chosen[metric],
        "candidates": [{"epoch": c["epoch"], metric: c[metric], **({"member": c["member"]} if "member" in c else {})} for c in candidates],
        "rule": SWEEP_RULE_TEXT if "member" in chosen else RULE_TEXT,
        **({"member": chosen["member"]} if "member" in chosen else {}),
    }


def sweep_candidates(epoch_tables: list[dict[str, Any]], member_names: list[str]) -> list[dict[str, Any]]:
    """Every (member, epoch) of a sweep's epoch metrics tables as one candidate, epochs ascending, members in grid order."""
    candidates = []
    for table in sorted(epoch_tables, key=lambda t: t["epoch"]):
        missing = [name for name in member_names if name not in table["members"]]
        if missing:
            raise IntegrityError(f"epoch {table['epoch']}: its metrics hold no member {missing}. Fix: rerun snakemake.")
        candidates += [{**table["members"][name], "member": name} for name in member_names]
    return candidates


def publish_artifact(results: Store, weights: dict[str, Any]) -> dict[str, Any]:
    """Save the chosen weights create-only under their sha256 in the store's artifacts/: {key, bytes, sha256}."""
    import torch  # here: `rffm status` reads the selection rule without loading torch

    buffer = io.BytesIO()
    torch.save(weights, buffer)
    blob = buffer.getvalue()
    return create_addressed(results, f"{ARTIFACTS}/{artifact_name(sha256_bytes(blob))}", blob, "artifact")


VALIDATION_KEYS = ("val_accuracy", "val_macro_f1", "val_loss")  # what a sweep's validation table lists per candidate


def sweep_record(chosen: dict[str, Any], members: list[dict[str, Any]], candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """A sweep's record of its choice (a run's model card, a reference's history): the chosen member and its settings,
    every member, the grid order and the whole validation table."""
    table = [{key: c[key] for key in ("member", "epoch", *VALIDATION_KEYS)} for c in candidates]
    return {"member": chosen["name"], "settings": chosen["settings"], "members": members, "order": sweep.ORDER_TEXT, "validation": table}
