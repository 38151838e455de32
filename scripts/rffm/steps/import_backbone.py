"""import_backbone: a user's backbone (an rffm checkpoint, a Python entry point + weights, or a torch.export program),
checked against the sha256 the config pins, loaded once, and kept in backbones/{name}/backbone.pt."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rffm.backbone_kinds import CHECKPOINT, EXPORT, PYTHON
from rffm.errors import ConfigError, IntegrityError
from rffm.model import backbone, foreign
from rffm.model.pins import pin_problem
from rffm.records.files import atomic_torch_save, atomic_write_json, commit_file, sha256_file, temporary_sibling
from rffm.records.layout import BACKBONE_NAME, PRETRAIN_LOG
from rffm.records.step import Step

RULE = "import_backbone"


def checked_source(spec: dict[str, Any]) -> tuple[Path, str]:
    """The configured file, after checking it exists and has the pinned sha256."""
    source = Path(spec["path"])
    if not source.exists():
        raise ConfigError(f"backbones.{spec['name']}.path: {source} does not exist")
    actual = sha256_file(source)
    if actual != spec["sha256"]:  # planning refused this already, unless the file changed since
        raise IntegrityError(pin_problem(spec["name"], source, actual, spec["sha256"]))
    return source, actual


def copy_in(source: Path, target: Path) -> None:
    tmp = temporary_sibling(target)
    shutil.copyfile(source, tmp)
    commit_file(tmp, target)


def import_python(spec: dict[str, Any], source: Path, target: Path) -> dict[str, Any]:
    """Build the user's model, load its weights (strict unless told), save the loaded state; the backbone record."""
    where = f"backbones.{spec['name']}"
    python = spec["python"]
    state = foreign.read_weights(source, python.get("key"), where)
    model = foreign.construct(python, where)
    keys = foreign.load_state(model, state, bool(python.get("strict", True)), where, source)
    loaded = {name: tensor.detach().cpu().clone().contiguous() for name, tensor in model.state_dict().items()}
    code = foreign.user_source(python["entry_point"], python.get("import_path"), where)
    print_ = foreign.python_fingerprint(python, foreign.tensors_digest(loaded), code["sha256"])
    atomic_torch_save(target, {"state_dict": loaded, "fingerprint": print_})
    return {
        "fingerprint": print_,
        "python": {key: python[key] for key in ("entry_point", "kwargs", "import_path", "key", "strict") if key in python},
        "user_source": code,
        "parameters": foreign.parameter_count(model),
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "keys_not_loaded": keys,
    }


def import_export(spec: dict[str, Any], source: Path, target: Path, digest: str) -> dict[str, Any]:
    """Check the program loads, then keep its bytes; the backbone record."""
    model = foreign.load_export(source, f"backbones.{spec['name']}")
    copy_in(source, target)
    return {"fingerprint": digest, "parameters": foreign.parameter_count(model) if hasattr(model, "parameters") else None}


def run(spec: dict[str, Any], out_dir: str | Path) -> Path:
    """Import the configured backbone into out_dir (backbone.pt, pretrain_log.json, sentinel)."""
    kind = spec.get("source", CHECKPOINT)
    with Step(RULE, out_dir, key={"backbone": spec["name"]}, params=spec) as step:
        source, actual = checked_source(spec)
        target = step.out_dir / BACKBONE_NAME
        record: dict[str, Any] = {"name": spec["name"], "source": kind}
        if kind == PYTHON:
            record.update(import_python(spec, source, target))
        elif kind == EXPORT:
            record.update(import_export(spec, source, target, actual))
        else:
            model = backbone.load(source)
            copy_in(source, target)
            record.update({"fingerprint": model.fingerprint, "arch": asdict(model.arch)})
        atomic_write_json(step.out_dir / PRETRAIN_LOG, {"imported_from_sha256": actual})
        step.output(BACKBONE_NAME)
        step.output(PRETRAIN_LOG)
        step.facts["backbone"] = record
    return step.sentinel
