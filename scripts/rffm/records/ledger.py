"""The test-split ledger: one create-only entry per (test split, run) in the results store.

An entry records the artifact a run qualified on a test split, the result, and the configuration
and code the run's selection came from. It is written once by the store itself (rffm.records.store:
two submitters racing for the same run and split get exactly one entry). Each entry carries the
sha256 of its own content, and the qualification sentinel and the run manifest record the digest of
the entry file, so an edited or deleted entry is named by `rffm verify` and refused by qualify.
Where the store allows it an entry is also write-once once recorded (Store.lock: an immutable file on
POSIX, a Locked retention on Cloud Storage), so no job can delete or replace it; verify reports the
protection of every entry.
The exposure count of a split is the number of distinct artifacts its entries name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rffm.errors import ExposureError, IntegrityError
from rffm.records.files import canonical_json, remove_dead_temporaries, sha256_bytes, sha256_json
from rffm.records.layout import LEDGER, MANIFEST_NAME, SENTINEL_NAME
from rffm.records.pipeline import BACKBONE_STEPS, REFERENCE_STEPS, SELECTION_STEPS, backbone_step
from rffm.records.store import Store

SCHEMA_VERSION = 1


def split_id(split_digest: str) -> str:
    """The folder of a test split in the ledger: its digest without the algorithm prefix."""
    return split_digest.partition(":")[2] or split_digest


def entry_key(split_digest: str, run: str) -> str:
    return f"{LEDGER}/{split_id(split_digest)}/{run}.json"


def encode(entry: dict[str, Any]) -> bytes:
    """An entry's file bytes: the entry and the sha256 of its canonical JSON."""
    return canonical_json({"entry": entry, "sha256": sha256_json(entry)}).encode()


def decode(key: str, data: bytes, where: str) -> dict[str, Any]:
    """The entry in a ledger file, after checking its shape and its own digest (one clear error otherwise)."""
    try:
        body = json.loads(data)
        entry, digest = body["entry"], body["sha256"]
        fields = (entry["run"], entry["split_digest"], entry["artifact_sha256"], entry["metrics"])
    except (ValueError, KeyError, TypeError):
        raise IntegrityError(f"{where}: not a ledger entry (damaged or edited). Fix: restore it from a backup.") from None
    if sha256_json(entry) != digest:
        raise IntegrityError(f"{where}: ledger entry does not match its own sha256 (edited or damaged). Fix: restore it from a backup.")
    if key != entry_key(fields[1], fields[0]):
        raise IntegrityError(f"{where}: ledger entry names run {fields[0]!r} on another split; it was moved or copied here.")
    return entry


def read(store: Store, key: str) -> dict[str, Any] | None:
    """The checked entry under `key`, or None when there is none."""
    data = store.read(key)
    return None if data is None else decode(key, data, store.where(key))


def entry_digest(store: Store, key: str) -> str | None:
    """sha256 of an entry file's bytes (what sentinels and manifests record), None when it is missing."""
    data = store.read(key)
    return None if data is None else sha256_bytes(data)


def claim(store: Store, entry: dict[str, Any]) -> dict[str, Any]:
    """Record a qualification create-only; the entry now in the ledger (ours, or an earlier one for the same artifact).

    A different artifact already recorded for this run and split is refused (the run spent its exposure).
    """
    key = entry_key(entry["split_digest"], entry["run"])
    if not store.create(key, encode(entry)):
        recorded = read(store, key)
        refuse_other_artifact(recorded, entry["artifact_sha256"], store.where(key))
        store.lock(key)  # an entry whose writer was killed before it locked it
        return recorded
    store.lock(key)  # write-once where the store allows it (immutable file, retention): rffm verify reports which
    return entry


def protections(store: Store) -> list[tuple[str, str]]:
    """(address, what protects it) for every ledger entry: `rffm verify` prints one line each."""
    return [(store.where(key), store.protection(key)) for key in store.list(LEDGER) if key.endswith(".json")]


def refuse_other_artifact(recorded: dict[str, Any], artifact_sha256: str, where: str) -> None:
    """Raise ExposureError when the run's recorded artifact is not this one."""
    if recorded["artifact_sha256"] == artifact_sha256:
        return
    run = recorded["run"]
    raise ExposureError(
        f"run {run!r} already spent its test exposure: artifact {recorded['artifact_sha256'][:16]}… was qualified on this test "
        f"split ({where}); the selected artifact is now {artifact_sha256[:16]}…. Evaluating a second artifact on the same test "
        "data would turn the test split into a validation set. Fix: keep the run's settings as they were, or copy the run "
        "under a new id in config (runs: <new-id>: ...) and qualify that; every run's manifest reports the exposure count."
    )


def recall(
    store: Store, split_digest: str, run: str, artifact_sha256: str, recorded: dict[str, str] | None, recorded_in: str, rule: str
) -> tuple[str, dict[str, Any] | None]:
    """(key, entry) of a run's entry for a split before it qualifies: None when the split was never read for it.

    Clears what a claim killed before it was in place left, refuses an entry that is not the one the
    qualification recorded, and an entry for another artifact of the same run.
    """
    key = entry_key(split_digest, run)
    if (local := store.local_path(key)) is not None:
        remove_dead_temporaries(local)
    if problem := recorded_entry_problem(store, key, recorded, recorded_in):
        raise IntegrityError(f"{rule} refuses to start: {problem}")
    entry = read(store, key)
    if entry is not None:
        refuse_other_artifact(entry, artifact_sha256, store.where(key))
        store.lock(key)  # a claim killed after its entry was in place, before it locked it
    return key, entry


def entries(store: Store, split_digest: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(key, checked entry) for every entry of a split (or of the whole ledger)."""
    prefix = f"{LEDGER}/{split_id(split_digest)}" if split_digest else LEDGER
    return [(key, read(store, key)) for key in store.list(prefix) if key.endswith(".json")]


def exposure_count(store: Store, split_digest: str) -> int:
    """Distinct artifacts evaluated on this split so far."""
    return len({entry["artifact_sha256"] for _, entry in entries(store, split_digest)})


def runs_qualified(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Every run the ledger holds an entry for, with its entries (any split)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for _, entry in entries(store):
        found.setdefault(entry["run"], []).append(entry)
    return found


def recorded_link(read: Callable[[str], bytes | None]) -> tuple[dict[str, str] | None, str | None]:
    """The ledger entry (key, sha256) a run's qualification recorded, and which file records it: its sentinel when
    that is intact, else its manifest; (None, None) when neither holds one. `read(name)` gives a file of the
    qualification folder (None when missing)."""
    for name, where in ((SENTINEL_NAME, ("ledger_entry",)), (MANIFEST_NAME, ("qualification", "ledger_entry"))):
        try:
            data = read(name)
            body = json.loads(data) if data is not None else None
            if name == SENTINEL_NAME and body is not None:
                body = body if sha256_json({k: v for k, v in body.items() if k != "self_sha256"}) == body["self_sha256"] else None
            for key in where:
                body = body[key]
            if isinstance(body.get("key"), str) and isinstance(body.get("sha256"), str):
                return {"key": body["key"], "sha256": body["sha256"]}, name
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return None, None


def recorded_link_in(folder: str | Path) -> tuple[dict[str, str] | None, str | None]:
    """What an earlier qualification in this folder recorded of its ledger entry (read it before the step starts)."""
    folder = Path(folder)
    return recorded_link(lambda name: (folder / name).read_bytes() if (folder / name).exists() else None)


def recorded_entry_problem(store: Store, key: str, recorded: dict[str, str] | None, recorded_in: str) -> str | None:
    """Why the entry under `key` is not the one the run's qualification recorded (missing, edited, put back); None if it is."""
    if recorded is None or recorded["key"] != key:
        return None
    digest = entry_digest(store, key)
    if digest == recorded["sha256"]:
        return None
    what = "is missing (deleted?)" if digest is None else "differs from the one recorded (edited or put back?)"
    return (
        f"{store.where(key)}: the ledger entry of this run {what}; {recorded_in} records sha256 {recorded['sha256'][:16]}…. "
        "The ledger is the only record of the run's test exposure, so no result is returned and nothing is claimed again. "
        "Fix: restore the entry from a backup (rffm verify names what else differs)."
    )


def changed_keys(recorded: Any, current: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested mappings (a value, added or removed)."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        keys = sorted(set(recorded) | set(current))
        return [k for key in keys for k in changed_keys(recorded.get(key), current.get(key), f"{prefix}{key}.")]
    return [] if recorded == current else [prefix.rstrip(".")]


# A run's keys that say how it runs or what else it publishes (traces, an export), never what it selects or qualifies.
EXECUTION_KEYS = ("profiling", "export")


def result_config(run_spec: dict[str, Any]) -> dict[str, Any]:
    """A run's config without its execution keys: what its selection and qualification depend on."""
    return {key: value for key, value in run_spec.items() if key not in EXECUTION_KEYS}


def selection_source(config: dict[str, Any], run: str, code: dict[str, str], user_code: str = "") -> dict[str, Any]:
    """What a run's qualified result came from: its config (but execution settings), its dataset's and
    backbone's config, the code of the steps on its way to selection and, for a `python` backbone, the digest of
    the user's module source (user_code). Recorded in its ledger entry."""
    if run in config.get("references", {}):  # an end-to-end reference: its dataset, its own config and training code
        spec = config["references"][run]
        return {
            "references": {run: spec},
            "datasets": {spec["dataset"]: config["datasets"][spec["dataset"]]},
            "code": {rule: code[rule] for rule in REFERENCE_STEPS},
        }
    spec = config["runs"][run]
    backbone = config["backbones"][spec["backbone"]]
    made_by = backbone_step(backbone["source"])
    source = {
        "runs": {run: result_config(spec)},
        "datasets": {spec["dataset"]: config["datasets"][spec["dataset"]]},
        "backbones": {spec["backbone"]: backbone},
        "code": {rule: code[rule] for rule in SELECTION_STEPS if rule == made_by or rule not in BACKBONE_STEPS},
    }
    if user_code:  # the user's model class builds the backbone and every hidden state the head reads
        source["user_code"] = {spec["backbone"]: user_code}
    return source


def changed_key_text(key: str) -> str:
    """How a changed key of a selection source reads in the refusal (code digests say whose code)."""
    if key.startswith("code."):
        return f"code of {key[5:]}"
    if key.startswith("user_code."):
        return f"source of backbones.{key[10:]}.python.entry_point"
    return key


def frozen_run_problem(entries_of_run: list[dict[str, Any]], current: dict[str, Any]) -> str | None:
    """Why a qualified run cannot be trained or selected again under the current config, or None.

    One line naming the run, the keys that changed and the fix: rerunning its selection could select a
    different artifact, which its spent test exposure forbids; Snakemake would first delete its results.
    """
    for entry in entries_of_run:
        changed = changed_keys(entry.get("selection_source", {}), current)
        if changed:
            run = entry["run"]
            keys = ", ".join(changed_key_text(key) for key in changed)
            section = "references" if run in entry.get("selection_source", {}).get("references", {}) else "runs"
            name = f"{section}.{run}"
            if any(key.startswith(("code.", "user_code.")) for key in changed):
                fix = (
                    "restore that code, or take "
                    f"{name} out of your config (its qualified records stay, listed stale) and train the changed code "
                    "under a new run id"
                )
            else:
                fix = (
                    f"restore {name} and put the changed settings under a new id (copy {name} to {name}_2 in your "
                    "config), then `snakemake validation_selection` trains and selects the new run alone"
                )
            return (
                f"{name} was qualified on its test split (artifact {entry['artifact_sha256'][:12]}…) and these "
                f"settings changed since: {keys}. Rerunning its training or selection could select another artifact, which "
                f"its spent test exposure forbids; nothing was run or deleted. Fix: {fix}"
            )
    return None
