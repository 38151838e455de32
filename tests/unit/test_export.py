"""The export step's pieces: torch.export and ONNX programs of the classifier, their bytes, the check that refuses a bad export."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from rffm.config import entry_defaults
from rffm.errors import IntegrityError
from rffm.model import backbone, programs
from rffm.model import encoder as encoders
from rffm.model.classifier import Classifier
from rffm.model.head import AttentionPoolHead, HeadConfig
from rffm.model.taps import spec_for
from rffm.records.layout import EXPORT_ONNX, EXPORT_PROGRAM
from rffm.training import export_check

SCHEMA_ARCH = entry_defaults("backbones", {"source": "random"})["arch"]  # the defaults live only in the schema
SMALL = {"length": 32, "patch": 8, "dim": 8, "depth": 1, "heads": 2, "stem": "iq", "output_layers": 1}
ARCH = backbone.BackboneArch(**{**SCHEMA_ARCH, **SMALL})
HEAD_DEFAULTS = entry_defaults("runs", {"train": {}})["train"]["head"]


def classifier(seed: int) -> Classifier:
    model = backbone.build(ARCH, seed).eval()
    encoder = encoders.Encoder(model, "test", spec_for({}), "backbones.test", native_layers=1, length=ARCH.length)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = AttentionPoolHead(HeadConfig(dim=8, classes=3, layers=1, **{**HEAD_DEFAULTS, "hidden": 16})).eval()
    return Classifier(encoder, head).eval().requires_grad_(False)


def val_split(path: Path, count: int = 40) -> Path:
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as handle:
        handle["iq"] = (rng.standard_normal((count, 2, ARCH.length)) * rng.uniform(0.1, 10, (count, 1, 1))).astype(np.float32)
        handle["label"] = rng.integers(0, 3, count)
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("export")
    module = classifier(0)
    programs.save_program(programs.torch_program(module, ARCH.length), folder / EXPORT_PROGRAM, {"classes": ["a", "b", "c"]})
    (folder / EXPORT_ONNX).write_bytes(programs.onnx_bytes(module, ARCH.length))
    return folder


def test_the_programs_agree_with_the_module_at_any_batch_size(written: Path, tmp_path: Path):
    module, val = classifier(0), val_split(tmp_path / "val.h5")
    figures = export_check.check(tmp_path, module, written / EXPORT_PROGRAM, written / EXPORT_ONNX, recorded=None)
    assert figures["pt2"]["labels_identical"] == figures["onnx"]["labels_identical"] == 40
    assert figures["pt2"]["max_abs_logit_difference"] == 0.0
    backbone_half, head = figures["onnx"]["backbone"], figures["onnx"]["head"]
    assert backbone_half["state_tolerance"] == export_check.ONNX_STATE_TOLERANCE == {"atol": 1e-5, "rtol": 1e-4}
    assert 0.0 < backbone_half["max_abs_state_difference"] <= 1e-5 + 1e-4 * backbone_half["max_abs_state"]
    assert 0.0 <= backbone_half["tolerance_used"] <= 1.0 and backbone_half["bf16_roundings_differing"] >= 0
    assert head["logit_tolerance"] == export_check.ONNX_LOGIT_TOLERANCE == {"atol": 1e-4, "rtol": 1e-3}
    assert 0.0 <= head["tolerance_used"] <= 1.0 and head["labels_identical"] == 40
    assert figures["onnx"]["max_abs_logit_difference"] <= 1e-4 + 1e-3 * figures["onnx"]["max_abs_logit"]
    program = torch.export.load(written / EXPORT_PROGRAM).module()
    with h5py.File(val, "r") as handle:
        iq = torch.from_numpy(handle["iq"][:7])
    for batch in (1, 3, 7):  # the batch dimension is dynamic; the BF16 rounding of the hidden states is inside
        assert torch.equal(program(iq[:batch]), module(iq[:batch]))


def test_exports_repeat_byte_for_byte_and_name_no_host_path(written: Path, tmp_path: Path):
    module = classifier(0)
    programs.save_program(programs.torch_program(module, ARCH.length), tmp_path / EXPORT_PROGRAM, {"classes": ["a", "b", "c"]})
    assert (tmp_path / EXPORT_PROGRAM).read_bytes() == (written / EXPORT_PROGRAM).read_bytes()
    assert programs.onnx_bytes(module, ARCH.length) == (written / EXPORT_ONNX).read_bytes()
    weights = programs.weights_bytes(module, {"rffm": "{}"})
    assert weights == programs.weights_bytes(classifier(0), {"rffm": "{}"})
    here = str(Path(programs.__file__).resolve().parents[2]).encode()  # this checkout's scripts/ folder
    for name in (EXPORT_PROGRAM, EXPORT_ONNX):
        assert here not in (written / name).read_bytes(), f"{name} names {here.decode()}"


def test_a_disagreeing_export_is_refused(written: Path, tmp_path: Path):
    val_split(tmp_path / "val.h5")
    with pytest.raises(IntegrityError, match=r"the exported pt2 program disagrees with rffm's evaluation \(\d+ of 40 labels identical"):
        export_check.check(tmp_path, classifier(1), written / EXPORT_PROGRAM, written / EXPORT_ONNX, recorded=None)


def test_an_onnx_file_of_another_classifier_is_refused_by_its_head_half(written: Path, tmp_path: Path):
    """The backbone half is exported from the module under check; the ONNX file under test must match rffm's head on it."""
    val_split(tmp_path / "val.h5")
    other = classifier(1)
    programs.save_program(programs.torch_program(other, ARCH.length), tmp_path / EXPORT_PROGRAM, {"classes": ["a", "b", "c"]})
    with pytest.raises(IntegrityError, match=r"the exported ONNX program's head disagrees with rffm's evaluation \(\d+ of 40 labels"):
        export_check.check(tmp_path, other, tmp_path / EXPORT_PROGRAM, written / EXPORT_ONNX, recorded=None)


def test_the_onnx_tolerance_scales_with_each_examples_logits():
    reference = np.array([[18.0, 1.9, -3.0], [0.01, -0.02, 0.0]], dtype=np.float32)
    near = reference + np.array([[6e-4, 6e-4, 0.0], [0.0, 5e-5, 0.0]], dtype=np.float32)  # the default run's case
    assert export_check.tolerance_used(reference, near, **export_check.ONNX_LOGIT_TOLERANCE) < 1.0
    far = reference + np.array([[0.0, 0.0, 0.0], [3e-4, 0.0, 0.0]], dtype=np.float32)  # small logits: atol rules
    assert export_check.tolerance_used(reference, far, **export_check.ONNX_LOGIT_TOLERANCE) > 1.0
