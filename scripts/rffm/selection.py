"""Validation-based checkpoint selection into an immutable, content-addressed artifact."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from rffm import provenance
from rffm.config import selection_options
from rffm.errors import ConfigError
from rffm.files import atomic_write_bytes, atomic_write_json, canonical_json, read_json, sha256_bytes
from rffm.sentinel import file_record, require_intact, upstream, write_sentinel

ARTIFACT_DIR = "artifact"
READ_ONLY = 0o444


def choose(metrics_by_epoch: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any]:
    """The best epoch by metric and mode; ties go to the earliest epoch."""
    if not metrics_by_epoch:
        raise ConfigError("selection needs at least one epoch")
    if metric not in metrics_by_epoch[0]:
        raise ConfigError(f"runs.*.selection.metric: {metric!r} is not an epoch metric; choose one of {sorted(metrics_by_epoch[0])}")
    sign = 1 if mode == "max" else -1
    return max(sorted(metrics_by_epoch, key=lambda m: m["epoch"]), key=lambda m: (sign * m[metric], -m["epoch"]))


def artifact_name(sha256: str) -> str:
    return f"sha256-{sha256}.pt"


def select(spec: dict[str, Any], epoch_dirs: list[str | Path], out_dir: str | Path) -> Path:
    """Choose the best epoch, publish its weights as artifact/sha256-<hex>.pt with a model card."""
    out_dir = Path(out_dir)
    started = provenance.start()
    options = selection_options(spec)
    epoch_dirs = [Path(d) for d in epoch_dirs]
    inputs, candidates = {}, []
    for directory in epoch_dirs:
        body = require_intact(directory / "sentinel.json", ["metrics.json"], "select_checkpoint")
        inputs[f"epoch_{body['key']['epoch']}"] = upstream(directory / "sentinel.json", out_dir)
        candidates.append(read_json(directory / "metrics.json"))
    best = choose(candidates, options["metric"], options["mode"])
    chosen_dir = epoch_dirs[[c["epoch"] for c in candidates].index(best["epoch"])]
    require_intact(chosen_dir / "sentinel.json", ["checkpoint.pt"], "select_checkpoint")
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
    artifact_dir = out_dir / ARTIFACT_DIR
    artifact_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(artifact_dir / artifact_name(digest), blob, mode=READ_ONLY)
    evidence = {
        "metric": options["metric"],
        "mode": options["mode"],
        "epoch": best["epoch"],
        "value": best[options["metric"]],
        "candidates": [{"epoch": c["epoch"], options["metric"]: c[options["metric"]]} for c in candidates],
        "rule": "best value of the metric; ties go to the earliest epoch",
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
        "training": {k: v for k, v in spec["train"].items()},
        "selection": evidence,
    }
    atomic_write_bytes(artifact_dir / "model_card.json", canonical_json(card).encode(), mode=READ_ONLY)
    selection = {**evidence, "run": spec["run"], "artifact_sha256": digest, "artifact_path": f"{ARTIFACT_DIR}/{artifact_name(digest)}"}
    atomic_write_json(out_dir / "selection.json", selection)
    names = ["selection.json", f"{ARTIFACT_DIR}/{artifact_name(digest)}", f"{ARTIFACT_DIR}/model_card.json"]
    outputs = {name: file_record(out_dir / name) for name in names}
    provenance.finish(out_dir / "provenance.json", "select_checkpoint", started)
    extra = {"backbone_fingerprint": checkpoint["backbone_fingerprint"], "selection": selection}
    return write_sentinel(out_dir, "select_checkpoint", {"run": spec["run"]}, outputs, inputs, options, "selection", extra)
