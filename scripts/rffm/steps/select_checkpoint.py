"""select_checkpoint: the best epoch by the validation metric, published as an immutable, content-addressed artifact."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from rffm.records.files import atomic_write_bytes, atomic_write_json, canonical_json, read_json, sha256_bytes
from rffm.records.layout import ARTIFACT_DIR, SENTINEL_NAME, artifact_name
from rffm.records.sentinel import require_intact
from rffm.records.step import Step
from rffm.training.selection import RULE_TEXT, choose

RULE = "select_checkpoint"
READ_ONLY = 0o444


def run(spec: dict[str, Any], epoch_dirs: list[str | Path], out_dir: str | Path) -> Path:
    """Choose the best epoch, publish its weights as artifact/sha256-<hex>.pt with a model card."""
    options = spec["selection"]
    with Step(RULE, out_dir, key={"run": spec["run"]}, params=options) as step:
        epoch_dirs = [Path(d) for d in epoch_dirs]
        candidates = []
        for directory in epoch_dirs:  # runs/<run>/epochs/<k>
            step.consume(f"epoch_{directory.name}", directory / SENTINEL_NAME, ["metrics.json"])
            candidates.append(read_json(directory / "metrics.json"))
        best = choose(candidates, options["metric"], options["mode"])
        chosen_dir = epoch_dirs[[c["epoch"] for c in candidates].index(best["epoch"])]
        require_intact(chosen_dir / SENTINEL_NAME, ["checkpoint.pt"], RULE)
        checkpoint = torch.load(chosen_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
        weights = {
            "format": "rffm-head-artifact/1",
            "classes": checkpoint["classes"],
            "backbone_fingerprint": checkpoint["backbone_fingerprint"],
            "head_config": checkpoint["head_config"],
            "head": checkpoint["head"],
        }
        buffer = io.BytesIO()
        torch.save(weights, buffer)
        blob = buffer.getvalue()
        digest = sha256_bytes(blob)
        artifact = f"{ARTIFACT_DIR}/{artifact_name(digest)}"
        atomic_write_bytes(step.out_dir / artifact, blob, mode=READ_ONLY)
        evidence = {
            "metric": options["metric"],
            "mode": options["mode"],
            "epoch": best["epoch"],
            "value": best[options["metric"]],
            "candidates": [{"epoch": c["epoch"], options["metric"]: c[options["metric"]]} for c in candidates],
            "rule": RULE_TEXT,
        }
        card = {
            "artifact": artifact_name(digest),
            "artifact_sha256": digest,
            "run": spec["run"],
            "dataset": spec["dataset"],
            "backbone": {"name": spec["backbone"], "fingerprint": checkpoint["backbone_fingerprint"]},
            "classes": checkpoint["classes"],
            "head_config": checkpoint["head_config"],
            "input_normalization": (
                "IQ float32 [N, 2, L]; per-example unit RMS inside the backbone; "
                "the head reads per-token hidden states rounded to BF16 and computes in FP32"
            ),
            "training": dict(spec["train"]),
            "selection": evidence,
        }
        atomic_write_bytes(step.out_dir / ARTIFACT_DIR / "model_card.json", canonical_json(card).encode(), mode=READ_ONLY)
        selection = {**evidence, "run": spec["run"], "artifact_sha256": digest, "artifact_path": artifact}
        atomic_write_json(step.out_dir / "selection.json", selection)
        for name in ("selection.json", artifact, f"{ARTIFACT_DIR}/model_card.json"):
            step.output(name)
        step.facts.update({"backbone_fingerprint": checkpoint["backbone_fingerprint"], "selection": selection})
    return step.sentinel
