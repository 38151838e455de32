"""stage_dataset: a configured source streamed into canonical, stratified, leakage-checked HDF5 splits.

The work itself (select, split, stream, deduplicate, seal) is rffm.data.staging; a failure deletes
the temporary split files, so a failed staging leaves no split and no sentinel.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from rffm.data.splits import SplitWriter, hex_ids
from rffm.data.staging import (
    NORMALIZATIONS,
    SOURCES,
    check_duplicates,
    check_fractions,
    check_split_classes,
    compact,
    copy_iq,
    plan,
    seal,
    source_description,
    where,
)
from rffm.errors import ConfigError
from rffm.records.code import code_digest
from rffm.records.layout import SPLITS, split_file
from rffm.records.step import Step
from rffm.runtime.progress import Progress

RULE = "stage_dataset"


def run(spec: dict[str, Any], out_dir: str | Path) -> Path:
    """Stage one configured dataset (its config block plus `name`) into out_dir/{train,val,test}.h5 and the sentinel."""
    name = spec["name"]
    # parse the code closure for the sentinel's code digest meanwhile (its result is cached)
    threading.Thread(target=code_digest, args=(f"steps.{RULE}",), daemon=True).start()
    if spec["source"] not in SOURCES:
        raise ConfigError(f"datasets.{name}.source: unknown source {spec['source']!r}; known: {', '.join(SOURCES)}")
    how = spec["normalize"]
    if how not in NORMALIZATIONS:
        raise ConfigError(f"datasets.{name}.normalize: {how!r} is not one of {', '.join(NORMALIZATIONS)}")
    fractions = check_fractions(spec["splits"])
    with Step(RULE, out_dir, key={"dataset": name}, params=spec) as step, ExitStack() as cleanup:
        source = SOURCES[spec["source"]](spec, step.out_dir)
        cleanup.callback(source.close)
        rows, labels, snrs, classes, index, total = plan(spec, source, fractions)
        split_of = np.empty(len(rows), np.int8)
        for number, split in enumerate(SPLITS):
            split_of[index[split]] = number
        writers: list[SplitWriter] = []
        try:
            writers += [SplitWriter(step.out_dir / split_file(split), len(index[split]), source.length) for split in SPLITS]
            progress = Progress(f"{RULE} {name}", len(rows), unit="example")
            counts = ", ".join(f"{split} {len(index[split])}" for split in SPLITS)
            progress.note(f"{where(source)}: {len(rows)} of {total} examples selected, {len(classes)} classes; {counts}")
            ids = copy_iq(source, rows, split_of, writers, how, progress)
            progress.close()
            keep, duplicate_summary = check_duplicates(spec, source, rows, ids, split_of)
            if not keep.all():
                drop_duplicates(writers, index, keep, source.length)
                check_split_classes(name, classes, labels, index, where(source))
                progress.note(f"dropped {duplicate_summary['dropped']} duplicate example(s), kept the first copy of each")
            attrs = {
                "classes": classes,
                "sample_rate": float(spec.get("sample_rate", source.sample_rate)),
                "source": source_description(spec, source),
            }
            for writer, split in zip(writers, SPLITS, strict=True):
                positions = index[split]
                writer.finish(
                    labels[positions],
                    snrs[positions],
                    hex_ids(ids[positions]),
                    {**attrs, "split": split, "split_seed": int(spec["seed"]), "dataset": name},
                )
            with ThreadPoolExecutor(len(writers)) as pool:  # reading, hashing and fsync release the GIL
                records = list(pool.map(seal, writers))
        except BaseException:
            for writer in writers:
                writer.discard()
                if writer.committed:  # a later rename failed: take back the earlier ones
                    writer.path.unlink(missing_ok=True)
            raise
        for split, record in zip(SPLITS, records, strict=True):
            step.output(split_file(split), record)
        counts = {split: int(len(index[split])) for split in SPLITS}
        facts = {"name": name, "source": spec["source"], "classes": classes, "counts": counts}
        step.facts["dataset"] = {**facts, "duplicates": duplicate_summary}
    return step.sentinel


def drop_duplicates(writers: list[SplitWriter], index: dict[str, np.ndarray], keep: np.ndarray, length: int) -> None:
    """Keep only the `keep` rows in each split's writer and index (the first copy of each duplicate)."""
    for number, split in enumerate(SPLITS):
        if not keep[index[split]].all():
            writers[number] = compact(writers[number], keep[index[split]], length)
        index[split] = index[split][keep[index[split]]]
