import os
from pathlib import Path

import pytest
import torch

from rffm import files


def test_atomic_write_leaves_no_temporary_on_failure(tmp_path: Path, monkeypatch):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def broken_replace(*args):
        raise OSError("disk vanished")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        files.atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_canonical_json_is_order_independent():
    assert files.canonical_json({"b": 1, "a": [1, 2]}) == files.canonical_json({"a": [1, 2], "b": 1})


def test_torch_save_bytes_do_not_depend_on_the_file_name(tmp_path: Path):
    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 3}
    files.atomic_torch_save(tmp_path / "a.pt", state)
    files.atomic_torch_save(tmp_path / "other-name.pt", state)
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "other-name.pt").read_bytes()
