"""The test-split ledger: create-only, self-digested entries in the results store."""

import json
from pathlib import Path

import pytest

from rffm.errors import ExposureError, IntegrityError
from rffm.records import ledger
from rffm.records.store import PosixStore, set_immutable

SPLIT = "xxh3_128_of_parts:" + "ab" * 16


def entry(run: str, artifact: str, accuracy: float = 0.5) -> dict:
    return {"split_digest": SPLIT, "run": run, "artifact_sha256": artifact, "metrics": {"accuracy": accuracy}}


def test_a_run_claims_one_artifact_per_split_and_the_count_is_distinct_artifacts(tmp_path: Path):
    store = PosixStore(tmp_path)
    assert ledger.claim(store, entry("run-a", "art-1")) == entry("run-a", "art-1")
    assert ledger.claim(store, entry("run-a", "art-1", 0.9))["metrics"] == {"accuracy": 0.5}  # the first record stands
    with pytest.raises(ExposureError, match="already spent its test exposure"):
        ledger.claim(store, entry("run-a", "art-2"))
    ledger.claim(store, entry("run-b", "art-2"))
    ledger.claim(store, entry("run-c", "art-2"))
    assert ledger.exposure_count(store, SPLIT) == 2
    assert ledger.exposure_count(store, "xxh3_128_of_parts:" + "cd" * 16) == 0
    assert sorted(ledger.runs_qualified(store)) == ["run-a", "run-b", "run-c"]
    key = ledger.entry_key(SPLIT, "run-a")
    assert key == f"ledger/{'ab' * 16}/run-a.json" and not (tmp_path / key).stat().st_mode & 0o222  # read-only


def writable(path: Path) -> None:
    """What an administrator does before editing an entry by hand: `chattr -i`, `chmod u+w`."""
    set_immutable(path, False)
    path.chmod(0o644)


def test_an_edited_or_moved_entry_is_named(tmp_path: Path):
    store = PosixStore(tmp_path)
    ledger.claim(store, entry("run-a", "art-1"))
    path = tmp_path / ledger.entry_key(SPLIT, "run-a")
    body = json.loads(path.read_text())
    body["entry"]["metrics"]["accuracy"] = 0.99
    writable(path)
    path.write_text(json.dumps(body))
    with pytest.raises(IntegrityError, match="does not match its own sha256"):
        ledger.read(store, ledger.entry_key(SPLIT, "run-a"))
    moved = tmp_path / ledger.entry_key(SPLIT, "run-b")
    moved.write_bytes(ledger.encode(entry("run-a", "art-1")))
    with pytest.raises(IntegrityError, match="moved or copied"):
        ledger.read(store, ledger.entry_key(SPLIT, "run-b"))


def test_changed_keys_name_what_differs():
    before = {"runs": {"r": {"train": {"lr": 0.1, "epochs": 3}}}, "code": {"train_epoch": "a"}}
    after = {"runs": {"r": {"train": {"lr": 0.2, "epochs": 3, "seed": 1}}}, "code": {"train_epoch": "b"}}
    assert ledger.changed_keys(before, after) == ["code.train_epoch", "runs.r.train.lr", "runs.r.train.seed"]
    problem = ledger.frozen_run_problem([{**entry("r", "art-1"), "selection_source": before}], after)
    assert problem.startswith("runs.r was qualified") and "runs.r.train.lr" in problem and "code of train_epoch" in problem
    assert "\n" not in problem and "Fix:" in problem
    assert ledger.frozen_run_problem([{**entry("r", "art-1"), "selection_source": after}], after) is None


def test_an_entry_that_is_not_the_one_the_qualification_recorded_is_named(tmp_path: Path):
    from rffm.records.seal import seal

    store = PosixStore(tmp_path)
    ledger.claim(store, entry("run-a", "art-1"))
    key = ledger.entry_key(SPLIT, "run-a")
    link = {"key": key, "sha256": ledger.entry_digest(store, key)}
    files = {"sentinel.json": seal({"ledger_entry": link}), "run_manifest.json": json.dumps({"qualification": {"ledger_entry": link}})}
    assert ledger.recorded_link(files.get) == (link, "sentinel.json")
    assert ledger.recorded_link({**files, "sentinel.json": b"{damaged"}.get) == (link, "run_manifest.json")
    assert ledger.recorded_link({}.get) == (None, None)
    assert ledger.recorded_entry_problem(store, key, link, "q/sentinel.json") is None
    path = tmp_path / key
    writable(path)
    path.write_bytes(ledger.encode(entry("run-a", "art-1", accuracy=0.99)))  # edited and resealed: its own digest holds
    assert "differs from the one recorded" in ledger.recorded_entry_problem(store, key, link, "q/sentinel.json")
    path.unlink()
    problem = ledger.recorded_entry_problem(store, key, link, "q/sentinel.json")
    assert problem.startswith(str(path)) and "is missing (deleted?)" in problem and "\n" not in problem


def test_an_entry_is_write_once_where_the_filesystem_allows_and_verify_says_which(tmp_path: Path):
    import os

    store = PosixStore(tmp_path)
    ledger.claim(store, entry("run-a", "art-1"))
    path = tmp_path / ledger.entry_key(SPLIT, "run-a")
    [(where, protection)] = ledger.protections(store)
    assert where == str(path)
    if not set_immutable(path, True):  # no CAP_LINUX_IMMUTABLE here, or a filesystem without the flag
        assert protection.startswith("read-only (mode 0444) but not immutable")
        pytest.skip("this process may not make files immutable (chattr +i): the entry is read-only only")
    assert protection == "immutable (chattr +i): no job can delete, rename or rewrite it"
    # what a buggy or hostile job would try: delete, overwrite, replace by rename, make it writable again
    (tmp_path / "forged.json").write_bytes(b"{}")
    forge = lambda: os.replace(tmp_path / "forged.json", path)  # noqa: E731
    for attempt in (path.unlink, lambda: path.write_bytes(b"{}"), forge, lambda: path.chmod(0o644)):
        with pytest.raises(PermissionError):
            attempt()
    assert ledger.read(store, ledger.entry_key(SPLIT, "run-a")) == entry("run-a", "art-1")
    writable(path)
    assert ledger.protections(store)[0][1] == "WRITABLE: any job can rewrite it (its mode was changed)"


BUILT_BY = [
    ("pretrain", "pretrain_backbone"),
    ("random", "pretrain_backbone"),
    ("python", "import_backbone"),
    ("export", "import_backbone"),
]


@pytest.mark.parametrize(("source", "made_by"), BUILT_BY)
def test_a_runs_selection_source_holds_the_code_of_the_step_that_built_its_backbone(source: str, made_by: str):
    """The steps come from the pipeline table: an imported user backbone (python, export, checkpoint) is import_backbone's."""
    config = {
        "runs": {"r": {"dataset": "d", "backbone": "b", "train": {"epochs": 2}, "profiling": {"batch_count": 1}}},
        "datasets": {"d": {"source": "synthetic"}},
        "backbones": {"b": {"source": source}},
    }
    code = {rule: f"digest of {rule}" for rule in ("stage_dataset", "pretrain_backbone", "import_backbone", "build_cache", "train_epoch")}
    code |= {"select_checkpoint": "s", "qualify": "q"}
    found = ledger.selection_source(config, "r", code)
    assert set(found["code"]) == {"stage_dataset", made_by, "build_cache", "train_epoch", "select_checkpoint"}
    assert "profiling" not in found["runs"]["r"]


def test_a_python_backbones_module_source_is_part_of_the_selection_source_and_its_change_names_it():
    """Issue 34: the user module's source digest is recorded (a python backbone only), and an edit is named in the refusal
    with the fix for code (restore it), not the fix for settings (a new run id for the changed settings)."""
    config = {
        "runs": {"r": {"dataset": "d", "backbone": "b", "train": {"epochs": 2}}},
        "datasets": {"d": {"source": "synthetic"}},
        "backbones": {"b": {"source": "python"}},
    }
    code = {rule: rule for rule in ("stage_dataset", "import_backbone", "build_cache", "train_epoch", "select_checkpoint")}
    assert "user_code" not in ledger.selection_source(config, "r", code)
    before, after = (ledger.selection_source(config, "r", code, digest) for digest in ("a" * 64, "b" * 64))
    assert before["user_code"] == {"b": "a" * 64}
    problem = ledger.frozen_run_problem([{**entry("r", "art-1"), "selection_source": before}], after)
    assert "these settings changed since: source of backbones.b.python.entry_point." in problem
    assert "Fix: restore that code, or take runs.r out of your config" in problem
    settings = ledger.frozen_run_problem([{**entry("r", "art-1"), "selection_source": before}], {**before, "runs": {"r": {}}})
    assert "Fix: restore runs.r and put the changed settings under a new id (copy runs.r to runs.r_2 in your config)" in settings
