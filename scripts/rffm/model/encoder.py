"""One interface for every backbone kind: staged IQ [B, 2, L] -> the cached features, one tensor per tap.

Kinds: `pretrain`, `random`, `checkpoint` (the in-workflow IQPatchTransformer, rffm.model.backbone),
`python` (a user's `package.module:factory` and its weights, rffm.model.foreign) and `export` (a
torch.export program). Whatever the kind, `Encoder.features` is what build_cache caches and what
qualify recomputes on the test split (and what export traces): the input adapter (normalisation,
layout, length), the taps (forward hooks on named modules, a method returning per-layer tensors, or
the model's outputs), their form ([B, T, D], [B, D, T] or pooled [B, D]) and the keep option
(all tokens, the prefix tokens, the mean, prefix + mean, or every k-th token).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rffm.backbone_kinds import NATIVE
from rffm.errors import ConfigError
from rffm.model import taps as taps_facts
from rffm.model.taps import FORMS, KEEP, LAYOUTS, keep_options, kept_count, row_shape, spec_for  # noqa: F401 (the encoder's vocabulary)
from rffm.records.files import sha256_json


def fingerprint(backbone_fingerprint: str, spec: dict[str, Any]) -> str:
    """The encoder's identity: the model's fingerprint and how it is called and read."""
    return sha256_json({"backbone": backbone_fingerprint, "spec": spec})


# ---- the input adapter ----


def adapt(iq: torch.Tensor, adapter: dict[str, Any]) -> torch.Tensor:
    """Staged IQ [B, 2, L] float32 -> what the model takes (normalised, in its layout)."""
    how = adapter["normalize"]
    if how == "rms":
        iq = iq / iq.pow(2).sum(dim=1, keepdim=True).mean(dim=2, keepdim=True).sqrt().clamp_min(1e-12)
    elif how == "peak":
        iq = iq / iq.pow(2).sum(dim=1, keepdim=True).sqrt().amax(dim=2, keepdim=True).clamp_min(1e-12)
    layout = adapter["layout"]
    if layout == "samples":
        return iq.transpose(1, 2).contiguous()
    if layout == "antenna":
        return iq.unsqueeze(2)
    if layout == "complex":
        return torch.complex(iq[:, 0], iq[:, 1])
    return iq


def length_problem(where: str, adapter: dict[str, Any], length: int | None, data_length: int | None, dataset: str) -> str | None:
    """One line when the dataset's example length is not the length the backbone takes (None when they agree or one is unknown)."""
    if length is None or data_length is None or length == data_length:
        return None
    return (
        f"{where}: the backbone takes IQ of length {length} but dataset {dataset} has examples of length {data_length}. "
        f"Fix: use a dataset of length {length} (e.g. datasets.{dataset}.synthetic.length), or a backbone built for {data_length} samples."
    )


# ---- the keep option ----


def keep_tokens(hidden: torch.Tensor, prefix: int, keep: str) -> torch.Tensor:
    """[B, T, D] -> [B, T', D] under a keep option (T' = kept_count)."""
    head, body = hidden[:, :prefix], hidden[:, prefix:]
    if keep == "all":
        return hidden
    if keep == "prefix":
        return head
    if keep == "mean":
        return body.mean(dim=1, keepdim=True)
    if keep == "prefix+mean":
        return torch.cat([head, body.mean(dim=1, keepdim=True)], dim=1)
    return torch.cat([head, body[:, :: int(keep.split(":")[1])]], dim=1)


# ---- the encoder ----


@dataclass
class Encoder:
    """A frozen backbone behind its adapter and taps; `features` is the one way it is called."""

    model: nn.Module | Any
    fingerprint: str  # of the model (weights, entry point, arguments, user source)
    spec: dict[str, Any]
    where: str  # config path for messages, e.g. backbones.wavesfm
    native_layers: int | None = None  # rffm IQPatchTransformer: its output_layers (the default taps)
    length: int | None = None  # input length the model was built for, when it says

    @property
    def identity(self) -> str:
        return fingerprint(self.fingerprint, self.spec)

    def raw_taps(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        """The tapped hidden states as the model gives them (how it is tapped: the spec's tap config)."""
        tap_config = self.spec["taps"]
        if self.native_layers is not None and not tap_config.get("modules") and not tap_config.get("method"):
            return self.model.hidden_states(inputs)[-self.native_layers :]
        if tap_config.get("modules"):
            return self.hooked(inputs, tap_config["modules"])
        if tap_config.get("method"):
            method = getattr(self.model, tap_config["method"], None)
            if not callable(method):
                raise ConfigError(
                    f"{self.where}.taps.method: {type(self.model).__name__} has no method {tap_config['method']!r}. "
                    f"Fix: name a method that returns the per-layer tensors."
                )
            outputs = method(inputs)
        else:
            outputs = self.model(inputs)
        outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
        select = tap_config.get("select")
        if select is None:
            return outputs
        try:
            return [outputs[index] for index in select]
        except IndexError:
            raise ConfigError(
                f"{self.where}.taps.select: {select} but the model gives {len(outputs)} outputs. Fix: select indices below {len(outputs)}."
            ) from None

    def hooked(self, inputs: torch.Tensor, names: list[str]) -> list[torch.Tensor]:
        """Outputs of named submodules, captured by forward hooks during one forward pass."""
        captured: dict[str, torch.Tensor] = {}
        handles = []
        for name in names:
            try:
                module = self.model.get_submodule(name)
            except AttributeError:
                known = [n for n, _ in self.model.named_children()]
                raise ConfigError(
                    f"{self.where}.taps.modules: {type(self.model).__name__} has no module {name!r} (its top-level modules: "
                    f"{', '.join(known)}). Fix: name modules as model.named_modules() prints them, e.g. blocks.3."
                ) from None
            handles.append(
                module.register_forward_hook(
                    lambda _m, _i, out, name=name: captured.__setitem__(name, out[0] if isinstance(out, tuple) else out)
                )
            )
        try:
            self.model(inputs)
        finally:
            for handle in handles:
                handle.remove()
        missing = [name for name in names if name not in captured]
        if missing:
            raise ConfigError(
                f"{self.where}.taps.modules: {missing[0]!r} never ran in a forward pass. Fix: tap modules the forward pass calls."
            )
        return [captured[name] for name in names]

    def features(self, iq: torch.Tensor) -> list[torch.Tensor]:
        """Staged IQ [B, 2, L] -> one [B, T_i, D_i] tensor per tap, after the keep option (the cached features)."""
        if self.length is not None and iq.shape[-1] != self.length:
            raise ConfigError(
                f"{self.where}: the backbone takes IQ of length {self.length}, got {iq.shape[-1]}. "
                f"Fix: use a dataset of length {self.length}."
            )
        tap_config = self.spec["taps"]
        form, prefix = tap_config["form"], int(tap_config["prefix"])
        out = []
        for index, hidden in enumerate(self.raw_taps(adapt(iq, self.spec["adapter"]))):
            want = 2 if form == "pooled" else 3
            if not isinstance(hidden, torch.Tensor) or hidden.dim() != want or hidden.shape[0] != iq.shape[0]:
                shape = list(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
                name = self.tap_names(index + 1)[index]
                raise ConfigError(
                    f"{self.where}.taps: tap {name!r} gives {shape} for a batch of {iq.shape[0]}, not the declared "
                    f"form {form} {FORMS[form]}. "
                    f"Fix: set taps.form to tokens [B, T, D], channels [B, D, T] or pooled [B, D], or tap another module."
                )
            if form == "pooled":
                out.append(hidden.unsqueeze(1).float())
                continue
            if form == "channels":
                hidden = hidden.transpose(1, 2)
            out.append(keep_tokens(hidden.float(), prefix, self.spec["keep"]))
        return out

    def tap_names(self, count: int) -> list[str]:
        """How the `count` taps are named in records and messages: module names, or output indices."""
        return taps_facts.tap_names(self.spec["taps"], count)

    def tap_shapes(self, length: int) -> list[tuple[int, int]]:
        """(tokens, width) of every cached tap, from one probe batch of `length` samples."""
        with torch.no_grad():
            device = next((p.device for p in self.model.parameters()), torch.device("cpu")) if isinstance(self.model, nn.Module) else "cpu"
            probe = torch.randn(2, 2, length, generator=torch.Generator().manual_seed(0)).to(device)
            return [(int(f.shape[1]), int(f.shape[2])) for f in self.features(probe)]


def as_row(features: list[torch.Tensor]) -> torch.Tensor:
    """Per-tap features -> one batch of cache rows [B, *row_shape]."""
    if len(features) == 1:
        return features[0]
    if len({tuple(f.shape[1:]) for f in features}) == 1:
        return torch.stack(features, dim=1)
    return torch.cat([f.reshape(f.shape[0], -1) for f in features], dim=1)


def load(backbone: dict[str, Any], path: Path, spec: dict[str, Any], where: str, device: torch.device | str = "cpu") -> Encoder:
    """The encoder of a backbone folder: `backbone` is its sentinel's record, `path` its backbone.pt, `spec` from spec_for."""
    from rffm.model import backbone as native
    from rffm.model import foreign

    kind = backbone["source"]
    if kind in NATIVE:
        model = native.load(path, device)
        return Encoder(model, model.fingerprint, spec, where, native_layers=model.arch.output_layers, length=model.arch.length)
    model, print_ = foreign.load(backbone, path, where, device)
    return Encoder(model, print_, spec, where, length=spec["adapter"].get("length"))
