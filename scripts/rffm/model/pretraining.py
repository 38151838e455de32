"""Self-supervised pretraining of the backbone on IQ only: masked-patch reconstruction, plus agreement of channel views."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rffm.errors import ConfigError
from rffm.model import backbone
from rffm.runtime.progress import Progress

OBJECTIVES = ("masked_patch", "masked_patch+contrastive")


def random_mask(batch: int, tokens: int, ratio: float, generator: torch.Generator) -> torch.Tensor:
    """Boolean [batch, tokens] with round(ratio * tokens) masked positions per row."""
    n_masked = max(1, int(round(tokens * ratio)))
    return torch.rand(batch, tokens, generator=generator).argsort(dim=1) < n_masked


def masked_patch_loss(
    model: backbone.IQPatchTransformer, decoder: nn.Module, iq: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """MSE of reconstructed (unit-RMS) patches at the masked token positions; also returns the hidden states."""
    hidden = model(iq, mask=mask)
    target = model.patchify(backbone.normalize(iq))
    return F.mse_loss(decoder(hidden[mask]), target[mask]), hidden


def channel_view(iq: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A label-preserving random view: phase rotation, small CFO, time shift, extra noise."""
    batch, _, length = iq.shape
    signal = torch.complex(iq[:, 0], iq[:, 1])
    phase = 2 * math.pi * torch.rand(batch, 1, generator=generator)
    cfo = (torch.rand(batch, 1, generator=generator) - 0.5) * 2e-3
    signal = signal * torch.exp(1j * (phase + 2 * math.pi * cfo * torch.arange(length)))
    signal = torch.roll(signal, int(torch.randint(0, length // 4, (1,), generator=generator)), dims=1)
    noise = torch.complex(torch.randn(batch, length, generator=generator), torch.randn(batch, length, generator=generator))
    signal = signal + 0.3 * torch.rand(batch, 1, generator=generator) * noise / math.sqrt(2)
    return torch.stack([signal.real, signal.imag], dim=1).float()


def contrastive_loss(first: torch.Tensor, second: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent between two views' projected embeddings (each row's positive is its other view)."""
    embeddings = F.normalize(torch.cat([first, second]), dim=1)
    similarity = embeddings @ embeddings.T / temperature
    similarity.fill_diagonal_(float("-inf"))
    count = first.shape[0]
    targets = torch.cat([torch.arange(count, 2 * count), torch.arange(count)])
    return F.cross_entropy(similarity, targets)


def pretraining_loss(model, decoder, projector, iq, options, generator, device=torch.device("cpu")) -> torch.Tensor:
    """Masked-patch reconstruction, plus (by default) agreement between two masked channel views.

    Random draws come from a CPU generator (reproducible on any device); only the model runs on `device`.
    """
    tokens = model.arch.tokens

    def mask() -> torch.Tensor:
        return random_mask(len(iq), tokens, options["mask_ratio"], generator).to(device)

    if options["objective"] == "masked_patch":
        return masked_patch_loss(model, decoder, iq.to(device), mask())[0]
    views = [channel_view(iq, generator).to(device) for _ in range(2)]
    losses, embeddings = [], []
    for view in views:
        loss, hidden = masked_patch_loss(model, decoder, view, mask())
        losses.append(loss)
        embeddings.append(projector(hidden.mean(dim=1)))
    return sum(losses) / 2 + contrastive_loss(*embeddings, options["temperature"])


def pretrain_weights(
    arch: backbone.BackboneArch, iq: np.ndarray, options: dict[str, Any], device: torch.device | str = "cpu"
) -> tuple[backbone.IQPatchTransformer, list[float]]:
    """Masked-patch reconstruction on IQ only (labels never seen); returns the model and epoch losses.

    `iq` may be a memory map (dataset.map_iq): each batch is gathered from it, so a train split larger
    than RAM pretrains without being loaded.
    """
    if options["objective"] not in OBJECTIVES:
        raise ConfigError(f"backbones.*.pretrain.objective: {options['objective']!r}; choose one of {OBJECTIVES}")
    seed = int(options["seed"])
    model = backbone.build(arch, seed)
    torch.manual_seed(seed)
    decoder = nn.Linear(arch.dim, 2 * arch.patch)
    projector = nn.Sequential(nn.Linear(arch.dim, arch.dim), nn.GELU(), nn.Linear(arch.dim, 64))
    device = torch.device(device)
    for module in (model, decoder, projector):
        module.to(device)
    params = list(model.parameters()) + list(decoder.parameters()) + list(projector.parameters())
    optimizer = torch.optim.AdamW(params, lr=options["lr"], weight_decay=options["weight_decay"])
    steps_per_epoch = math.ceil(len(iq) / options["batch_size"])
    total = max(1, steps_per_epoch * options["epochs"])
    warmup = max(1, total // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
    )
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    progress = Progress("pretrain_backbone", total=total, unit="batch")
    for epoch in range(options["epochs"]):
        order = torch.randperm(len(iq), generator=generator).numpy()
        running, count = 0.0, 0
        for start in range(0, len(iq), options["batch_size"]):
            batch = torch.from_numpy(np.ascontiguousarray(iq[order[start : start + options["batch_size"]]], np.float32))
            loss = pretraining_loss(model, decoder, projector, batch, options, generator, device)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            running += loss.item() * len(batch)
            count += len(batch)
            progress.update(1, loss=f"{loss.item():.4f}")
        losses.append(running / count)
        progress.note(f"epoch {epoch + 1}/{options['epochs']}: {options['objective']} loss {losses[-1]:.4f}")
    progress.close()
    return model.cpu().eval(), losses
