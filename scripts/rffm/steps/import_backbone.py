"""import_backbone: a user's backbone checkpoint, checked against the sha256 the config pins, copied into backbones/{name}."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rffm.errors import ConfigError, IntegrityError
from rffm.model import backbone
from rffm.records.files import atomic_write_json, commit_file, sha256_file, temporary_sibling
from rffm.records.step import Step

RULE = "import_backbone"


def run(spec: dict[str, Any], out_dir: str | Path) -> Path:
    """Copy the checkpoint after checking its sha256 and loading it (fingerprint and shape checks)."""
    source = Path(spec["path"])
    with Step(RULE, out_dir, key={"backbone": spec["name"]}, params=spec) as step:
        if not source.exists():
            raise ConfigError(f"backbones.{spec['name']}.path: {source} does not exist")
        actual = sha256_file(source)
        if actual != spec["sha256"]:
            raise IntegrityError(
                f"backbones.{spec['name']}: {source} has sha256 {actual}, config expects {spec['sha256']}. "
                "Fix: point `path` at the intended file, or update `sha256` if the new file is intended."
            )
        model = backbone.load(source)
        tmp = temporary_sibling(step.out_dir / "backbone.pt")
        shutil.copyfile(source, tmp)
        commit_file(tmp, step.out_dir / "backbone.pt")
        atomic_write_json(step.out_dir / "pretrain_log.json", {"imported_from_sha256": actual})
        step.output("backbone.pt")
        step.output("pretrain_log.json")
        arch = asdict(model.arch)
        step.facts["backbone"] = {"name": spec["name"], "source": "checkpoint", "fingerprint": model.fingerprint, "arch": arch}
    return step.sentinel
