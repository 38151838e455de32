"""Self-supervised pretraining of the backbone on IQ only: segment contrastive (default) or masked-patch reconstruction."""

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

OBJECTIVES = ("segment_contrastive", "masked_patch", "masked_patch+contrastive")


def random_mask(batch: int, tokens: int, ratio: float, generator: torch.Generator) -> torch.Tensor:
    """Boolean [batch, tokens] with round(ratio * tokens) masked positions per row."""
    n_masked = max(1, int(round(tokens * ratio)))
    return torch.rand(batch, tokens, generator=generator).argsort(dim=1) < n_masked


def masked_patch_loss(
    model: backbone.IQPatchTransformer, decoder: nn.Module, iq: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """MSE of reconstructed (unit-RMS) patches at the masked token positions; also returns the hidden states."""
    hidden = model.hidden_states(iq, mask=mask)[-1]
    target = model.patchify(backbone.normalize(iq))
    return F.mse_loss(decoder(hidden[mask]), target[mask]), hidden


def channel_view(iq: torch.Tensor, generator: torch.Generator, max_shift: int) -> torch.Tensor:
    """A label-preserving random view: phase rotation, small CFO, circular time shift (per example), extra noise."""
    batch, _, length = iq.shape
    time = torch.arange(length)
    phase = 2 * math.pi * torch.rand(batch, 1, generator=generator)
    cfo = (torch.rand(batch, 1, generator=generator) - 0.5) * 2e-3
    angle = phase + 2 * math.pi * cfo * time
    cos, sin = torch.cos(angle), torch.sin(angle)
    i, q = iq[:, 0] * cos - iq[:, 1] * sin, iq[:, 0] * sin + iq[:, 1] * cos
    shift = torch.randint(0, max_shift, (batch, 1), generator=generator)
    rolled = (time - shift) % length
    noise = torch.stack([torch.randn(batch, length, generator=generator), torch.randn(batch, length, generator=generator)], dim=1)
    level = 0.3 * torch.rand(batch, 1, 1, generator=generator) / math.sqrt(2)
    return torch.stack([torch.gather(i, 1, rolled), torch.gather(q, 1, rolled)], dim=1) + level * noise


def contrastive_loss(first: torch.Tensor, second: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent between two views' projected embeddings (each row's positive is its other view)."""
    embeddings = F.normalize(torch.cat([first, second]), dim=1)
    similarity = embeddings @ embeddings.T / temperature
    similarity.fill_diagonal_(float("-inf"))
    count = first.shape[0]
    targets = torch.cat([torch.arange(count, 2 * count), torch.arange(count)])
    return F.cross_entropy(similarity, targets)


def token_halves(batch: int, tokens: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Two disjoint random halves of each row's token positions, as index tensors [batch, tokens // 2]."""
    order = torch.rand(batch, tokens, generator=generator).argsort(dim=1)
    half = tokens // 2
    return [order[:, :half], order[:, half : 2 * half]]


def segment_contrastive_loss(model, projector, iq, options, generator, device) -> torch.Tensor:
    """NT-Xent between two channel views of each example, each seen through a disjoint random half of its tokens.

    The halves share the modulation and the channel but not the symbols, so the pooled embedding learns what
    stays constant along a signal rather than what it carries.
    """
    embeddings = []
    for keep in token_halves(len(iq), model.arch.tokens, generator):
        view = channel_view(iq, generator, model.arch.patch).to(device)
        embeddings.append(projector(model.hidden_states(view, keep=keep.to(device))[-1].mean(dim=1)))
    return contrastive_loss(*embeddings, options["temperature"])


def pretraining_loss(model, decoder, projector, iq, options, generator, device=torch.device("cpu")) -> torch.Tensor:
    """The configured self-supervised objective (labels are never an input).

    Random draws come from a CPU generator (reproducible on any device); only the model runs on `device`.
    """
    tokens = model.arch.tokens

    def mask() -> torch.Tensor:
        return random_mask(len(iq), tokens, options["mask_ratio"], generator).to(device)

    if options["objective"] == "segment_contrastive":
        return segment_contrastive_loss(model, projector, iq, options, generator, device)
    if options["objective"] == "masked_patch":
        return masked_patch_loss(model, decoder, iq.to(device), mask())[0]
    views = [channel_view(iq, generator, model.arch.length // 4).to(device) for _ in range(2)]
    losses, embeddings = [], []
    for view in views:
        loss, hidden = masked_patch_loss(model, decoder, view, mask())
        losses.append(loss)
        embeddings.append(projector(hidden.mean(dim=1)))
    return sum(losses) / 2 + contrastive_loss(*embeddings, options["temperature"])


def epochs_to_run(options: dict[str, Any], examples: int) -> int:
    """The configured epochs, raised until pretraining takes at least `min_steps` optimizer steps (0 epochs stay 0).

    Measured on 1024-sample data (workflow/docs/performance.md): 84 steps left the features below their own random
    floor, 504 steps put them 7.6 points above it; the number of steps mattered, not the number of examples.
    """
    epochs = int(options["epochs"])
    steps_per_epoch = math.ceil(examples / options["batch_size"])
    if epochs == 0 or steps_per_epoch == 0:
        return epochs
    return max(epochs, math.ceil(options["min_steps"] / steps_per_epoch))


def pretrain_weights(
    arch: backbone.BackboneArch, iq: np.ndarray, options: dict[str, Any], device: torch.device | str = "cpu"
) -> tuple[backbone.IQPatchTransformer, list[float]]:
    """Self-supervised pretraining on IQ only (labels never seen); returns the model and the losses of the epochs run.

    `iq` may be a memory map (dataset.map_iq): each batch is gathered from it, so a train split larger
    than RAM pretrains without being loaded.
    """
    if options["objective"] not in OBJECTIVES:
        raise ConfigError(f"backbones.*.pretrain.objective: {options['objective']!r}; choose one of {OBJECTIVES}")
    if options["objective"] == "segment_contrastive" and arch.tokens < 2:
        raise ConfigError(f"backbones.*.pretrain: segment_contrastive needs at least 2 tokens (length / patch); got {arch.tokens}")
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
    epochs = epochs_to_run(options, len(iq))
    total = max(1, steps_per_epoch * epochs)
    warmup = max(1, total // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
    )
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    progress = Progress("pretrain_backbone", total=total, unit="batch")
    if epochs > options["epochs"]:
        progress.note(
            f"{options['epochs']} epochs of {steps_per_epoch} optimizer steps are fewer than min_steps {options['min_steps']}: "
            f"running {epochs} epochs"
        )
    for epoch in range(epochs):
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
        progress.note(f"epoch {epoch + 1}/{epochs}: {options['objective']} loss {losses[-1]:.4f}")
    progress.close()
    return model.cpu().eval(), losses
