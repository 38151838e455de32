"""The memo of completed steps: outputs kept in the results store, keyed by what they were computed from.

A step whose identity (rule, key, consumed sentinels, params, code) was computed before finds its
outputs under memo/<rule>/<sha256 of the identity>/ and restores them instead of computing again:
epochs after a preemption, a killed group job (Snakemake deletes the outputs of every job of a
failed group), a fresh VM, or `epochs` raised on a run whose cache is gone with its node. Entries
are written create-only by the store, files first and the sentinel last, so a half-written entry
is never restored; restored outputs are checked against the stored sentinel byte for byte, and a
damaged entry (sentinel, provenance or file) is never restored: the step computes again and
`rffm verify` names the entry.
"""

from __future__ import annotations

import json
from pathlib import Path

from rffm.errors import IntegrityError
from rffm.records import provenance
from rffm.records.files import atomic_write_bytes, sha256_file, sha256_json
from rffm.records.layout import MEMO, PROVENANCE_NAME, SENTINEL_NAME
from rffm.records.seal import unseal
from rffm.records.sentinel import check_record
from rffm.records.step import IDENTITY_FIELDS, Step
from rffm.records.store import Store


def entry(step: Step) -> str:
    """The store folder of a step's memo entry."""
    return f"{MEMO}/{step.rule}/{sha256_json(step.identity())}"


def folder_of(body: dict) -> str:
    """The store folder a memo sentinel belongs in: its rule and the digest of its identity fields."""
    return f"{MEMO}/{body.get('stage')}/{sha256_json({key: body.get(key) for key in IDENTITY_FIELDS})}"


def restore(store: Store, step: Step, names: tuple[str, ...]) -> bool:
    """Restore the step's outputs (and facts) from its memo entry; True when it did, False when there is none usable."""
    folder = entry(step)
    data = store.read(f"{folder}/{SENTINEL_NAME}")
    if data is None:
        return False
    try:
        body = unseal(store.where(f"{folder}/{SENTINEL_NAME}"), data, "memo sentinel")
        computed = provenance.check(store.where(f"{folder}/{PROVENANCE_NAME}"), store.read(f"{folder}/{PROVENANCE_NAME}"), data)
    except IntegrityError as error:  # a damaged entry is never restored: computed again (verify names it)
        print(f"{step.rule} {step.key}: not restored from the memo, computed again: {error}")
        return False
    identity = step.identity()
    if {field: body.get(field) for field in identity} != identity:
        return False
    files = {name: store.read(f"{folder}/{name}") for name in names}
    for name, content in files.items():
        record = body.get("outputs", {}).get(name)
        if content is None or not isinstance(record, dict):
            return False
        atomic_write_bytes(step.out_dir / name, content)
        if check_record(step.out_dir / name, record):  # damaged in the store: compute it again
            return False
        step.output(name, record)
    step.facts.update({key: value for key, value in body.items() if key not in identity and key != "outputs"})
    step.details.update({"restored_from": store.where(folder), "computed_by": computed})
    print(f"{step.rule} {step.key}: restored from {store.where(folder)} (same inputs, params and code)")
    return True


def save(store: Store, step: Step, names: tuple[str, ...]) -> str:
    """Keep a finished step's outputs in its memo entry: files first, the sentinel last (all create-only)."""
    folder = entry(step)
    for name in (*names, PROVENANCE_NAME):
        store.create(f"{folder}/{name}", (step.out_dir / name).read_bytes())
    store.create(f"{folder}/{SENTINEL_NAME}", step.sentinel.read_bytes())
    return folder


def restored_problems(step_dir: Path, record: dict, results: Path) -> list[str]:
    """Why a step folder its provenance says was restored from the memo no longer holds that entry's bytes (none when it does).

    The entry is looked up in the results tree by its memo/<rule>/<digest> key (also when it was restored from a bucket
    the tree is a copy of), else at the address recorded when that is a directory on this machine."""
    source = record.get("restored_from")
    if not isinstance(source, str):
        return []
    key = source[source.rfind(f"/{MEMO}/") + 1 :] if f"/{MEMO}/" in source else source
    folder = next((f for f in (Path(results) / key, Path(source)) if (f / SENTINEL_NAME).is_file()), None)
    if folder is None:
        return [f"{step_dir / PROVENANCE_NAME}: restored from the memo entry {source}, which is missing (deleted?)"]
    problems = []
    names = [SENTINEL_NAME, *sorted(json.loads((step_dir / SENTINEL_NAME).read_bytes()).get("outputs", {}))]
    for name in names:
        ours, kept = step_dir / name, folder / name
        if not ours.is_file() or not kept.is_file() or sha256_file(ours) != sha256_file(kept):
            problems.append(f"{ours}: differs from the memo entry it was restored from ({kept})")
    return problems
