"""The node-local hidden-state cache: where it lives, and making sure it is there.

The cache is never a workflow file: `<scratch>/<dataset>__<backbone>/` holds the files and a sealed
sentinel naming the recipe it was built from (the digests of the dataset and backbone sentinels and of
the build code, recorded in results by build_cache). Whoever needs it and does not find it (build_cache,
or an epoch on a fresh node or VM) builds it into a temporary directory and renames it into place, so a
half-built cache is never seen; a cache of another recipe is replaced. Readers check every byte against
the sentinel before an epoch reads it (cache_reader.open_cache).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rffm.data.cache_format import built_recipe, recipe
from rffm.data.cache_plan import cache_meta, human_bytes, meta_bytes, row_cache_bytes
from rffm.data.cache_writer import build
from rffm.errors import ConfigError, IntegrityError
from rffm.records.files import sha256_file
from rffm.records.layout import BACKBONE_NAME, CACHED_SPLITS, split_file
from rffm.records.sentinel import require_intact
from rffm.runtime.profiling import PhaseTimes


def check_disk_budget(directory: Path, needed: int, headroom: float) -> None:
    """Refuse to start unless the scratch filesystem has headroom x the cache size free."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < headroom * needed:
        raise ConfigError(
            f"not enough free space for the hidden-state cache in {directory}: need {headroom}x "
            f"{needed} bytes ({human_bytes(needed)}) = {int(headroom * needed)} bytes ({human_bytes(headroom * needed)}), "
            f"free {free} bytes ({human_bytes(free)}). Fix: free space, point `scratch` (or "
            "--hidden-state-cache-directory) at a larger local disk, or lower `cache.disk_headroom` "
            "(0 disables the check) if you know the cache fits."
        )


def local_dir(scratch: str | Path, key: dict[str, str]) -> Path:
    """Where the cache of a (dataset, backbone) lives on a node."""
    return Path(scratch) / f"{key['dataset']}__{key['backbone']}"


def materialize(local_dir: Path, recipe_digest: str, build_into) -> dict[str, Any] | None:
    """Make sure `local_dir` holds the cache of this recipe: build it (via `build_into(directory)`) when it is
    missing or of another recipe; the build's stats, None when a ready cache was found."""
    local_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(local_dir.parent / f".{local_dir.name}.lock", "a") as lock:
        try:  # one builder per node at a time; the rename below keeps concurrent builders on other nodes safe
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            pass
        if built_recipe(local_dir) == recipe_digest:
            return None
        building = local_dir.parent / f".{local_dir.name}.{socket.gethostname()}.{os.getpid()}.building"
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir()
        try:
            stats = build_into(building)
            if local_dir.exists():  # another recipe's cache (or a damaged one): replaced
                shutil.rmtree(local_dir)
            os.rename(building, local_dir)
        except OSError:
            if built_recipe(local_dir) != recipe_digest:
                raise
            stats = None  # another node renamed the same recipe into place first
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return stats


def ensure(
    record: dict[str, Any],
    record_dir: Path,
    scratch: str | Path,
    options: dict[str, Any],
    phases: PhaseTimes,
    trace_path: Path | None = None,
    profile_batches: int = 0,
) -> tuple[Path, dict[str, Any] | None]:
    """The node-local directory of a cache record, built first when it is missing; (directory, build stats or None).

    `options["devices"]` (two or more, e.g. ["cuda:0", "cuda:1"]) builds it data-parallel over them, with the same bytes."""
    directory = local_dir(scratch, record["key"])
    dataset_dir = (record_dir / record["inputs"]["dataset"]["path"]).parent
    backbone_dir = (record_dir / record["inputs"]["backbone"]["path"]).parent
    shapes = record["cache"]["shapes"]
    if options["disk_headroom"] > 0 and built_recipe(directory) != recipe(record):
        counts = {split: shapes[split][0] for split in CACHED_SPLITS}
        meta = cache_meta(record["backbone_fingerprint"], record["cache"]["classes"], shapes, record["cache"]["taps"])
        needed = row_cache_bytes(counts, int(np.prod(shapes["train"][1:])), meta_bytes(meta))  # rows [T, D], [k, T, D] or [F]
        check_disk_budget(directory.parent, needed, options["disk_headroom"])

    def build_into(target: Path) -> dict[str, Any]:
        for role, files in (("dataset", [split_file(s) for s in CACHED_SPLITS]), ("backbone", [BACKBONE_NAME])):
            sentinel = Path(os.path.normpath(record_dir / record["inputs"][role]["path"]))
            require_intact(sentinel, files, "build_cache")
            if sha256_file(sentinel) != record["inputs"][role]["sha256"]:  # rebuilt since the record: snakemake rebuilds the record
                raise IntegrityError(f"{sentinel}: not the {role} the cache record {record_dir} names. Fix: rerun snakemake.")
        return build(
            dataset_dir,
            backbone_dir,
            target,
            recipe(record),
            record,
            batch_size=options["batch_size"],
            batch_profile=options.get("batch_profile"),
            device=torch.device(options.get("device", "cpu")),
            phases=phases,
            trace_path=trace_path,
            profile_batches=profile_batches,
            devices=options.get("devices"),
        )

    return directory, materialize(directory, recipe(record), build_into)
