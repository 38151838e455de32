"""pretrain_backbone: a backbone built here, pretrained on a staged train split's IQ (labels unused) or randomly initialized."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from rffm.backbone_kinds import PRETRAIN, RANDOM
from rffm.data.splits import map_iq
from rffm.model import backbone
from rffm.records.files import atomic_write_json
from rffm.records.layout import BACKBONE_NAME, PRETRAIN_LOG, SENTINEL_NAME, split_file
from rffm.records.step import Step
from rffm.training.pretraining import pretrain_weights

RULE = "pretrain_backbone"


def run(spec: dict[str, Any], dataset_dir: str | Path, out_dir: str | Path, *, device: str = "cpu", threads: int | None = None) -> Path:
    """Build backbones/{name}: backbone.pt (weights + fingerprint) and pretrain_log.json."""
    dataset_dir = Path(dataset_dir)
    options = spec["pretrain"]
    with Step(RULE, out_dir, key={"backbone": spec["name"]}, params=spec, threads=threads) as step:
        step.consume("dataset", dataset_dir / SENTINEL_NAME, [split_file("train")])
        train_iq = map_iq(dataset_dir / split_file("train"))  # the IQ only: pretraining cannot see labels
        arch = backbone.BackboneArch(length=int(train_iq.shape[-1]), **spec["arch"])
        if spec["source"] == RANDOM:
            model, losses = backbone.build(arch, int(options["seed"])).eval(), []
        else:
            step.device = torch.device(device)
            model, losses = pretrain_weights(arch, train_iq, options, device)
        info = {"source": spec["source"], "name": spec["name"], "pretrain": options if spec["source"] == PRETRAIN else None}
        fingerprint = backbone.save(step.out_dir / BACKBONE_NAME, model, info)
        atomic_write_json(step.out_dir / PRETRAIN_LOG, {"loss_by_epoch": losses, "epochs_run": len(losses), "options": options})
        step.output(BACKBONE_NAME)
        step.output(PRETRAIN_LOG)
        step.facts["backbone"] = {"name": spec["name"], "source": spec["source"], "fingerprint": fingerprint, "arch": asdict(arch)}
    return step.sentinel
