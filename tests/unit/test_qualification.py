"""The once-only qualification protocol (rffm.training.qualification), the one both qualify steps call."""

from pathlib import Path

import pytest

from rffm.errors import ExposureError
from rffm.records import ledger
from rffm.records.store import PosixStore
from rffm.training.qualification import qualify_once

SPLIT = "xxh3_128_of_parts:" + "ab" * 16


def qualify(store: PosixStore, run: str, artifact: str, evaluations: list[str], recorded=None) -> dict:
    """qualify_once for (run, artifact); each evaluation appends the run to `evaluations`."""

    def evaluate() -> dict:
        evaluations.append(run)
        return {"accuracy": 0.5, "count": 4}

    return qualify_once(
        store,
        split_digest=SPLIT,
        dataset="d",
        run=run,
        artifact_sha256=artifact,
        source={"runs": {run: {}}},
        recorded=recorded,
        recorded_in="qualification/run_manifest.json",
        rule="qualify",
        evaluate=evaluate,
    )


def test_the_test_split_is_evaluated_once_per_run_and_a_recall_returns_the_stored_entry(tmp_path: Path):
    store, evaluations = PosixStore(tmp_path), []
    first = qualify(store, "a", "art-1", evaluations)
    assert evaluations == ["a"] and first["recalled"] is None
    assert first["metrics"] == {"accuracy": 0.5, "count": 4, "exposure_count": 1}
    assert first["link"] == {"key": ledger.entry_key(SPLIT, "a"), "sha256": ledger.entry_digest(store, ledger.entry_key(SPLIT, "a"))}
    again = qualify(store, "a", "art-1", evaluations, recorded=first["link"])
    assert evaluations == ["a"] and again["recalled"] == store.where(first["link"]["key"])
    assert {key: again[key] for key in ("metrics", "link")} == {key: first[key] for key in ("metrics", "link")}
    qualify(store, "b", "art-2", evaluations)  # another run: its own exposure, counted on the split
    assert evaluations == ["a", "b"] and qualify(store, "a", "art-1", evaluations)["metrics"]["exposure_count"] == 2


def test_a_second_artifact_under_a_qualified_run_is_refused_before_any_evaluation(tmp_path: Path):
    store, evaluations = PosixStore(tmp_path), []
    qualify(store, "a", "art-1", evaluations)
    with pytest.raises(ExposureError, match="already spent its test exposure"):
        qualify(store, "a", "art-2", evaluations)
    assert evaluations == ["a"]
