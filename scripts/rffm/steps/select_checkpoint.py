"""select_checkpoint: the best epoch by the validation metric, published as an immutable, content-addressed artifact.

The artifact goes to the results store's artifacts/ folder, create-only and named by its sha256:
it is no rule's output, so Snakemake never deletes it, and every artifact ever selected stays
addressable from the selections, ledger entries and manifests that name it.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import torch

from rffm.errors import ConfigError
from rffm.records.files import atomic_write_bytes, atomic_write_json, canonical_json, read_json
from rffm.records.layout import CHECKPOINT_NAME, METRICS_NAME, MODEL_CARD, SELECTION_NAME, SENTINEL_NAME
from rffm.records.sentinel import require_intact
from rffm.records.step import Step
from rffm.records.store import given_store
from rffm.training import sweep
from rffm.training.selection import choose, publish_artifact, sweep_candidates, sweep_record
from rffm.training.selection import evidence as selection_evidence

RULE = "select_checkpoint"
READ_ONLY = 0o444


def run(spec: dict[str, Any], epoch_dirs: list[str | Path], out_dir: str | Path, *, store: str | Path | None = None) -> Path:
    """Choose the best epoch (of a sweep: the best (member, epoch)), publish its weights as artifacts/sha256-<hex>.pt
    in the store, and write the model card."""
    options = spec["selection"]
    members = sweep.members(spec)
    names = [m["name"] for m in members] if len(members) > 1 else None
    with Step(RULE, out_dir, key={"run": spec["run"]}, params=options) as step:
        results = given_store(store, RULE)
        epoch_dirs = [Path(d) for d in epoch_dirs]
        candidates, records = [], {}
        for directory in epoch_dirs:  # runs/<run>/epochs/<k>
            records[directory.name] = step.consume(f"epoch_{directory.name}", directory / SENTINEL_NAME, [METRICS_NAME])
            candidates.append(read_json(directory / METRICS_NAME))
        if names:  # a sweep: every (member, epoch) is a candidate
            candidates = sweep_candidates(candidates, names)
        diverged = [c["epoch"] for c in candidates if not all(math.isfinite(v) for v in c.values() if isinstance(v, float))]
        if diverged:
            raise ConfigError(f"runs.{spec['run']}: epoch(s) {diverged} have non-finite metrics; a diverged run is never selected.")
        best = choose(candidates, options["metric"], options["mode"])
        chosen_dir = epoch_dirs[[int(d.name) for d in epoch_dirs].index(best["epoch"])]
        require_intact(chosen_dir / SENTINEL_NAME, [CHECKPOINT_NAME], RULE)
        source = chosen_dir / CHECKPOINT_NAME
        if names:
            source = io.BytesIO(sweep.read_member(source, best["member"], CHECKPOINT_NAME))
        checkpoint = torch.load(source, map_location="cpu", weights_only=True)
        head = ("classes", "backbone_fingerprint", "head_config", "head")  # in this order: the artifact's bytes
        published = publish_artifact(results, {"format": "rffm-head-artifact/1", **{key: checkpoint[key] for key in head}})
        evidence = selection_evidence(best, candidates, options["metric"], options["mode"])
        card = model_card(spec, published, checkpoint, evidence, records[chosen_dir.name])
        if names:  # the chosen member's settings, every member and the whole validation table
            chosen = members[names.index(best["member"])]
            card["training"] = sweep.member_train(spec["train"], chosen["settings"])
            card["sweep"] = sweep_record(chosen, members, candidates)
        atomic_write_bytes(step.out_dir / MODEL_CARD, canonical_json(card).encode(), mode=READ_ONLY)
        selection = {**evidence, "run": spec["run"], "artifact_sha256": published["sha256"], "artifact_path": published["key"]}
        if names:
            selection["settings"] = card["sweep"]["settings"]
        atomic_write_json(step.out_dir / SELECTION_NAME, selection)
        for name in (SELECTION_NAME, MODEL_CARD):
            step.output(name)
        step.facts.update(
            {
                "backbone_fingerprint": checkpoint["backbone_fingerprint"],
                "selection": selection,
                "artifact": published,
            }
        )
    return step.sentinel


def model_card(spec: dict[str, Any], published: dict[str, Any], checkpoint: dict[str, Any], evidence: dict, epoch: dict) -> dict[str, Any]:
    """The selected head's model card (a sweep adds its member and table): what it is, what it read, how it was chosen."""
    card = {
        "artifact": published["key"],
        "artifact_sha256": published["sha256"],
        "run": spec["run"],
        "dataset": spec["dataset"],
        "backbone": {"name": spec["backbone"], "fingerprint": checkpoint["backbone_fingerprint"]},
        "classes": checkpoint["classes"],
        "head_config": checkpoint["head_config"],
        "input_normalization": f"IQ float32 [N, 2, L]; {epoch['input_normalisation']}",
        "training": dict(spec["train"]),
        "selection": evidence,
    }
    if "labels" in epoch:  # label-scarce: how many train labels the head read
        card["labelled_rows"] = epoch["labels"]["labelled_rows"]
    return card
