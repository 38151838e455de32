"""Backbones brought by the user: a Python entry point plus a weights file (`python`), or a torch.export program (`export`).

`python`: `package.module:factory` (found on the config's import path, or installed) is called with
the configured keyword arguments and must return an nn.Module; its weights come from a safetensors
file or a torch state_dict loaded with weights_only=True (a pickle that holds code is refused),
optionally nested under a key. The fingerprint covers the weights (as tensors: the same weights as
.pth or .safetensors fingerprint alike), the entry point, its arguments and the source files of the
user's package, so editing the class reruns the import and what follows and touching it reruns nothing.

`export`: a `.pt2` ExportedProgram (torch.export.save); its outputs, in order, are the taps. A .pt2 is
trusted code: its loader may unpickle. Its fingerprint is the file's sha256.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rffm.backbone_kinds import EXPORT
from rffm.errors import ConfigError, IntegrityError, checked_yet_disagree
from rffm.model.backbone import hash_tensors
from rffm.model.usercode import import_path_fix, split_entry_point, user_source
from rffm.records.files import sha256_file, sha256_json


def factory(entry_point: str, import_path: str | None, where: str):
    """The user's factory function, imported (the import path first on sys.path)."""
    module_name, attr = split_entry_point(entry_point, where)
    added = import_path and str(Path(import_path).resolve())
    if added and added not in sys.path:
        sys.path.insert(0, added)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module failed to import: one line, their error named
        fix = f"Fix: make `import {module_name}` work."
        if isinstance(error, ModuleNotFoundError):  # theirs, or one theirs imports: found through python.import_path
            fix = import_path_fix(where, error.name or module_name)
        raise ConfigError(f"{where}.python.entry_point: importing {module_name} failed: {type(error).__name__}: {error}. {fix}") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise ConfigError(
            f"{where}.python.entry_point: {module_name} has no callable {attr!r}. Fix: name the function that returns the nn.Module."
        )
    return function


def construct(python: dict[str, Any], where: str) -> nn.Module:
    """factory(**kwargs), checked to be an nn.Module."""
    function = factory(python["entry_point"], python.get("import_path"), where)
    kwargs = python.get("kwargs", {})
    try:
        model = function(**kwargs)
    except Exception as error:
        raise ConfigError(
            f"{where}.python: {python['entry_point']}(**{kwargs}) raised {type(error).__name__}: {error}. "
            f"Fix: check python.kwargs against the factory."
        ) from None
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"{where}.python: {python['entry_point']} returned {type(model).__name__}, not a torch nn.Module. Fix: return the model."
        )
    return model


def read_weights(path: Path, key: str | None, where: str) -> dict[str, torch.Tensor]:
    """A state_dict from safetensors or a torch file (weights only), optionally nested under `key`."""
    with open(path, "rb") as handle:
        head = handle.read(8)
    is_torch = head.startswith(b"PK") or head[:1] == b"\x80"  # a torch zip file or a legacy pickle
    if not is_torch:
        from safetensors.torch import load_file

        try:
            blob: Any = load_file(str(path))
        except Exception as error:
            raise IntegrityError(
                f"{path}: neither a safetensors file nor a torch checkpoint ({type(error).__name__}). "
                f"Fix: point {where}.path at the weights file."
            ) from None
    else:
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # never unpickled with code: one line, no advice to do so
            raise IntegrityError(
                f"{path}: holds pickled objects other than tensors and plain values ({type(error).__name__}), so it is never loaded "
                "(it could run code). Fix: save only weights: torch.save(model.state_dict(), ...) or safetensors.torch.save_file."
            ) from None
    if key:
        if not isinstance(blob, dict) or key not in blob:
            keys = sorted(blob)[:8] if isinstance(blob, dict) else type(blob).__name__
            raise ConfigError(
                f"{where}.python.key: {path} has no key {key!r} (top-level keys: {keys}). "
                f"Fix: set python.key to the one holding the state_dict."
            )
        blob = blob[key]
    if not isinstance(blob, dict) or not all(isinstance(v, torch.Tensor) for v in blob.values()):
        raise ConfigError(
            f"{where}: {path} is not a state_dict (name -> tensor){' under ' + key if key else ''}. "
            f"Fix: set python.key to the nested state_dict (e.g. model)."
        )
    return dict(blob)


def load_state(model: nn.Module, state: dict[str, torch.Tensor], strict: bool, where: str, path: Path) -> dict[str, list[str]]:
    """Load the weights; in strict mode missing or unexpected names are an error naming them."""
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # shape mismatches
        first = str(error).strip().splitlines()[1:2] or [str(error)]
        detail = first[0].strip().rstrip(".")  # torch ends its line with a period
        raise ConfigError(
            f"{where}: {path} does not fit the model: {detail}. Fix: check python.kwargs (widths, depth) against the checkpoint."
        ) from None
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    if strict and (missing or unexpected):

        def some(names):
            return ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")

        raise ConfigError(
            f"{where}: {path} does not match {type(model).__name__} (strict): missing keys [{some(missing)}], unexpected keys "
            f"[{some(unexpected)}]. Fix: set python.key to the nested state_dict, check python.kwargs, or set python.strict: false."
        )
    return {"missing": missing, "unexpected": unexpected}


def tensors_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 of a state_dict's names, dtypes, shapes and bytes (independent of the file format)."""
    return hash_tensors(hashlib.sha256(), state).hexdigest()


def python_fingerprint(python: dict[str, Any], weights: str, source: str) -> str:
    return sha256_json({"entry_point": python["entry_point"], "kwargs": python.get("kwargs", {}), "weights": weights, "source": source})


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load_export(path: Path, where: str):
    """The module of a torch.export program (trusted code)."""
    try:
        return torch.export.load(str(path)).module()
    except Exception as error:
        raise IntegrityError(
            f"{path}: not a loadable torch.export program ({type(error).__name__}: {error}). "
            f"Fix: write it with torch.export.save(...) as .pt2."
        ) from None


def load(backbone: dict[str, Any], path: Path, where: str, device: torch.device | str = "cpu") -> tuple[nn.Module, str]:
    """A user backbone from its folder's backbone.pt and record, frozen, after checking it is what was imported."""
    kind = backbone["source"]
    if kind == EXPORT:
        if sha256_file(path) != backbone["fingerprint"]:
            raise checked_yet_disagree(f"{path}: sha256 differs from the fingerprint its import recorded")  # both vouched by its sentinel
        model = load_export(path, where)
        return model.to(device) if hasattr(model, "to") else model, backbone["fingerprint"]
    python = backbone["python"]
    source = user_source(python["entry_point"], python.get("import_path"), where)
    if source["sha256"] != backbone["user_source"]["sha256"]:
        raise IntegrityError(
            f"{where}: the source of {source['package']} changed since it was imported (the fingerprint covers it). "
            f"Fix: rerun snakemake, which imports it again."
        )
    blob = torch.load(path, map_location="cpu", weights_only=True)
    model = construct(python, where)
    load_state(model, blob["state_dict"], bool(python.get("strict", True)), where, path)
    actual = python_fingerprint(python, tensors_digest(blob["state_dict"]), source["sha256"])
    if actual != backbone["fingerprint"]:
        raise checked_yet_disagree(f"{path}: fingerprint {actual[:16]}… differs from the recorded {backbone['fingerprint'][:16]}…")
    model.requires_grad_(False)
    return model.eval().to(device), actual
