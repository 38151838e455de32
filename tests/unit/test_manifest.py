"""records/manifest: the steps a manifest reports are the pipeline table's, each read from the folder qualify is handed."""

from __future__ import annotations

from pathlib import Path

from rffm.records import manifest, pipeline
from rffm.records.step import Step


def ran(rule: str, folder: Path) -> Path:
    """A finished step of `rule` in `folder` (its sentinel and provenance record)."""
    with Step(rule, folder, key={}, params={}, code="records.files"):
        pass
    return folder


def test_a_frozen_backbone_manifest_reports_every_step_that_decides_its_artifact(tmp_path: Path):
    folders = {
        "dataset": ran("stage_dataset", tmp_path / "dataset"),
        "backbone": ran("import_backbone", tmp_path / "backbone"),
        "cache": ran("build_cache", tmp_path / "cache"),
        "epochs": [ran("train_epoch", tmp_path / f"epoch{k}") for k in (1, 2)],
        "selection": ran("select_checkpoint", tmp_path / "selection"),
    }
    steps = manifest.collect_steps(manifest.FROZEN_BACKBONE, folders)
    # the backbone under the rule that built it (pretrain_backbone or import_backbone), in the table's order
    assert list(steps) == ["stage_dataset", "import_backbone", "build_cache", "train_epoch", "select_checkpoint"]
    assert [step for step in pipeline.SELECTION_STEPS if step != "pretrain_backbone"] == list(steps)
    assert all(record["rule"] == rule for rule, record in steps.items())
    epochs = steps.pop("train_epoch")  # every job's record, the last one's on top
    assert len(epochs["jobs"]) == 2 and epochs["jobs"][-1] == {key: value for key, value in epochs.items() if key != "jobs"}


def test_an_end_to_end_manifest_reports_the_reference_steps(tmp_path: Path):
    folders = {"dataset": ran("stage_dataset", tmp_path / "dataset"), "selection": ran("train_reference", tmp_path / "ref")}
    assert list(manifest.collect_steps(manifest.END_TO_END, folders)) == list(pipeline.REFERENCE_STEPS)


def test_each_qualify_rule_is_handed_the_folder_of_every_step_its_manifest_reports():
    """A manifest step's row names the role its folder has; the qualify rules take the option of each role."""
    option = {"dataset": "--dataset-dir", "backbone": "--backbone-dir", "cache": "--cache-record-dir", "epochs": "--epoch-dirs"}
    option |= {"selection": "--selection-dir"}
    for rules, qualify in ((pipeline.SELECTION_STEPS, "qualify"), (pipeline.REFERENCE_STEPS, "qualify_reference")):
        options = {option.get(pipeline.BY_RULE[rule].consumed_as, "") for rule in rules}
        assert "" not in options and options <= set(pipeline.BY_RULE[qualify].flags), qualify
