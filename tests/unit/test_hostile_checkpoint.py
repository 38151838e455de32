"""Hostile or broken checkpoints (issue 14): refused in one line naming the file, no code run, no advice to unpickle."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from rffm.errors import IntegrityError
from rffm.model import backbone
from rffm.records.files import sha256_bytes
from rffm.records.store import PosixStore
from rffm.training.artifact import load_head


class Payload:
    """Pickles as a call that would leave a file behind if anything ever unpickled it with code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def hostile_bytes(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"arch": {}, "state_dict": Payload(marker)}, buffer)
    return buffer.getvalue()


def one_line(error: pytest.ExceptionInfo, path: Path) -> str:
    message = str(error.value)
    assert "\n" not in message and str(path) in message, message
    assert "weights_only=False" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("content", ["hostile", "truncated", "not torch"])
def test_a_hostile_or_broken_backbone_is_refused_in_one_line(tmp_path: Path, content: str):
    marker, path = tmp_path / "ran", tmp_path / "backbone.pt"
    data = hostile_bytes(marker)
    path.write_bytes({"hostile": data, "truncated": data[: len(data) // 2], "not torch": b"\x80\x04K\x01."}[content])
    with pytest.raises(IntegrityError) as error:
        backbone.load(path)
    assert "not a loadable rffm backbone checkpoint" in one_line(error, path)
    assert not marker.exists()


def test_a_hostile_artifact_is_refused_in_one_line(tmp_path: Path):
    marker = tmp_path / "ran"
    data = hostile_bytes(marker)
    key = f"artifacts/sha256-{sha256_bytes(data)}.pt"
    store = PosixStore(tmp_path)
    store.create(key, data)
    with pytest.raises(IntegrityError) as error:
        load_head(store, {"key": key, "sha256": sha256_bytes(data)})
    assert "not an rffm head artifact" in one_line(error, tmp_path / key)
    assert not marker.exists()
