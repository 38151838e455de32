"""The sha256 a config pins for an imported backbone file: one line for a file that is not the pinned one, said the
same while planning (rffm.config.host) and by import_backbone (should the file change after the plan)."""

from __future__ import annotations

from pathlib import Path


def pin_problem(name: str, path: str | Path, actual: str, expected: str) -> str:
    """backbones.<name>.sha256: the file's digest, the pinned one, and the two ways out."""
    return (
        f"backbones.{name}.sha256: {path} has sha256 {actual}, config expects {expected}. "
        f"Fix: point backbones.{name}.path at the pinned file, or set backbones.{name}.sha256: {actual} if {path} is the "
        "file to import (which reruns everything built on that backbone)"
    )
