"""`rffm release_immutable FOLDER...`, which `make clean` runs before `rm -rf results scratch .snakemake`: the
immutable flag cleared on everything under the folders, so that they can be removed.

Where the workflow runs as root it makes each ledger entry immutable (chattr +i; concepts.md, the test ledger), and
`rm -rf` of the tree then fails with "Operation not permitted". Nothing is removed here; each cleared entry is named.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from rffm.records.store import FS_IMMUTABLE_FL, inode_flags, set_immutable


def immutable_under(folder: Path) -> list[Path]:
    """Every file and folder under `folder`, itself included, whose immutable flag is set (links not followed)."""
    if folder.is_symlink() or not folder.is_dir():
        return []
    found = [folder] if inode_flags(folder) & FS_IMMUTABLE_FL else []
    for root, folders, files in os.walk(folder):
        found += [Path(root, name) for name in sorted(folders + files) if inode_flags(Path(root, name)) & FS_IMMUTABLE_FL]
    return found


def release_immutable(folders: Iterable[Path]) -> tuple[list[str], list[str]]:
    """(a line per entry whose immutable flag was cleared, an error line per entry whose flag this process may not clear)."""
    released, refused = [], []
    for path in (path for folder in folders for path in immutable_under(Path(folder))):
        if set_immutable(path, False):
            released.append(f"{path}: immutable flag cleared (chattr -i), so it can be removed")
        else:
            refused.append(
                f"{path}: immutable (chattr +i), and this process may not clear the flag (that needs root: "
                "CAP_LINUX_IMMUTABLE). Fix: run `make clean` as root"
            )
    return released, refused
