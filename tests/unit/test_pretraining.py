import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from conftest import import_checkpoint, make_backbone, stage
from rffm.config import entry_defaults
from rffm.data.splits import map_iq, read_split
from rffm.errors import IntegrityError
from rffm.model import backbone
from rffm.records import step as step_module
from rffm.records.files import sha256_file
from rffm.records.sentinel import read_sentinel
from rffm.training import pretraining as pretrain

DATASET = {
    "name": "t",
    "source": "synthetic",
    "seed": 1,
    "synthetic": {"classes": ["BPSK", "WBFM"], "snr_db": {"min": 10, "max": 10, "step": 1}, "examples_per_class_snr": 20, "length": 32},
}
BACKBONE = {
    "name": "b",
    "source": "pretrain",
    "dataset": "t",
    "arch": {"patch": 8, "dim": 16, "depth": 1, "heads": 2, "stem": "iq", "output_layers": 1},
    "pretrain": {"epochs": 2, "batch_size": 8, "min_steps": 0},
}


def backbone_fingerprint(sentinel: Path) -> str:
    return read_sentinel(sentinel)["backbone"]["fingerprint"]


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("ds")
    stage(DATASET, directory)
    return directory


@pytest.mark.parametrize("objective", pretrain.OBJECTIVES)
def test_pretraining_reduces_its_loss_and_is_deterministic(dataset_dir: Path, tmp_path: Path, objective: str):
    spec = {**BACKBONE, "pretrain": {**BACKBONE["pretrain"], "epochs": 6, "objective": objective}}
    make_backbone(spec, dataset_dir, tmp_path / "a")
    make_backbone(spec, dataset_dir, tmp_path / "b")
    losses = json.loads((tmp_path / "a/pretrain_log.json").read_text())["loss_by_epoch"]
    assert losses[-1] < losses[0]
    assert sha256_file(tmp_path / "a/backbone.pt") == sha256_file(tmp_path / "b/backbone.pt")


def test_min_steps_raises_the_epochs_of_a_small_train_split_and_nothing_else(dataset_dir: Path, tmp_path: Path):
    # 24 train rows at batch 8: 3 optimizer steps per epoch, so 2 epochs are 6 steps and min_steps 10 needs 4 epochs
    raised = make_backbone({**BACKBONE, "pretrain": {**BACKBONE["pretrain"], "min_steps": 10}}, dataset_dir, tmp_path / "raised")
    asked = make_backbone({**BACKBONE, "pretrain": {**BACKBONE["pretrain"], "epochs": 4}}, dataset_dir, tmp_path / "asked")
    log = json.loads((tmp_path / "raised/pretrain_log.json").read_text())
    assert log["epochs_run"] == len(log["loss_by_epoch"]) == 4 and log["options"]["epochs"] == 2
    assert backbone_fingerprint(raised) == backbone_fingerprint(asked)  # the same weights as 4 epochs asked for
    make_backbone({**BACKBONE, "pretrain": {**BACKBONE["pretrain"], "min_steps": 6}}, dataset_dir, tmp_path / "enough")
    assert json.loads((tmp_path / "enough/pretrain_log.json").read_text())["epochs_run"] == 2
    none = make_backbone({**BACKBONE, "pretrain": {**BACKBONE["pretrain"], "epochs": 0, "min_steps": 10}}, dataset_dir, tmp_path / "none")
    random = make_backbone({**BACKBONE, "source": "random"}, dataset_dir, tmp_path / "random")
    assert backbone_fingerprint(none) == backbone_fingerprint(random)  # 0 epochs: the initial weights, not min_steps' worth


@pytest.mark.parametrize(
    ("epochs", "examples", "expected"),
    [(20, 13_200, 20), (10, 13_728, 10), (6, 3_432, 36), (10, 228_800, 10), (0, 3_432, 0), (6, 0, 6)],
)
def test_epochs_to_run_at_the_default_min_steps(epochs: int, examples: int, expected: int):
    # the default data (1,040 steps), the 1024-sample recipe (540), its pilot (6 x 14 = 84 steps: raised to 36 x 14 = 504),
    # the capped RadioML 2018 example; 0 epochs and an empty split are left as they are
    options = entry_defaults("backbones", {**BACKBONE, "pretrain": {"epochs": epochs}})["pretrain"]
    assert options["min_steps"] == 500 and options["batch_size"] == 256
    assert pretrain.epochs_to_run(options, examples) == expected


def test_random_source_is_the_seeded_initializer(dataset_dir: Path, tmp_path: Path):
    make_backbone({**BACKBONE, "source": "random"}, dataset_dir, tmp_path)
    loaded = backbone.load(tmp_path / "backbone.pt")
    fresh = backbone.build(loaded.arch, 0)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), fresh.state_dict().values(), strict=True))


def test_pretraining_never_reads_labels(dataset_dir: Path, tmp_path: Path, monkeypatch):
    scrambled = tmp_path / "scrambled-ds"
    shutil.copytree(dataset_dir, scrambled)
    with h5py.File(scrambled / "train.h5", "r+") as handle:
        handle["label"][...] = -1
    # the edited split no longer matches its sentinel: let the step read it anyway
    monkeypatch.setattr(step_module, "require_intact", lambda *args: {})
    make_backbone(BACKBONE, scrambled, tmp_path / "scrambled")
    make_backbone(BACKBONE, dataset_dir, tmp_path / "real")
    assert sha256_file(tmp_path / "scrambled/backbone.pt") == sha256_file(tmp_path / "real/backbone.pt")


def test_pretraining_gathers_batches_from_a_memory_map(dataset_dir: Path):
    mapped = map_iq(dataset_dir / "train.h5")
    assert isinstance(mapped, np.memmap) and np.array_equal(mapped, read_split(dataset_dir / "train.h5")["iq"])
    spec = entry_defaults("backbones", BACKBONE)
    arch = backbone.BackboneArch(length=mapped.shape[-1], **spec["arch"])
    options = spec["pretrain"]
    from_map, _ = pretrain.pretrain_weights(arch, mapped, options)
    in_memory, _ = pretrain.pretrain_weights(arch, np.array(mapped), options)
    assert all(torch.equal(a, b) for a, b in zip(from_map.state_dict().values(), in_memory.state_dict().values(), strict=True))


def test_import_checks_the_expected_sha256(dataset_dir: Path, tmp_path: Path):
    make_backbone(BACKBONE, dataset_dir, tmp_path / "made")
    source = tmp_path / "made/backbone.pt"
    spec = {"name": "user", "source": "checkpoint", "path": str(source), "sha256": sha256_file(source)}
    import_checkpoint(spec, tmp_path / "imported")
    assert sha256_file(tmp_path / "imported/backbone.pt") == spec["sha256"]
    with pytest.raises(IntegrityError, match="config expects"):
        import_checkpoint({**spec, "sha256": "0" * 64}, tmp_path / "other")
