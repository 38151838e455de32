"""The check of an exported classifier against rffm's own evaluation, on the validation split (never test): the .pt2 must
give rffm's logits bit for bit (it runs the same kernels on the same CPU); the ONNX file is checked in two halves, its
backbone (the file's own hidden states, read at the input of its BF16 rounding) against rffm's FP32 states, and the
whole file against rffm's head on those states rounded. The rounding is a step: a state within the kernels' difference
of a BF16 midpoint rounds one way here and the other there, so an end-to-end label may differ at a near tie, and only
there: it is counted where rffm's own top-two margin is within the rounding bound, refused where it is not.
Rounding bound (per example): sum over its states of |d margin / d state| x the BF16 spacing at that state (to first
order, the most that rounding every state to its other BF16 neighbour moves the margin) + twice the head's logit tolerance.
The ONNX head's tolerance is measured by the check itself, per export: FP32's own error on these states (rffm's head
in FP32 against the same head in FP64), times FORMAT_ERROR_FACTOR, relative to each example's largest logit; a file
whose head is off by more than ten times the arithmetic's own error is another head. Both figures go into the model card.
The measurements behind the tolerances: workflow/docs/performance.md, "On RadioML 2018-shaped data", the export paragraph.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from rffm.errors import IntegrityError
from rffm.model.classifier import Classifier, rounded
from rffm.records.layout import split_file

# |onnx - rffm| <= atol + rtol * (the example's largest |rffm value|), for every value; the logit one bounds only the
# end-to-end near ties (end_to_end), the head itself is held to its measured FP32 error (head_tolerance)
ONNX_LOGIT_TOLERANCE = {"atol": 1e-4, "rtol": 1e-3}
FORMAT_ERROR_FACTOR = 10.0
ONNX_STATE_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}
CHECK_BATCH = 256


def onnx_session(model: Path | bytes):
    """ONNX Runtime on the CPU, one thread, so the figures repeat."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(model if isinstance(model, bytes) else str(model), options, providers=["CPUExecutionProvider"])


def with_states(onnx_file: Path) -> tuple[bytes, str | None]:
    """The ONNX file with its hidden states as a second output: the input of its BF16 rounding (the last Cast to
    bfloat16 read back as float; the head after it computes in FP32). None: the file rounds nothing."""
    import onnx

    model = onnx.load(str(onnx_file))
    casts = {node.output[0]: node for node in model.graph.node if node.op_type == "Cast"}
    states = None
    for node in casts.values():
        to_bf16 = casts.get(node.input[0])
        if cast_to(node) == onnx.TensorProto.FLOAT and to_bf16 is not None and cast_to(to_bf16) == onnx.TensorProto.BFLOAT16:
            states = to_bf16.input[0]
    if states is not None:
        model.graph.output.append(onnx.helper.make_tensor_value_info(states, onnx.TensorProto.FLOAT, None))
    return model.SerializeToString(), states


def cast_to(node) -> int | None:
    """The element type an ONNX Cast node casts to."""
    return next((attribute.i for attribute in node.attribute if attribute.name == "to"), None)


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
    if reference.shape != candidate.shape:
        return float("inf")
    if not reference.size:
        return 0.0
    reference, candidate = reference.reshape(len(reference), -1), candidate.reshape(len(candidate), -1)
    allowed = atol + rtol * np.abs(reference).max(axis=1, keepdims=True)
    return float((np.abs(candidate - reference) / allowed).max())


def head_tolerance(fp32: np.ndarray, fp64: np.ndarray) -> dict[str, Any]:
    """The ONNX head's logit tolerance measured on these examples: FORMAT_ERROR_FACTOR x FP32's largest error relative
    to an example's largest |logit| (FP32 head against the FP64 one), never below FORMAT_ERROR_FACTOR FP32 ulps."""
    scale = np.abs(fp64).max(axis=1) if fp64.size else np.zeros(0)
    relative = float((np.abs(fp32 - fp64).max(axis=1) / np.maximum(scale, np.finfo(np.float64).tiny)).max()) if fp64.size else 0.0
    measured = max(relative, float(np.finfo(np.float32).eps))
    return {
        "atol": 0.0,
        "rtol": FORMAT_ERROR_FACTOR * measured,
        "fp32_relative_error": relative,
        "factor": FORMAT_ERROR_FACTOR,
        "measured_as": "rffm's head in FP32 against the same head in FP64, on the file's own hidden states",
    }


def bf16_spacing(values: torch.Tensor) -> torch.Tensor:
    """The BF16 step at each value (8 significant bits: 2^(exponent - 8) for |value| in [2^(exponent-1), 2^exponent);
    the larger of the two steps at a power of two, and 2^-8 at 0: never less than the step a rounding flip makes)."""
    return torch.ldexp(torch.ones_like(values), torch.frexp(values).exponent - 8)


def rounding_bound(head: torch.nn.Module, states: torch.Tensor) -> np.ndarray:
    """Per example, the most (to first order) that rounding every one of its states to the other BF16 neighbour moves
    rffm's top-two logit margin: sum |d margin / d state| x the BF16 step (the head reads each example alone)."""
    rounded_states = rounded(states).requires_grad_(True)
    with torch.enable_grad():
        top_two = head(rounded_states).topk(2, dim=1).values
        (gradient,) = torch.autograd.grad((top_two[:, 0] - top_two[:, 1]).sum(), rounded_states)
    return (gradient.abs() * bf16_spacing(rounded_states.detach())).reshape(len(states), -1).sum(dim=1).numpy()


def end_to_end(reference: np.ndarray, candidate: np.ndarray, bound: np.ndarray) -> dict[str, Any]:
    """The end-to-end label differences and how many of them lie where rffm's top-two margin is within the rounding
    bound plus twice the head's logit tolerance (the module docstring); bound_used > 1: one lies outside (refused)."""
    ranked = np.sort(reference, axis=1)
    margin = ranked[:, -1] - ranked[:, -2]
    logit_tolerance = ONNX_LOGIT_TOLERANCE["atol"] + ONNX_LOGIT_TOLERANCE["rtol"] * np.abs(reference).max(axis=1)
    allowed = bound + 2 * logit_tolerance
    differing = candidate.argmax(axis=1) != reference.argmax(axis=1)
    return {
        "labels_differing": int(differing.sum()),
        "differing_within_rounding_bound": int((differing & (margin <= allowed)).sum()),
        "largest_margin_differing": float(margin[differing].max()) if differing.any() else 0.0,
        "bound_used": float((margin / allowed)[differing].max()) if differing.any() else 0.0,
        "largest_rounding_bound": float(allowed.max()) if len(allowed) else 0.0,
    }


def check(dataset_dir: Path, module: Classifier, program: Path, onnx_file: Path, recorded: float | None, *, run: str) -> dict[str, Any]:
    """Compare the exported programs with rffm's evaluation on the validation split; refuse a disagreeing export of `run`.

    The .pt2 must give rffm's labels. The ONNX file is checked in its two halves (this module's docstring says why):
    its own hidden states against rffm's FP32 states, and its logits against rffm's head on those states rounded; its
    end-to-end labels may differ only within the rounding bound. Batches stream: only logits are kept.
    """
    val = dataset_dir / split_file("val")
    pt2_module = torch.export.load(program).module()
    whole, states_name = with_states(onnx_file)
    if states_name is None:
        raise IntegrityError(
            f"{onnx_file}: the exported ONNX program does not round its hidden states to BF16 as rffm's head read them "
            f"(no Cast to bfloat16 read back as float); nothing was published. {fix(run)}"
        )
    session = onnx_session(whole)
    logits = {name: [] for name in ("rffm", "pt2", "onnx", "head", "head64")}
    head64 = copy.deepcopy(module.head).double()
    bounds = []
    state_used, state_max, state_difference, roundings = 0.0, 0.0, 0.0, 0
    with h5py.File(val, "r") as handle, torch.no_grad():
        labels, iq = handle["label"][()], handle["iq"]
        for start in range(0, iq.shape[0], CHECK_BATCH):
            batch = iq[start : start + CHECK_BATCH]
            states = module.states(torch.from_numpy(batch))
            onnx_logits, theirs = session.run(["logits", states_name], {"iq": batch})
            logits["rffm"].append(module.head(rounded(states)).numpy())
            logits["pt2"].append(pt2_module(torch.from_numpy(batch)).numpy())
            logits["onnx"].append(onnx_logits)
            bounds.append(rounding_bound(module.head, states))
            used = tolerance_used(states.numpy(), theirs, **ONNX_STATE_TOLERANCE)
            state_used, state_max = max(state_used, used), max(state_max, float(states.abs().max()))
            if used == float("inf"):  # another shape: the file's hidden states are not rffm's
                continue
            theirs = torch.from_numpy(theirs)
            logits["head"].append(module.head(rounded(theirs)).numpy())
            logits["head64"].append(head64(rounded(theirs).double()).numpy())
            state_difference = max(state_difference, float((states - theirs).abs().max()))
            roundings += int((rounded(states) != rounded(theirs)).sum())
    backbone = {"max_abs_state_difference": state_difference, "max_abs_state": state_max, "state_tolerance": ONNX_STATE_TOLERANCE}
    backbone |= {"tolerance_used": state_used, "bf16_roundings_differing": roundings}
    figures = figures_of(logits, labels, recorded, backbone, np.concatenate(bounds))
    refuse_disagreement(val, figures, run)
    return figures


def figures_of(logits: dict[str, list], labels: np.ndarray, recorded: float | None, backbone: dict, bounds: np.ndarray) -> dict[str, Any]:
    """The check's figures, as the model card records them: rffm's own accuracy, the .pt2's agreement and the ONNX
    file's, end to end and by halves (its backbone's states, its head's logits on them)."""
    reference, pt2, onnx = (np.concatenate(logits[name]) for name in ("rffm", "pt2", "onnx"))
    complete = len(logits["head"]) == len(logits["rffm"])
    head = np.concatenate(logits["head"]) if complete else np.full_like(onnx, np.nan)
    head64 = np.concatenate(logits["head64"]) if complete else np.full(onnx.shape, np.nan)
    rffm_accuracy = float((reference.argmax(axis=1) == labels).mean())
    tolerance = head_tolerance(head, head64)
    head_figures = {**agreement(head, onnx, labels), "logit_tolerance": tolerance}
    head_figures["tolerance_used"] = tolerance_used(head, onnx, tolerance["atol"], tolerance["rtol"])
    return {
        "split": "val",
        "examples": int(len(labels)),
        "rffm_accuracy": rffm_accuracy,
        "selection_recorded_accuracy": recorded,  # train_epoch's, from the cache: equal on CPU (a GPU cache is BF16 autocast)
        "rffm_matches_selection": recorded is not None and abs(rffm_accuracy - recorded) < 1e-12,
        "pt2": agreement(reference, pt2, labels),
        "onnx": {
            **agreement(reference, onnx, labels),  # end to end: what a user of the file sees
            "backbone": backbone,
            "head": head_figures,
            "end_to_end": end_to_end(reference, onnx, bounds),
        },
        "device": "cpu",
    }


def fix(run: str) -> str:
    """What a refused export leaves to its user: the run without its export, and a report."""
    return (
        f"Fix: set runs.{run}.export: false to finish without the export (the run's qualified results stand), "
        "and report this line with `pip show torch onnxruntime`."
    )


def refuse_disagreement(val: Path, figures: dict[str, Any], run: str) -> None:
    """Refuse an export whose .pt2 gives other labels, whose ONNX halves leave their tolerance (within its tolerance
    a logit can move a label only at a near tie, so the halves are judged by their logits), or whose ONNX labels
    differ end to end where rffm's top-two margin is beyond the BF16 rounding bound."""
    examples, pt2_found = figures["examples"], figures["pt2"]
    backbone, head_found, whole = figures["onnx"]["backbone"], figures["onnx"]["head"], figures["onnx"]["end_to_end"]
    states = f"max |state difference| {backbone['max_abs_state_difference']:.3g} on states up to {backbone['max_abs_state']:.3g}"
    if backbone["tolerance_used"] == float("inf"):
        states = "hidden states of another shape than rffm's"
    beyond = whole["labels_differing"] - whole["differing_within_rounding_bound"]
    labels = (
        f"{whole['labels_differing']} of {examples} labels differ, {beyond} where rffm's top-two margin (up to "
        f"{whole['largest_margin_differing']:.3g}) is beyond the BF16 rounding bound"
    )
    refusals = {
        "pt2 program": (pt2_found["max_abs_logit_difference"] != 0.0, "bit-identical logits", logit_figures(pt2_found, examples)),
        "ONNX program's backbone": (backbone["tolerance_used"] > 1.0, f"hidden states within {ONNX_STATE_TOLERANCE}", states),
        "ONNX program's head": (
            not head_found["tolerance_used"] <= 1.0,
            f"logits within {head_found['logit_tolerance']['rtol']:.3g} of each example's largest "
            f"(x{FORMAT_ERROR_FACTOR:g} FP32's measured error)",
            logit_figures(head_found, examples),
        ),
        "ONNX program end to end": (beyond > 0, "labels differing only within the BF16 rounding bound", labels),
    }
    for name, (refused, wanted, measured) in refusals.items():
        if refused:
            raise IntegrityError(
                f"{val}: the exported {name} disagrees with rffm's evaluation ({measured}; wanted {wanted}); "
                f"nothing was published. {fix(run)}"
            )


def logit_figures(found: dict[str, Any], examples: int) -> str:
    """An agreement's figures, as a refusal states them."""
    return (
        f"{found['labels_identical']} of {examples} labels identical, max |logit difference| "
        f"{found['max_abs_logit_difference']:.3g} on logits up to {found['max_abs_logit']:.3g}"
    )
