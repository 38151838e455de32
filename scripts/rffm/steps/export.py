"""export: the qualified classifier (normalisation, frozen backbone, selected head) as one deployable program.

Writes runs/<run>/export/: model.pt2 (a torch.export program, dynamic batch >= 1), model.onnx (the same
graph for ONNX runtimes), weights.safetensors (every weight of the classifier) and model_card.json.
Each file is also published create-only under its sha256 in the results store's exports/ folder
(like the selected artifacts: no rule's output, so Snakemake never deletes an exported model a
deployment names). The programs are checked, never assumed: on the validation split (never test)
their predictions are compared with rffm's own evaluation of the artifact (the rffm modules, as
qualify runs them), and the figures go into the model card. Everything runs on the CPU, so two
clean runs write the same bytes.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch import nn

from rffm.errors import IntegrityError
from rffm.model import encoder as encoders
from rffm.model.head import AttentionPoolHead
from rffm.model.programs import program_bytes
from rffm.records.files import atomic_write_bytes, canonical_json, sha256_bytes
from rffm.records.layout import MANIFEST_NAME, SENTINEL_NAME, export_name, split_file
from rffm.records.step import Step
from rffm.records.store import Store, create_addressed, given_store
from rffm.training.artifact import load_head as load_artifact

RULE = "export"
PROGRAM, ONNX, WEIGHTS, CARD = "model.pt2", "model.onnx", "weights.safetensors", "model_card.json"
SIGNATURE = "rffm_signature.json"  # the model's own description, inside the .pt2 (torch.export.load(extra_files=...))
ONNX_OPSET = 18
# How far ONNX Runtime may lie from PyTorch, checked in two places. The program rounds the backbone's hidden states to
# BF16 (as the cache stored them), and rounding is a step: a state whose FP32 value lies within the kernels' difference
# of a BF16 midpoint rounds one way here and the other way there (measured on the 1024-sample rf-multirate backbone:
# 11,764 of 33.5 M states, in every example; one label at a top-two margin of 4e-6 flipped). So the backbone (before
# the rounding) and the head (on the program's own rounded states) are each compared within FP32 tolerance, and the
# end-to-end labels and logits are reported. Each tolerance scales with the example's values as a whole: for every x,
# |onnx - rffm| <= atol + rtol * (the example's largest |rffm x|). An absolute 1e-4 alone refused the default run's
# head (a logit of 1.9 off by 6.1e-4 in an example whose logits reach 18.6).
ONNX_LOGIT_TOLERANCE = {"atol": 1e-4, "rtol": 1e-3}
ONNX_STATE_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}  # measured: 2.9e-6 on states up to 3.75 (1024 samples, 4 layers)
CHECK_BATCH = 256
LAYOUT = "float32 [batch >= 1, 2, length]: I then Q samples, channels first"
NORMALISATION = (
    "inside the program: per-example unit RMS of the IQ window (iq / sqrt(mean(iq^2))); the backbone's hidden "
    "states are rounded to BF16 as the training cache stored them, and the head computes in FP32"
)
ADAPTER_NORMALISATION = {
    "none": "none: the IQ window as staged",
    "rms": "per-example unit RMS of the IQ window",
    "peak": "per-example unit peak magnitude of the IQ window",
}


def normalisation(blob: dict[str, Any]) -> str:
    """What the program does to its input before the backbone: the native backbone's own RMS, or the adapter's."""
    adapter = blob.get("adapter") or {}
    if blob.get("native") and adapter.get("normalize", "none") == "none":
        return NORMALISATION  # the in-workflow backbone normalises inside itself
    how = ADAPTER_NORMALISATION.get(adapter.get("normalize"), adapter.get("normalize"))
    return (
        f"inside the program: {how}, then the backbone's input layout {adapter.get('layout')}; the tapped hidden states "
        "are rounded to BF16 as the training cache stored them, and the head computes in FP32"
    )


class Classifier(nn.Module):
    """IQ [B, 2, L] -> logits [B, classes]: the encoder (adapter, backbone, taps, keep), BF16-rounded features, the head."""

    def __init__(self, encoder: encoders.Encoder, head: AttentionPoolHead):
        super().__init__()
        self.backbone, self.head = encoder.model, head  # registered: their weights are the program's
        self.encoder = encoder  # the one way the backbone is called, as build_cache and qualify call it

    def states(self, iq: torch.Tensor) -> torch.Tensor:
        """The cache row the head reads, in FP32 (before the BF16 rounding)."""
        return encoders.as_row(self.encoder.features(iq))

    def forward(self, iq: torch.Tensor) -> torch.Tensor:
        return self.head(rounded(self.states(iq)))


def rounded(states: torch.Tensor) -> torch.Tensor:
    """What train_epoch read from the cache: the states rounded to BF16, computed on in FP32."""
    return states.to(torch.bfloat16).float()


class States(nn.Module):
    """IQ -> the classifier's FP32 hidden states: exported only to check the backbone half of the ONNX program."""

    def __init__(self, classifier: Classifier):
        super().__init__()
        self.classifier = classifier
        self.training = False  # as classifier_module: a torch.export backbone refuses train(), so never .eval()

    def forward(self, iq: torch.Tensor) -> torch.Tensor:
        return self.classifier.states(iq)


def classifier_module(
    backbone_dir: str | Path, cached: dict[str, Any], results: Store, artifact: dict[str, Any], length: int
) -> tuple[Classifier, dict[str, Any]]:
    """The one place the classifier is built from rffm's classes: (IQ [B, 2, L] -> logits module, the artifact's metadata).

    `cached` is the cache record (the encoder the head was trained behind, as qualify rebuilds it);
    `artifact` the selection's record of the head ({key, sha256} in the results store); the metadata
    gains `length`, the IQ window the backbone reads (the staged examples' when the backbone does not say).
    """
    head, blob = load_artifact(results, artifact)
    spec = cached["encoder"]
    encoder = encoders.load(cached["backbone"], Path(backbone_dir) / "backbone.pt", spec["spec"], spec["where"], "cpu")
    if encoder.identity != spec["fingerprint"] or blob["backbone_fingerprint"] != encoder.fingerprint:
        raise IntegrityError(f"{results.where(artifact['key'])}: trained behind another encoder than {backbone_dir}. Fix: rerun selection.")
    module = Classifier(encoder, head.eval())
    module.training = False  # not .eval(): a torch.export backbone refuses train(); every kind is loaded in eval mode
    module.requires_grad_(False)
    native = cached["backbone"]["source"] in encoders.NATIVE
    return module, {**blob, "length": encoder.length or length, "adapter": spec["spec"]["adapter"], "native": native}


def torch_program(module: nn.Module, length: int) -> torch.export.ExportedProgram:
    """The classifier as a torch.export program with a dynamic batch dimension."""
    example = torch.zeros(2, 2, length)
    try:
        return torch.export.export(module, (example,), dynamic_shapes={"iq": {0: torch.export.Dim("batch", min=1)}}, strict=False)
    except torch._dynamo.exc.UserError:  # a backbone that is itself a program brings its own batch range: keep it
        return torch.export.export(module, (example,), dynamic_shapes={"iq": {0: torch.export.Dim.AUTO}}, strict=False)


def save_program(program: torch.export.ExportedProgram, path: Path, signature: dict[str, Any]) -> None:
    """Write the .pt2 archive with the model's signature inside (no host paths: two checkouts write the same bytes)."""
    atomic_write_bytes(path, program_bytes(program, {SIGNATURE: canonical_json(signature)}))


def onnx_bytes(module: nn.Module, length: int) -> bytes:
    """The classifier as ONNX (dynamo exporter, dynamic batch), weights embedded, without host-specific metadata."""
    import onnx

    example = torch.zeros(2, 2, length)
    exported = torch.onnx.export(
        module,
        (example,),
        input_names=["iq"],
        output_names=["logits"],
        dynamic_shapes={"iq": {0: torch.export.Dim("batch", min=1)}},
        opset_version=ONNX_OPSET,
        dynamo=True,
        external_data=False,
        verbose=False,
    )
    model = exported.model_proto
    strip_metadata(model)
    onnx.checker.check_model(model)
    return model.SerializeToString(deterministic=True)


def strip_metadata(model) -> None:
    """Drop the exporter's per-node metadata (stack traces, source paths): facts of the host, not of the model."""

    def clean(graph) -> None:
        for node in graph.node:
            del node.metadata_props[:]
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    clean(attribute.g)
        for proto in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
            if hasattr(proto, "metadata_props"):
                del proto.metadata_props[:]

    clean(model.graph)
    del model.metadata_props[:]


def weights_bytes(module: nn.Module, metadata: dict[str, str]) -> bytes:
    """Every weight of the classifier (backbone.* and head.*) as safetensors."""
    from safetensors.torch import save

    state = {name: tensor.detach().contiguous() for name, tensor in sorted(module.state_dict().items())}
    return save(state, metadata=metadata)


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

    The .pt2 must give rffm's labels. The ONNX program is checked in its two halves (the comment at
    ONNX_LOGIT_TOLERANCE says why): its backbone, exported alone for the check, against rffm's FP32 states, and the
    whole program against rffm's head on those states rounded. Batches stream: only logits are kept.
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
    pt2_found, head_found = figures["pt2"], figures["onnx"]["head"]
    refusals = {  # within its tolerance a logit can move a label only at a near tie, so the ONNX halves check logits
        "pt2 program": (pt2_found["labels_identical"] != len(labels), "identical labels", logit_figures(pt2_found, len(labels))),
        "ONNX program's backbone": (
            state_used > 1.0,
            f"hidden states within {ONNX_STATE_TOLERANCE}",
            f"max |state difference| {state_difference:.3g} on states up to {state_max:.3g}",
        ),
        "ONNX program's head": (
            head_found["tolerance_used"] > 1.0,
            f"logits within {ONNX_LOGIT_TOLERANCE}",
            logit_figures(head_found, len(labels)),
        ),
    }
    for name, (refused, wanted, measured) in refusals.items():
        if refused:
            raise IntegrityError(
                f"{val}: the exported {name} disagrees with rffm's evaluation ({measured}; wanted {wanted}); nothing was published. "
                "Fix: report it with this line and the torch/onnxruntime versions."
            )
    return figures


def logit_figures(found: dict[str, Any], examples: int) -> str:
    """An agreement's figures, as a refusal states them."""
    return (
        f"{found['labels_identical']} of {examples} labels identical, max |logit difference| "
        f"{found['max_abs_logit_difference']:.3g} on logits up to {found['max_abs_logit']:.3g}"
    )


def publish(results: Store, out_dir: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Put each file create-only under its sha256 in the store's exports/ folder: {name: {key, bytes, sha256}}."""
    published = {}
    for name in names:
        data = (out_dir / name).read_bytes()
        published[name] = create_addressed(results, export_name(sha256_bytes(data), Path(name).suffix), data, "file")
    return published


def run(
    spec: dict[str, Any],
    qualification_dir: str | Path,
    selection_dir: str | Path,
    dataset_dir: str | Path,
    backbone_dir: str | Path,
    cache_record_dir: str | Path,
    out_dir: str | Path,
    *,
    store: str | Path | None = None,
) -> Path:
    """Export the run's qualified classifier, check it on the validation split and publish it."""
    qualification_dir, selection_dir, dataset_dir, backbone_dir = map(Path, (qualification_dir, selection_dir, dataset_dir, backbone_dir))
    params = {"onnx_opset": ONNX_OPSET, "onnx_logit_tolerance": ONNX_LOGIT_TOLERANCE}
    with Step(RULE, out_dir, key={"run": spec["run"]}, params=params) as step:
        out_dir = step.out_dir
        results = given_store(store, RULE)
        qualified = step.consume("qualification", qualification_dir / SENTINEL_NAME, [MANIFEST_NAME])
        chosen = step.consume("selection", selection_dir / SENTINEL_NAME, ["selection.json", "model_card.json"])
        weights = step.consume("backbone", backbone_dir / SENTINEL_NAME, ["backbone.pt"])
        dataset = step.consume("dataset", dataset_dir / SENTINEL_NAME, [split_file("val")])["dataset"]  # never the test split
        cached = step.consume("cache", Path(cache_record_dir) / SENTINEL_NAME)  # the encoder the head was trained behind
        with h5py.File(dataset_dir / split_file("val"), "r") as handle:
            rate, origin = (decode(handle.attrs.get(name)) for name in ("sample_rate", "source"))
            staged_length = int(handle["iq"].shape[-1])
        module, blob = classifier_module(backbone_dir, cached, results, chosen["artifact"], staged_length)
        selection = chosen["selection"]
        with contextlib.suppress(TypeError, ValueError):
            origin = json.loads(origin)
        signature = {
            "format": "rffm-classifier/1",
            "classes": blob["classes"],
            "input": {"name": "iq", "layout": LAYOUT, "length": blob["length"], "normalisation": normalisation(blob)},
            "output": {"name": "logits", "layout": "float32 [batch, classes]; softmax gives class probabilities"},
            "sample_rate_hz": rate if isinstance(rate, float) and np.isfinite(rate) and rate > 0 else None,
        }
        save_program(torch_program(module, blob["length"]), out_dir / PROGRAM, signature)
        atomic_write_bytes(out_dir / ONNX, onnx_bytes(module, blob["length"]))
        # one metadata key: safetensors keeps metadata in a hash map, so several keys come out in a per-process order
        tags = {"rffm": canonical_json({"format": signature["format"], "classes": blob["classes"]})}
        atomic_write_bytes(out_dir / WEIGHTS, weights_bytes(module, tags))
        recorded = recorded_val_accuracy(qualification_dir / MANIFEST_NAME, selection["epoch"])
        figures = check(dataset_dir, module, out_dir / PROGRAM, out_dir / ONNX, recorded)
        files = publish(results, out_dir, [PROGRAM, ONNX, WEIGHTS])
        card = {
            **signature,
            "run": spec["run"],
            "dataset": {"name": dataset["name"], "source": origin, "sentinel_sha256": step.inputs["dataset"]["sha256"]},
            "backbone": {"name": spec["backbone"], "fingerprint": weights["backbone"]["fingerprint"]},
            "artifact": {"key": chosen["artifact"]["key"], "sha256": selection["artifact_sha256"]},
            "head_config": blob["head_config"],
            "selection": {k: selection[k] for k in ("metric", "mode", "epoch", "value", "rule")},
            "validation_check": figures,
            "qualification": qualified.get("qualification"),
            "files": files,
        }
        atomic_write_bytes(out_dir / CARD, canonical_json(card).encode(), mode=0o444)
        for name in (PROGRAM, ONNX, WEIGHTS, CARD):
            step.output(name)
        step.facts.update({"backbone_fingerprint": weights["backbone"]["fingerprint"], "exported": files, "validation_check": figures})
    return step.sentinel


def recorded_val_accuracy(manifest: Path, epoch: int) -> float | None:
    """The validation accuracy train_epoch recorded for the selected epoch (the manifest lists every epoch's)."""
    epochs = json.loads(manifest.read_text())["training"]["epochs"]
    return next((e.get("val_accuracy") for e in epochs if e["epoch"] == epoch), None)


def decode(value: Any) -> Any:
    """An HDF5 attribute as a plain value (bytes as text, numpy scalars as Python numbers)."""
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if isinstance(value, np.generic) else value
