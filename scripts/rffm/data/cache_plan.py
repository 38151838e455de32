"""The cache planner: every planned cache's exact size before any job runs, refused when it cannot fit the scratch disk.

`option_sizes` is the pure part: bytes of a cache for each keep option, from the split counts and the
taps' raw shapes. `refusals` gathers what it needs from the config (counts of a synthetic dataset from
its config, or of a staged one from its sentinel; tap shapes from the backbone's config or one probe
batch through a freshly built model) and returns one line per cache that will not fit: free space of
the scratch filesystem / headroom locally, or on a cluster the disk the profile asks for build_cache.
A dataset whose length the backbone does not take is refused here too, naming both lengths.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rffm.backbone_kinds import BUILT_HERE, CHECKPOINT, EXPORT, PYTHON
from rffm.errors import RffmError
from rffm.model.taps import keep_options, kept_count, row_shape, spec_for, tap_names
from rffm.records.files import atomic_write_json, canonical_json, read_json, sha256_json
from rffm.records.layout import CACHED_SPLITS, SENTINEL_NAME, cache_folder, dataset_folder, split_file

# set-resources of build_cache that say how much local disk a cluster job gets, in bytes per unit
DISK_RESOURCES = {"googlebatch_local_ssd_gb": 10**9, "disk_mb": 10**6, "disk_mib": 2**20}


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


SENTINEL_BYTES = 4096  # the cache sentinel: seven file records (sizes and digests), about 1.2 KiB whatever the cache


def cache_meta(fingerprint: str, classes: list[str], shapes: dict[str, list[int]], tap_layout: list[dict[str, Any]]) -> dict[str, Any]:
    """A cache's meta.json: what a head needs to read its rows (the writer writes it; the planner sizes it); its `taps`
    is the tap layout, {name, tokens, dim} per tap in row order."""
    return {"backbone_fingerprint": fingerprint, "classes": classes, "dtype": "bfloat16", "shapes": shapes, "taps": tap_layout}


def meta_bytes(meta: dict[str, Any]) -> int:
    """The size of meta.json as the writer writes it (canonical JSON)."""
    return len(canonical_json(meta).encode())


def row_cache_bytes(counts: dict[str, int], row_elements: int, meta_size: int, block: int = 4096) -> int:
    """Disk space every file of a cache of `row_elements` BF16 values per example takes, in whole filesystem blocks."""

    def blocks(size: int) -> int:
        return -(-size // block) * block

    total = blocks(meta_size) + blocks(SENTINEL_BYTES)
    for count in counts.values():
        total += blocks(count * row_elements * 2) + blocks(128 + 8 * count) + blocks(128 + 4 * count)  # hidden, labels, snr
    return total


def option_sizes(
    counts: dict[str, int], raw_shapes: list[tuple[int, int, bool]], spec: dict[str, Any], classes: list[str], options: list[str]
) -> dict[str, int]:
    """Bytes on disk of a cache of train + val for each keep option; `raw_shapes`: (tokens, width, pooled) per tap as the
    model gives them."""
    prefix = int(spec["taps"]["prefix"])
    cached = {split: counts[split] for split in CACHED_SPLITS}
    sizes = {}
    for option in options:
        kept = [(1 if pooled else kept_count(tokens, prefix, option), width) for tokens, width, pooled in raw_shapes]
        row = row_shape(kept)
        names = tap_names(spec["taps"], len(kept))
        layout = [{"dim": width, "name": name, "tokens": tokens} for name, (tokens, width) in zip(names, kept, strict=True)]
        meta = cache_meta("0" * 64, classes, {split: [count, *row] for split, count in cached.items()}, layout)
        sizes[option] = row_cache_bytes(cached, sum(tokens * width for tokens, width in kept), meta_bytes(meta))
    return sizes


def synthetic_counts(spec: dict[str, Any]) -> dict[str, int] | None:
    """Split counts of a synthetic dataset from its config alone (as staging's stratified split rounds), None with a `select`."""
    if spec["source"] != "synthetic" or spec.get("select"):
        return None
    synthetic = spec["synthetic"]
    grid = synthetic["snr_db"]
    strata = len(synthetic["classes"]) * (int((grid["max"] - grid["min"]) / grid["step"] + 0.5) + 1)
    n = synthetic["examples_per_class_snr"]
    test, val = int(round(n * spec["splits"]["test"])), int(round(n * spec["splits"]["val"]))
    return {"train": strata * (n - test - val), "val": strata * val, "test": strata * test}


def staged(results: str, dataset: str) -> tuple[dict[str, int] | None, int | None, list[str] | None]:
    """Counts, example length and class names of a dataset already staged in a local results tree (None where unknown)."""
    folder = Path(results) / dataset_folder(dataset)
    try:
        facts = read_json(folder / SENTINEL_NAME)["dataset"]
        counts, classes = facts["counts"], facts["classes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, None, None
    try:
        import h5py

        with h5py.File(folder / split_file("train"), "r") as handle:
            return counts, int(handle["iq"].shape[-1]), classes
    except (OSError, KeyError):
        return counts, None, classes


def dataset_facts(config: dict[str, Any], results: str, dataset: str) -> tuple[dict[str, int] | None, int | None, list[str] | None]:
    """(split counts, example length, class names) of a dataset as far as planning can know them."""
    counts, length, classes = staged(results, dataset)
    spec = config["datasets"][dataset]
    if length is None:
        length = {"synthetic": spec.get("synthetic", {}).get("length"), "sigmf": spec.get("sigmf", {}).get("window")}.get(spec["source"])
    if counts is None and spec["source"] == "synthetic":
        classes = spec["synthetic"]["classes"]
    return counts or synthetic_counts(spec), length, classes


def native_raw_shapes(backbone: dict[str, Any], length: int) -> list[tuple[int, int, bool]] | None:
    """Raw tap shapes of an in-workflow transformer from its config (default taps: its output layers), None when a probe
    must tell."""
    arch, tap_config = backbone.get("arch"), backbone.get("taps", {})
    if backbone["source"] not in BUILT_HERE or arch is None or tap_config.get("modules") or tap_config.get("method"):
        return None
    return [(length // arch["patch"], arch["dim"], False)] * arch.get("output_layers", 1)


def probed_raw_shapes(name: str, backbone: dict[str, Any], length: int) -> list[tuple[int, int, bool]]:
    """Raw tap shapes of a backbone from one probe batch through a freshly built model (random weights: shapes only)."""
    import torch

    from rffm.model import backbone as native
    from rffm.model import foreign
    from rffm.model.encoder import Encoder

    where = f"backbones.{name}"
    spec = {**spec_for(backbone), "keep": "all"}
    kind = backbone["source"]
    if kind == PYTHON:
        with torch.random.fork_rng(devices=[]):
            model = foreign.construct(backbone["python"], where).eval()
        encoder = Encoder(model, "", spec, where)
    elif kind == EXPORT:
        encoder = Encoder(foreign.load_export(Path(backbone["path"]), where), "", spec, where)
    elif kind == CHECKPOINT:
        model = native.load(backbone["path"])
        encoder = Encoder(model, "", spec, where, native_layers=model.arch.output_layers)
    else:
        arch = native.BackboneArch(length=length, **backbone["arch"])
        encoder = Encoder(native.build(arch, 0).eval(), "", spec, where, native_layers=arch.output_layers)
    pooled = spec["taps"]["form"] == "pooled"
    return [(tokens, width, pooled) for tokens, width in encoder.tap_shapes(length)]


# Probe results of the backbones planned in this directory (Snakemake's own folder): a probe imports torch and builds the
# model, seconds that every dry run would pay again for the same answer.
PROBES = Path(".snakemake") / "rffm" / "probes"


def remembered_raw_shapes(name: str, backbone: dict[str, Any], length: int) -> list[tuple[int, int, bool]]:
    """probed_raw_shapes, remembered under what decides the shapes: the backbone's config (with its files' pins), the user's
    module source for a python backbone, and the length."""
    identity = {"backbone": backbone, "length": length}
    if backbone["source"] == PYTHON:
        from rffm.model.usercode import user_source

        python = backbone["python"]
        identity["code"] = user_source(python["entry_point"], python.get("import_path"), f"backbones.{name}")["sha256"]
    path = PROBES / f"{sha256_json(identity)}.json"
    try:
        return [tuple(shape) for shape in read_json(path)]
    except (OSError, ValueError, TypeError):
        pass
    raw_shapes = probed_raw_shapes(name, backbone, length)
    try:
        atomic_write_json(path, [list(shape) for shape in raw_shapes])
    except OSError:
        pass  # a directory planning cannot write: probe again next time
    return raw_shapes


def scratch_budget(scratch: str, headroom: float, asked: dict[str, Any]) -> tuple[int, str]:
    """Bytes a cache may take: the disk the profile asks build_cache for, else the scratch filesystem's free space, / headroom."""
    for key, unit in DISK_RESOURCES.items():
        if asked.get(key):
            disk = int(float(asked[key]) * unit)
            return int(disk / headroom), f"the {human_bytes(disk)} disk the profile asks for ({key}: {asked[key]}) / {headroom}"
    where = Path(scratch).absolute()
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    return int(free / headroom), f"free {free} bytes ({human_bytes(free)}) on {where} / {headroom}"


def refusals(config: dict[str, Any], results: str, scratch: str, asked: dict[str, Any] | None = None) -> list[str]:
    """One line per planned cache that cannot be built: a length the backbone does not take, or a size the scratch disk cannot hold."""
    headroom = float(config["cache"]["disk_headroom"])
    problems = []
    pairs = dict.fromkeys((run["dataset"], run["backbone"]) for run in config["runs"].values())
    for dataset, name in pairs:
        backbone = config["backbones"][name]
        counts, length, classes = dataset_facts(config, results, dataset)
        declared = backbone.get("adapter", {}).get("length")
        if declared and length and declared != length:
            problems.append(
                f"backbones.{name}.adapter.length: the backbone takes IQ of length {declared} but dataset {dataset} has examples of "
                f"length {length}. Fix: use a dataset of length {declared}, or a backbone built for {length} samples."
            )
            continue
        if headroom <= 0 or counts is None or length is None or classes is None:
            continue  # build_cache checks the disk itself once the counts are known
        try:
            raw_shapes = native_raw_shapes(backbone, length) or remembered_raw_shapes(name, backbone, length)
        except RffmError as error:
            problems.append(str(error))
            continue
        spec = spec_for(backbone)
        sizes = option_sizes(counts, raw_shapes, spec, classes, keep_options(int(spec["taps"]["prefix"]), spec["keep"]))
        budget, said = scratch_budget(scratch, headroom, asked or {})
        needed = sizes[spec["keep"]]
        if needed > budget:
            listing = ", ".join(f"{option} {size} bytes ({human_bytes(size)})" for option, size in sizes.items())
            problems.append(
                f"{cache_folder(dataset, name)}: the hidden-state cache (keep: {spec['keep']}) needs {needed} bytes "
                f"({human_bytes(needed)}) "
                f"but the scratch disk allows {budget} bytes ({said}); size by keep option: {listing}. "
                f"Fix: set backbones.{name}.keep to an option that fits (or fewer taps), or point `scratch` at a larger disk."
            )
    return problems
