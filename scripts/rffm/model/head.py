"""The trainable classifier head over frozen hidden states: any number of taps, tokens and widths.

A cache row (rffm.data.cache_format) is [T, D] (one tap), [k, T, D] (k taps of one shape) or, when the taps
differ in tokens or width, [F]: the taps' [T_i, D_i] states flattened and concatenated in tap order.
`build` makes the head for a cache record; `from_record` / `config_record` load and save its config.
A head may read only some of the row's taps (train.head.taps): it is still fed whole rows and picks
its taps itself, so qualification, export and predict need nothing but its config record.
With a tail (train.tail: tail adaptation) the head also holds the backbone's last k blocks and final norm, copied
from the backbone at epoch 1 and trained with it, and runs them on the cached input of the first of them: the
cache stays what it was (the prefix frozen, computed once) and the exported classifier holds the adapted tail.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from rffm.errors import ConfigError

SAVED_SHAPES = "taps"  # the key HeadConfig.tap_shapes is saved under in checkpoints and artifacts (their bytes keep it)


@dataclass(frozen=True)
class HeadConfig:
    """Attention-pooling + MLP head shape; `layers` > 1 mixes that many cached taps first.

    `hidden` and `dropout` come from the schema-filled `train.head` (defaults live only in the config schema);
    `tap_shapes` ((tokens, width) per tap, saved under the key `taps`) is set only for flat rows [F] of taps that
    differ in shape; `read` (positions of the row's taps, in row order) only when the head reads some of them
    (`layers` then counts those it reads).
    """

    dim: int
    classes: int
    hidden: int
    dropout: float
    layers: int
    tap_shapes: tuple[tuple[int, int], ...] | None = None  # a row layout, not a setting: None = uniform [T, D] / [k, T, D] rows
    read: tuple[int, ...] | None = None  # None = every tap of the row
    tail: tuple[int, int, int, int] | None = None  # (blocks, row tap it reads, heads, mlp_ratio); None = no tail


class AttentionPoolHead(nn.Module):
    """Learned softmax mix of taps, then attention pooling over tokens concatenated with mean pooling, then an MLP."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        if config.layers > 1:
            self.layer_weights = nn.Parameter(torch.zeros(config.layers))
            self.layer_norm = nn.LayerNorm(config.dim)
        self.norm = nn.LayerNorm(config.dim)
        self.score = nn.Linear(config.dim, 1)
        self.mlp = nn.Sequential(
            nn.Linear(2 * config.dim, config.hidden),
            nn.GELU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.hidden, config.classes),
        )
        if config.tap_shapes:  # taps narrower than the widest are projected to it (created last: a uniform head's init is unchanged)
            self.project = nn.ModuleList(
                nn.Identity() if width == config.dim else nn.Linear(width, config.dim) for _, width in self.read_shapes()
            )
        if config.tail:  # created last too; its weights are the backbone's (rffm.training.epoch.adapt_tail)
            from rffm.model.backbone import Block

            blocks, _, heads, mlp_ratio = config.tail
            self.tail = nn.ModuleList(Block(config.dim, heads, mlp_ratio) for _ in range(blocks))
            self.tail_norm = nn.LayerNorm(config.dim)

    def read_shapes(self) -> list[tuple[int, int]]:
        """(tokens, width) of the flat row's taps this head reads."""
        shapes = self.config.tap_shapes
        return [shape for index, shape in enumerate(shapes) if self.config.read is None or index in self.config.read]

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """[B, F] -> one [B, T_i, dim] per tap read (projected to the common width)."""
        starts = [0]
        shapes = self.config.tap_shapes
        for tokens, width in shapes:
            starts.append(starts[-1] + tokens * width)
        read = range(len(shapes)) if self.config.read is None else self.config.read
        return [
            project(flat[:, starts[index] : starts[index + 1]].view(-1, *shapes[index]))
            for index, project in zip(read, self.project, strict=True)
        ]

    def mix(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, layers, T, D] (or [B, F] of differing taps) -> [B, T', D]: each tap normalized, weighted by a learned softmax."""
        if self.config.tap_shapes:
            parts = self.split(hidden)
            if len(parts) == 1:
                return parts[0]
            weights = torch.softmax(self.layer_weights, dim=0)
            if len({part.shape[1] for part in parts}) == 1:  # one token count: a weighted sum, as for stacked taps
                return (self.layer_norm(torch.stack(parts, dim=1)) * weights.view(1, -1, 1, 1)).sum(dim=1)
            return torch.cat(
                [self.layer_norm(part) * weight for part, weight in zip(parts, weights, strict=True)], dim=1
            )  # tokens side by side
        if self.config.read is not None:  # stacked rows [B, k, T, D]: the taps read
            hidden = hidden[:, self.config.read[0]] if self.config.layers == 1 else hidden[:, list(self.config.read)]
        if self.config.layers == 1:
            return hidden
        weights = torch.softmax(self.layer_weights, dim=0).view(1, -1, 1, 1)
        return (self.layer_norm(hidden) * weights).sum(dim=1)

    def run_tail(self, hidden: torch.Tensor) -> torch.Tensor:
        """The cached input of the tail's first block ([B, T, D], or tap `source` of [B, layers, T, D]) -> the tail's output."""
        _, source, _, _ = self.config.tail
        hidden = hidden[:, source] if hidden.dim() == 4 else hidden
        for block in self.tail:
            hidden = block(hidden)
        return self.tail_norm(hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, T, D], [B, layers, T, D] or [B, F] FP32 hidden states (a cache row, batched) -> [B, classes] logits."""
        hidden = self.norm(self.run_tail(hidden) if self.config.tail else self.mix(hidden))
        weights = torch.softmax(self.score(hidden), dim=1)
        pooled = torch.cat([(weights * hidden).sum(dim=1), hidden.mean(dim=1)], dim=-1)
        return self.mlp(pooled)


def read_positions(names: list[str] | None, cache: dict[str, Any]) -> tuple[int, ...] | None:
    """Positions (row order) of the taps a head reads (train.head.taps: their names) in a cache's tap layout; None when
    every tap is read."""
    if names is None:
        return None
    cached = [tap["name"] for tap in tap_layout(cache)]
    if sorted(set(names)) == sorted(cached):
        return None
    unknown = [name for name in names if name not in cached]
    if unknown or len(set(names)) != len(names) or not names:
        raise ConfigError(
            f"train.head.taps: {names} is not a list of distinct taps of this cache (its taps: {cached}). "
            f"Fix: name taps the backbone's cache holds, each once."
        )
    return tuple(index for index, name in enumerate(cached) if name in names)


def build(options: dict[str, Any], cache: dict[str, Any], tail: tuple[int, int, int, int] | None = None) -> AttentionPoolHead:
    """The head for a cache record's `cache` block (or the node-local cache's meta.json): its row shape and tap layout;
    `options` = train.head; `tail`: tail_shape's, for tail adaptation."""
    row = cache["shapes"]["train"][1:]
    if tail is not None:  # the tail's output alone: train.head.taps has nothing to choose
        options = {key: value for key, value in options.items() if key != "taps"}
        return AttentionPoolHead(HeadConfig(dim=row[-1], classes=len(cache["classes"]), layers=1, tail=tail, **options))
    classes = len(cache["classes"])
    options = dict(options)
    read = read_positions(options.pop("taps", None), cache)  # train.head.taps: the names of the taps it reads
    if len(row) == 1:  # flat row of taps that differ in shape
        shapes = tuple((int(tap["tokens"]), int(tap["dim"])) for tap in tap_layout(cache))
        widths = [dim for index, (_, dim) in enumerate(shapes) if read is None or index in read]
        config = HeadConfig(dim=max(widths), classes=classes, layers=len(widths), tap_shapes=shapes, read=read, **options)
    else:
        layers = len(read) if read is not None else row[0] if len(row) == 3 else 1
        config = HeadConfig(dim=row[-1], classes=classes, layers=layers, read=read, **options)
    return AttentionPoolHead(config)


def tap_layout(cache: dict[str, Any]) -> list[dict[str, Any]]:
    """A cache's tap layout: {name, tokens, dim} per tap in row order (its record's and meta.json's key `taps`)."""
    return cache["taps"]


def config_record(config: HeadConfig) -> dict[str, Any]:
    """The config as saved in checkpoints and artifacts: `tap_shapes` under the key `taps` and `read`, each only when set
    (so uniform heads save what they always did)."""
    record = asdict(config)
    shapes, read, tail = record.pop("tap_shapes"), record.pop("read"), record.pop("tail")
    if shapes is not None:
        record[SAVED_SHAPES] = [list(shape) for shape in shapes]
    if read is not None:
        record["read"] = list(read)
    if tail is not None:
        record["tail"] = list(tail)
    return record


def from_record(record: dict[str, Any]) -> AttentionPoolHead:
    """A head (untrained) from a saved config record."""
    record = dict(record)
    shapes, read, tail = record.pop(SAVED_SHAPES, None), record.pop("read", None), record.pop("tail", None)
    return AttentionPoolHead(
        HeadConfig(
            **record,
            tap_shapes=tuple(tuple(s) for s in shapes) if shapes else None,
            read=tuple(read) if read else None,
            tail=tuple(tail) if tail else None,
        )
    )
