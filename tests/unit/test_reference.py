"""The end-to-end reference: a CNN trained from scratch, chosen on val, qualified once under its own id; and `rffm compare`."""

import json
from pathlib import Path

import pytest

from conftest import accuracy_of_examples, stage, tiny_config
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
    assert (
        manifest["qualification"]["accuracy"] == accuracy_of_examples(sentinel.parent) and manifest["qualification"]["exposure_count"] == 1
    )
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
    durations = [compare._duration(results / f"runs/cnn/{step}") for step in ("selection", "qualification")]
    assert None not in durations and rows[0]["wall_s"] == round(sum(durations), 1)  # the steps' recorded durations, summed
    groups = compare.seed_groups(rows, results)
    assert groups[0]["runs"] == ["cnn"] and groups[0]["strongest"] and groups[0]["vs_end_to_end"] is None
    text = compare.render(rows, groups)
    assert text.splitlines()[0].split()[:4] == ["labels", "role", "run", "seeds"] and "all     end-to-end  cnn*" in text
    compare.plot(groups, rows, tmp_path / "comparison.png")
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
    table = compare.render(rows, compare.seed_groups(rows, results))
    assert rows[0]["labels"] == 2 and table.splitlines()[1].split()[:3] == ["2", "end-to-end", "cnn*"]


GRID = [["train.lr", [0.01, 0.03]], ["train.epochs", [2, 3]]]  # as the workflow passes a sweep: [key, values] pairs


def test_a_swept_reference_trains_each_member_as_its_plain_reference_and_spends_one_exposure(dataset_dir: Path, tmp_path: Path):
    """references.<id>.sweep: the members in grid order, each exactly the plain reference of its settings (its history,
    and the chosen one's artifact); the best (member, epoch) on val by the runs' rule; one artifact, one exposure; the
    chosen member named in selection.json, history.json, the manifest, `rffm status` and `rffm compare`."""
    from rffm.ops import status
    from rffm.training import selection as rule
    from rffm.training import sweep

    results = tmp_path / "results"
    swept = {**spec(), "sweep": GRID}
    sentinel = train_and_qualify(dataset_dir, results, swept)
    members = sweep.members(swept, "references")
    names = [m["name"] for m in members]
    assert names == ["lr=0.01,epochs=2", "lr=0.01,epochs=3", "lr=0.03,epochs=2", "lr=0.03,epochs=3"]
    selected = sentinel.parents[1] / "selection"
    selection = json.loads((selected / "selection.json").read_text())
    record = json.loads((selected / "history.json").read_text())
    assert selection["member"] == record["sweep"]["member"] in names and selection["rule"] == rule.SWEEP_RULE_TEXT
    assert [m["name"] for m in record["sweep"]["members"]] == names and len(selection["candidates"]) == 2 + 3 + 2 + 3
    chosen = members[names.index(selection["member"])]
    assert selection["settings"] == chosen["settings"] and record["training"] == sweep.member_train(swept["train"], chosen["settings"])
    # the candidates, epochs ascending and members in grid order, as a run's sweep ranks them
    candidates = [{**m, "member": n} for e in (1, 2, 3) for n in names for m in record["sweep"]["histories"][n] if m["epoch"] == e]
    assert rule.choose(candidates, "val_accuracy", "max")["member"] == selection["member"]
    for member in members:  # each member is the plain reference of its settings
        plain = tmp_path / "plain" / member["name"]
        alone = config.entry_defaults("references", {**REFERENCE, "train": sweep.member_train(REFERENCE["train"], member["settings"])})
        train_reference.run(alone, dataset_dir, plain / "runs/cnn/selection", store=plain)
        history = json.loads((plain / "runs/cnn/selection/history.json").read_text())["epochs"]
        assert record["sweep"]["histories"][member["name"]] == history, member["name"]
        if member == chosen:
            assert json.loads((plain / "runs/cnn/selection/selection.json").read_text())["artifact_sha256"] == selection["artifact_sha256"]
            assert record["epochs"] == history
    manifest = json.loads((sentinel.parent / "run_manifest.json").read_text())
    assert manifest["selection"]["member"] == selection["member"] and manifest["selection"]["settings"] == chosen["settings"]
    assert manifest["qualification"]["exposure_count"] == 1
    assert len(ledger.entries(ledger_store(results))) == 1
    (row,) = compare.collect(results)
    assert (row["member"], row["members"]) == (selection["member"], 4)
    assert row["optimizer_steps_computed"]  # the CNN records none: ceil(train rows / batch size) x the chosen member's epochs
    rows_per_epoch = -(-json.loads((dataset_dir / "sentinel.json").read_text())["dataset"]["counts"]["train"] // TRAIN["batch_size"])
    assert row["optimizer_steps"] == rows_per_epoch * chosen["settings"]["train.epochs"]
    assert f"cnn [{selection['member']}]*" in compare.render([row], compare.seed_groups([row], results))
    (state,) = status.collect(results)
    assert state["selected_member"] == selection["member"] and state["epochs_done"] == chosen["settings"]["train.epochs"]
    assert state["state"] == "qualified"


def test_train_reference_checks_the_members_its_plan_named():
    """`snakemake -n -p` names a reference sweep's members (--members); a plan of other code naming others is refused."""
    from rffm.errors import ConfigError
    from rffm.training import sweep

    swept = {"run": "cnn", "sweep": GRID}
    label = sweep.plan_label(swept, "references")
    assert label == "[lr=0.01,epochs=2] [lr=0.01,epochs=3] [lr=0.03,epochs=2] [lr=0.03,epochs=3]"
    sweep.check_planned(swept, label, "references")
    with pytest.raises(ConfigError, match=r"^references\.cnn\.sweep: planned members '\[lr=0\.01\]', computed"):
        sweep.check_planned(swept, "[lr=0.01]", "references")
    with pytest.raises(ConfigError, match=r"references\.cnn\.sweep: 'train\.batch_size' cannot be swept"):
        sweep.members({"run": "cnn", "sweep": {"train.batch_size": [8, 16]}}, "references")
