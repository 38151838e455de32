"""Where a rule's configured input files are on the machine that runs it (used by the workflow's rules)."""

from __future__ import annotations

from collections.abc import Iterable


def source_root(local: str | Iterable[str], configured: Iterable[str]) -> str:
    """'.', or the folder a storage provider (the bucket on Google Batch) downloaded the configured files into.

    `local` are the job's input paths as Snakemake gives them on this machine, `configured` the same
    files as the config names them (relative paths). A step resolves its relative source paths in the
    returned folder; its params, and so its sentinel, keep the configured paths.
    """
    local = [local] if isinstance(local, str) else list(local)
    for here, named in zip(map(str, local), map(str, configured), strict=False):
        if here != named and here.endswith(f"/{named}"):
            return here[: -len(named)]
    return "."
