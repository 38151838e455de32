"""The end-to-end reference: a CNN trained from scratch, chosen on val, qualified once under its own id; and `rffm compare`."""

import json
from pathlib import Path

import pytest

from conftest import stage, tiny_config
from rffm import config
from rffm.errors import ExposureError
from rffm.ops import compare
from rffm.records import ledger
from rffm.records.files import sha256_file
from rffm.steps import qualify_reference, train_reference

DATASET = {
    "name": "t",
    "source": "synthetic",
    "seed": 5,
    "synthetic": {
        "classes": ["BPSK", "WBFM", "GFSK"],
        "snr_db": {"min": 0, "max": 10, "step": 10},
        "examples_per_class_snr": 12,
        "length": 32,
    },
}
TRAIN = {"epochs": 3, "lr": 0.01, "batch_size": 8, "seed": 0}
REFERENCE = {"run": "cnn", "dataset": "t", "model": {"width": 8, "blocks": 2}, "train": TRAIN}


def spec(**train) -> dict:
    return config.entry_defaults("references", {**REFERENCE, "train": {**REFERENCE["train"], **train}})


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ref") / "results"
    stage(DATASET, root / "datasets/t")
    return root / "datasets/t"


def train_and_qualify(dataset_dir: Path, results: Path, reference: dict) -> Path:
    selection = results / "runs/cnn/selection"
    train_reference.run(reference, dataset_dir, selection, store=results)
    source = {"references": {"cnn": reference}}
    return qualify_reference.run(reference, selection, dataset_dir, results / "runs/cnn/qualification", source=source, store=results)


def test_training_is_deterministic_and_keeps_the_best_val_epoch(dataset_dir: Path, tmp_path: Path):
    for name in ("a", "b"):
        train_reference.run(spec(), dataset_dir, tmp_path / name / "runs/cnn/selection", store=tmp_path / name)
    a, b = (tmp_path / name / "runs/cnn/selection" for name in ("a", "b"))
    assert (a / "selection.json").read_bytes() == (b / "selection.json").read_bytes()
    assert (a / "sentinel.json").read_bytes() == (b / "sentinel.json").read_bytes()
    selection = json.loads((a / "selection.json").read_text())
    history = json.loads((a / "history.json").read_text())["epochs"]
    assert len(history) == 3 and selection["value"] == max(e["val_accuracy"] for e in history)
    assert selection["epoch"] == min(e["epoch"] for e in history if e["val_accuracy"] == selection["value"])
    artifact = tmp_path / "a" / selection["artifact_path"]
    assert sha256_file(artifact) == selection["artifact_sha256"]


def test_a_reference_is_qualified_once_under_its_own_id(dataset_dir: Path, tmp_path: Path):
    results = tmp_path / "results"
    sentinel = train_and_qualify(dataset_dir, results, spec())
    manifest = json.loads((sentinel.parent / "run_manifest.json").read_text())
    assert manifest["kind"] == "end_to_end" and manifest["run_id"] == "cnn"
    assert 0 <= manifest["qualification"]["accuracy"] <= 1 and manifest["qualification"]["exposure_count"] == 1
    metrics = (sentinel.parent / "metrics.json").read_bytes()
    # qualifying again recalls the recorded result: the same bytes
    train_and_qualify(dataset_dir, results, spec())
    assert (sentinel.parent / "metrics.json").read_bytes() == metrics
    assert [key for key, _ in ledger.entries(ledger_store(results))] == [manifest["qualification"]["ledger_entry"]["key"]]
    # another artifact under the same id would spend a second exposure: refused
    with pytest.raises(ExposureError, match="already spent its test exposure"):
        train_and_qualify(dataset_dir, results, spec(seed=1))


def ledger_store(results: Path):
    from rffm.records.store import PosixStore

    return PosixStore(results)


def test_compare_prints_the_reference_as_end_to_end_with_its_wall_time(dataset_dir: Path, tmp_path: Path):
    results = tmp_path / "results"
    train_and_qualify(dataset_dir, results, spec())
    rows = compare.collect(results)
    assert [(r["run"], r["role"]) for r in rows] == [("cnn", "end-to-end")]
    assert rows[0]["wall_s"] is not None and rows[0]["wall_s"] >= 0
    text = compare.render(rows)
    assert text.splitlines()[0].split()[:3] == ["labels", "role", "run"] and "all     end-to-end  cnn" in text
    compare.plot(rows, tmp_path / "comparison.png")
    assert (tmp_path / "comparison.png").read_bytes()[:4] == b"\x89PNG"


def test_a_reference_id_must_not_be_a_run_id_and_must_name_a_dataset():
    bad = tiny_config()
    bad["references"] = {"base": {"dataset": "tiny", "train": TRAIN}, "other": {"dataset": "nope", "train": TRAIN}}
    problems = config.problems(bad)
    assert any(p.startswith("references.base: the id is also a run's") for p in problems)
    assert any(p.startswith("references.other.dataset: 'nope' is not defined") for p in problems)


def test_a_label_scarce_reference_trains_on_k_per_cell_and_compare_shows_k(dataset_dir: Path, tmp_path: Path):
    """train.labels_per_class_snr: 2 of each of the 3 x 2 (class, SNR) cells; the rows are in its provenance."""
    results = tmp_path / "results"
    sentinel = train_and_qualify(dataset_dir, results, spec(labels_per_class_snr=2))
    selection = json.loads((sentinel.parents[1] / "selection/sentinel.json").read_text())
    assert selection["labels"]["labelled_rows"] == 12 and selection["labels"]["labels_seed"] == 0
    assert selection["labels"]["train_rows"] > 12
    rows = compare.collect(results)
    assert rows[0]["labels"] == 2 and compare.render(rows).splitlines()[1].split()[:3] == ["2", "end-to-end", "cnn"]
