"""The check of an exported classifier against rffm's own evaluation, on the validation split (never test): the .pt2
must give rffm's labels; the ONNX program is checked in two halves, its backbone against rffm's FP32 hidden states and
the whole program against rffm's head on its own BF16-rounded states (the rounding is a step: a state within the
kernels' difference of a BF16 midpoint rounds one way here and the other there, so end-to-end labels may differ at a
near tie and are reported, not required). The measurements behind the tolerances: workflow/docs/performance.md, "On RadioML
2018-shaped data", the export paragraph.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from rffm.errors import IntegrityError
from rffm.model.classifier import Classifier, States, rounded
from rffm.model.programs import onnx_bytes
from rffm.records.layout import split_file

# |onnx - rffm| <= atol + rtol * (the example's largest |rffm value|), for every value
ONNX_LOGIT_TOLERANCE = {"atol": 1e-4, "rtol": 1e-3}
ONNX_STATE_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}
CHECK_BATCH = 256


def onnx_session(path: Path):
    """ONNX Runtime on the CPU, one thread, so the figures repeat."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def agreement(reference: np.ndarray, candidate: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """How closely an exported program reproduces rffm's logits and labels on the same examples."""
    predicted = candidate.argmax(axis=1)
    return {
        "examples": int(len(labels)),
        "labels_identical": int((predicted == reference.argmax(axis=1)).sum()),
        "max_abs_logit_difference": float(np.abs(candidate - reference).max()) if len(labels) else 0.0,
        "max_abs_logit": float(np.abs(reference).max()) if len(labels) else 0.0,
        "accuracy": float((predicted == labels).mean()),
    }


def tolerance_used(reference: np.ndarray, candidate: np.ndarray, atol: float, rtol: float) -> float:
    """The largest share of its allowed difference (atol + rtol * its example's largest |value|) any value uses: <= 1 passes."""
    if not reference.size:
        return 0.0
    reference, candidate = reference.reshape(len(reference), -1), candidate.reshape(len(candidate), -1)
    allowed = atol + rtol * np.abs(reference).max(axis=1, keepdims=True)
    return float((np.abs(candidate - reference) / allowed).max())


def check(dataset_dir: Path, module: Classifier, program: Path, onnx_file: Path, recorded: float | None) -> dict[str, Any]:
    """Compare the exported programs with rffm's evaluation on the validation split; refuse a disagreeing export.

    The .pt2 must give rffm's labels. The ONNX program is checked in its two halves (this module's docstring says
    why): its backbone, exported alone for the check, against rffm's FP32 states, and the whole program against rffm's
    head on those states rounded. Batches stream: only logits are kept.
    """
    val = dataset_dir / split_file("val")
    with h5py.File(val, "r") as handle:
        length = int(handle["iq"].shape[-1])
    pt2_module, whole = torch.export.load(program).module(), onnx_session(onnx_file)
    with tempfile.TemporaryDirectory() as scratch:  # the backbone half is the check's, never published
        (Path(scratch) / "states.onnx").write_bytes(onnx_bytes(States(module), length))
        backbone_half = onnx_session(Path(scratch) / "states.onnx")
    logits = {name: [] for name in ("rffm", "pt2", "onnx", "head")}
    state_used, state_max, state_difference, roundings = 0.0, 0.0, 0.0, 0
    with h5py.File(val, "r") as handle, torch.no_grad():
        labels, iq = handle["label"][()], handle["iq"]
        for start in range(0, iq.shape[0], CHECK_BATCH):
            batch = iq[start : start + CHECK_BATCH]
            states = module.states(torch.from_numpy(batch))
            theirs = torch.from_numpy(backbone_half.run(None, {"iq": batch})[0])
            logits["rffm"].append(module.head(rounded(states)).numpy())
            logits["pt2"].append(pt2_module(torch.from_numpy(batch)).numpy())
            logits["onnx"].append(whole.run(["logits"], {"iq": batch})[0])
            logits["head"].append(module.head(rounded(theirs)).numpy())
            state_used = max(state_used, tolerance_used(states.numpy(), theirs.numpy(), **ONNX_STATE_TOLERANCE))
            state_max = max(state_max, float(states.abs().max()))
            state_difference = max(state_difference, float((states - theirs).abs().max()))
            roundings += int((rounded(states) != rounded(theirs)).sum())
    reference, pt2, onnx, head = (np.concatenate(logits[name]) for name in ("rffm", "pt2", "onnx", "head"))
    rffm_accuracy = float((reference.argmax(axis=1) == labels).mean())
    figures = {
        "split": "val",
        "examples": int(len(labels)),
        "rffm_accuracy": rffm_accuracy,
        "selection_recorded_accuracy": recorded,  # train_epoch's, from the cache: equal on CPU (a GPU cache is BF16 autocast)
        "rffm_matches_selection": recorded is not None and abs(rffm_accuracy - recorded) < 1e-12,
        "pt2": agreement(reference, pt2, labels),
        "onnx": {
            **agreement(reference, onnx, labels),  # end to end: what a user of the file sees
            "backbone": {
                "max_abs_state_difference": state_difference,
                "max_abs_state": state_max,
                "state_tolerance": ONNX_STATE_TOLERANCE,
                "tolerance_used": state_used,
                "bf16_roundings_differing": roundings,
            },
            "head": {
                **agreement(head, onnx, labels),
                "logit_tolerance": ONNX_LOGIT_TOLERANCE,
                "tolerance_used": tolerance_used(head, onnx, **ONNX_LOGIT_TOLERANCE),
            },
        },
        "device": "cpu",
    }
    refuse_disagreement(val, figures)
    return figures


def refuse_disagreement(val: Path, figures: dict[str, Any]) -> None:
    """Refuse an export whose .pt2 gives other labels, or whose ONNX halves leave their tolerance (within its tolerance
    a logit can move a label only at a near tie, so the ONNX halves are judged by their logits)."""
    examples, pt2_found = figures["examples"], figures["pt2"]
    backbone, head_found = figures["onnx"]["backbone"], figures["onnx"]["head"]
    states = f"max |state difference| {backbone['max_abs_state_difference']:.3g} on states up to {backbone['max_abs_state']:.3g}"
    head_logits = f"logits within {ONNX_LOGIT_TOLERANCE}"
    refusals = {
        "pt2 program": (pt2_found["labels_identical"] != examples, "identical labels", logit_figures(pt2_found, examples)),
        "ONNX program's backbone": (
            backbone["tolerance_used"] > 1.0,
            f"hidden states within {ONNX_STATE_TOLERANCE}",
            states,
        ),
        "ONNX program's head": (head_found["tolerance_used"] > 1.0, head_logits, logit_figures(head_found, examples)),
    }
    for name, (refused, wanted, measured) in refusals.items():
        if refused:
            raise IntegrityError(
                f"{val}: the exported {name} disagrees with rffm's evaluation ({measured}; wanted {wanted}); nothing was published. "
                "Fix: report it with this line and the torch/onnxruntime versions."
            )


def logit_figures(found: dict[str, Any], examples: int) -> str:
    """An agreement's figures, as a refusal states them."""
    return (
        f"{found['labels_identical']} of {examples} labels identical, max |logit difference| "
        f"{found['max_abs_logit_difference']:.3g} on logits up to {found['max_abs_logit']:.3g}"
    )
