"""Issue 34: refusals of the results store's records (ledger entries, artifacts, addressed files) whose printed Fix no
other test follows; each is provoked, its Fix is done as written (a backup put back, a file moved aside, the store
or run id it names), and the same call then returns the record."""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from fixes import fix_of
from rffm.errors import ConfigError, ExposureError, IntegrityError
from rffm.model import cnn, head
from rffm.records import ledger
from rffm.records.files import sha256_bytes
from rffm.records.store import PosixStore, create_addressed, given_store, set_immutable
from rffm.training.artifact import load_cnn, load_head
from rffm.training.selection import publish_artifact

SPLIT = "xxh3_128_of_parts:" + "ab" * 16


def restore(path: Path, backup: Path) -> None:
    """Put a backup back as an administrator does: the flag and mode that protect the file cleared first, then cp."""
    if path.exists():
        set_immutable(path, False)
        path.chmod(0o644)
    shutil.copy(backup, path)


def claimed(store: PosixStore, tmp_path: Path, run: str = "run-a") -> tuple[str, Path, Path]:
    """A claimed entry (key, its file) and a backup copy of that file, taken while it was intact."""
    ledger.claim(store, {"split_digest": SPLIT, "run": run, "artifact_sha256": "art-1", "metrics": {"accuracy": 0.5}})
    key = ledger.entry_key(SPLIT, run)
    backup = tmp_path / "backup.json"
    shutil.copy(store.local_path(key), backup)
    return key, store.local_path(key), backup


@pytest.mark.parametrize("damage", ["truncated", "edited"])
def test_a_damaged_ledger_entry_is_fixed_by_restoring_it_from_a_backup(tmp_path: Path, damage: str):
    store = PosixStore(tmp_path / "results")
    key, path, backup = claimed(store, tmp_path)
    body = path.read_bytes()
    edited = json.loads(body)
    edited["entry"]["metrics"]["accuracy"] = 0.99
    restore(path, tmp_path / "backup.json")  # writable, so the damage below can be done
    path.write_bytes(body[: len(body) // 2] if damage == "truncated" else json.dumps(edited).encode())
    with pytest.raises(IntegrityError) as caught:
        ledger.read(store, key)
    assert fix_of(caught) == "restore it from a backup."
    restore(path, backup)
    assert ledger.read(store, key)["metrics"] == {"accuracy": 0.5}


def test_a_deleted_ledger_entry_the_qualification_recorded_is_fixed_by_restoring_it(tmp_path: Path):
    store = PosixStore(tmp_path / "results")
    key, path, backup = claimed(store, tmp_path)
    recorded = {"key": key, "sha256": ledger.entry_digest(store, key)}
    set_immutable(path, False)
    path.unlink()
    with pytest.raises(IntegrityError) as caught:
        ledger.recall(store, SPLIT, "run-a", "art-1", recorded, "manifest.json", "qualify")
    assert fix_of(caught) == "restore the entry from a backup (rffm verify names what else differs)."
    restore(path, backup)
    assert ledger.recall(store, SPLIT, "run-a", "art-1", recorded, "manifest.json", "qualify")[1]["artifact_sha256"] == "art-1"


def test_a_second_artifact_of_a_qualified_run_is_fixed_by_qualifying_it_under_a_new_run_id(tmp_path: Path):
    store = PosixStore(tmp_path / "results")
    claimed(store, tmp_path)
    with pytest.raises(ExposureError) as caught:
        ledger.recall(store, SPLIT, "run-a", "art-2", None, "", "qualify")
    fix = fix_of(caught)
    assert fix.startswith("keep the run's settings as they were, or copy the run under a new id in config (runs: <new-id>: ...)"), fix
    assert ledger.recall(store, SPLIT, "run-a", "art-1", None, "", "qualify")[1] is not None  # its settings as they were
    assert ledger.recall(store, SPLIT, "run-a-2", "art-2", None, "", "qualify")[1] is None  # the copy, never qualified


def test_a_step_without_a_store_is_fixed_by_passing_one(tmp_path: Path):
    with pytest.raises(ConfigError) as caught:
        given_store(None, "qualify")
    fix = fix_of(caught)
    assert fix == "pass --store DIR|gs://bucket/prefix (the rule passes the configured one)"
    assert given_store(str(tmp_path / "results"), "qualify").root == tmp_path / "results"  # --store DIR


def test_a_file_holding_other_bytes_than_its_name_is_fixed_by_moving_it_aside(tmp_path: Path):
    store = PosixStore(tmp_path / "results")
    key = f"artifacts/sha256-{sha256_bytes(b'the artifact')}.pt"
    store.create(key, b"something else")
    with pytest.raises(IntegrityError) as caught:
        create_addressed(store, key, b"the artifact", "artifact")
    assert fix_of(caught) == "move it aside."
    store.local_path(key).rename(tmp_path / "aside.pt")
    assert create_addressed(store, key, b"the artifact", "artifact")["sha256"] == sha256_bytes(b"the artifact")


def published_head(store: PosixStore, tmp_path: Path) -> tuple[dict, Path, Path]:
    """A head artifact as selection publishes it ({key, sha256}), its file and a backup copy."""
    model = head.build({"hidden": 8, "dropout": 0.0}, {"classes": ["a", "b"], "shapes": {"train": [4, 1, 5, 8]}, "taps": []})
    weights = {"format": "rffm-head-artifact/1", "classes": ["a", "b"], "head_config": head.config_record(model.config)}
    artifact = publish_artifact(store, {**weights, "head": model.state_dict()})
    backup = tmp_path / "backup.pt"
    shutil.copy(store.local_path(artifact["key"]), backup)
    return {"key": artifact["key"], "sha256": artifact["sha256"]}, store.local_path(artifact["key"]), backup


@pytest.mark.parametrize("damage", ["deleted", "changed"])
def test_a_missing_or_changed_head_artifact_is_fixed_by_restoring_it(tmp_path: Path, damage: str):
    store = PosixStore(tmp_path / "results")
    artifact, path, backup = published_head(store, tmp_path)
    path.unlink()
    if damage == "changed":
        path.write_bytes(backup.read_bytes()[:-1])
    with pytest.raises(IntegrityError) as caught:
        load_head(store, artifact)
    assert fix_of(caught) == "restore it."
    restore(path, backup)
    assert load_head(store, artifact)[1]["classes"] == ["a", "b"]


@pytest.mark.parametrize("damage", ["deleted", "changed"])
def test_a_missing_or_changed_reference_artifact_is_fixed_by_restoring_it(tmp_path: Path, damage: str):
    store = PosixStore(tmp_path / "results")
    config = cnn.CNNConfig(classes=2, length=32, width=4, blocks=1, kernel=3, hidden=8, dropout=0.0, input="iq", symbol_period=8)
    buffer = io.BytesIO()
    torch.save({"cnn_config": asdict(config), "state_dict": cnn.RadioMLCNN(config).state_dict()}, buffer)
    published = create_addressed(store, f"artifacts/sha256-{sha256_bytes(buffer.getvalue())}.pt", buffer.getvalue(), "artifact")
    selection = {"artifact_path": published["key"], "artifact_sha256": published["sha256"]}
    path, backup = store.local_path(published["key"]), tmp_path / "backup.pt"
    shutil.copy(path, backup)
    path.unlink()
    if damage == "changed":
        path.write_bytes(b"not the reference")
    with pytest.raises(IntegrityError) as caught:
        load_cnn(store, selection)
    assert fix_of(caught) == "restore it."
    restore(path, backup)
    assert isinstance(load_cnn(store, selection)[0], cnn.RadioMLCNN)
