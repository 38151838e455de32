"""A module as files that hold no fact of the machine that wrote them (the same bytes in any checkout with the same
torch): torch.export programs (.pt2; the exported classifier, steps/export.py, and the example backbone,
make_weights.py), ONNX and safetensors."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rffm.records.files import atomic_write_bytes, canonical_json
from rffm.records.layout import PROGRAM_SIGNATURE

ONNX_OPSET = 18


def program_bytes(program: torch.export.ExportedProgram, extra_files: dict[str, str] | None = None) -> bytes:
    """The .pt2 archive of `program` without the exporting host's source paths (the program's stack traces dropped)."""
    for module in program.graph_module.modules():  # nested graphs (control flow) carry stack traces too
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:  # stack traces name this checkout's absolute paths
                node.meta.pop("stack_trace", None)
    buffer = io.BytesIO()  # through memory: a file path would name the archive's records after the file
    torch.export.save(program, buffer, extra_files=extra_files)
    return buffer.getvalue()


def torch_program(module: nn.Module, length: int) -> torch.export.ExportedProgram:
    """The module (IQ [B, 2, length] ->) as a torch.export program with a dynamic batch dimension."""
    example = torch.zeros(2, 2, length)
    try:
        return torch.export.export(module, (example,), dynamic_shapes={"iq": {0: torch.export.Dim("batch", min=1)}}, strict=False)
    except torch._dynamo.exc.UserError:  # a backbone that is itself a program brings its own batch range: keep it
        return torch.export.export(module, (example,), dynamic_shapes={"iq": {0: torch.export.Dim.AUTO}}, strict=False)


def save_program(program: torch.export.ExportedProgram, path: Path, signature: dict[str, Any]) -> None:
    """Write the .pt2 archive with the model's signature inside (no host paths: two checkouts write the same bytes)."""
    atomic_write_bytes(path, program_bytes(program, {PROGRAM_SIGNATURE: canonical_json(signature)}))


def onnx_bytes(module: nn.Module, length: int) -> bytes:
    """The module as ONNX (dynamo exporter, dynamic batch), weights embedded, without host-specific metadata."""
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
    """Every weight of the module (for the classifier: backbone.* and head.*) as safetensors."""
    from safetensors.torch import save

    state = {name: tensor.detach().contiguous() for name, tensor in sorted(module.state_dict().items())}
    return save(state, metadata=metadata)
