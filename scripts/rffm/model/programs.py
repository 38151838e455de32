"""torch.export programs as .pt2 bytes that hold no fact of the machine that exported them: the same bytes in any
checkout with the same torch (the exported classifier, steps/export.py, and the example backbone, make_weights.py)."""

from __future__ import annotations

import io

import torch


def program_bytes(program: torch.export.ExportedProgram, extra_files: dict[str, str] | None = None) -> bytes:
    """The .pt2 archive of `program` without the exporting host's source paths (the program's stack traces dropped)."""
    for module in program.graph_module.modules():  # nested graphs (control flow) carry stack traces too
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:  # stack traces name this checkout's absolute paths
                node.meta.pop("stack_trace", None)
    buffer = io.BytesIO()  # through memory: a file path would name the archive's records after the file
    torch.export.save(program, buffer, extra_files=extra_files)
    return buffer.getvalue()
