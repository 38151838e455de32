from pathlib import Path

import numpy as np
import pytest

from rffm import sentinel
from rffm.errors import IntegrityError


def write_step(directory: Path, payload: bytes = b"hello") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "data.bin").write_bytes(payload)
    outputs = {"data.bin": sentinel.file_record(directory / "data.bin")}
    return sentinel.write_sentinel(directory, "demo", {"k": 1}, outputs, {}, {"p": 1}, "files")


def test_sentinel_bytes_are_deterministic(tmp_path: Path):
    a = write_step(tmp_path / "a").read_bytes()
    b = write_step(tmp_path / "b").read_bytes()
    assert a == b
    assert b"time" not in a and b"host" not in a


def test_require_intact_names_the_changed_file(tmp_path: Path):
    path = write_step(tmp_path / "s")
    (tmp_path / "s/data.bin").write_bytes(b"hellO")
    with pytest.raises(IntegrityError, match=r"(?s)refuses to start.*data\.bin.*sha256"):
        sentinel.require_intact(path, ["data.bin"], "consumer")


def test_missing_sentinel_is_a_clear_error(tmp_path: Path):
    with pytest.raises(IntegrityError, match="sentinel is missing"):
        sentinel.read_sentinel(tmp_path / "sentinel.json")


def test_array_record_detects_a_changed_sampled_row(tmp_path: Path):
    path = tmp_path / "x.bf16"
    array = np.memmap(path, dtype=np.uint16, mode="w+", shape=(100, 4, 8))
    array[:] = np.arange(100 * 32, dtype=np.uint16).reshape(100, 4, 8)
    array.flush()
    record = sentinel.array_record(path, (100, 4, 8), "bfloat16")
    assert record["elements"] == 3200 and record["sampled_rows"] == 64
    assert sentinel.check_record(path, record) is None
    array[0, 0, 0] += 1
    array.flush()
    assert "sampled_sha256" in sentinel.check_record(path, record)


def test_code_digest_follows_rffm_imports(tmp_path: Path, monkeypatch):
    closure = sentinel.code_closure("train")
    assert {"rffm.train", "rffm.cache", "rffm.head", "rffm.sentinel", "rffm.files"} <= set(closure)
    assert "rffm.cli" not in closure and "rffm.qualify" not in closure
    # editing an imported module changes the digest of every step that imports it
    package = tmp_path / "rffm"
    package.mkdir()
    for source in sentinel.PACKAGE_DIR.glob("*.py"):
        (package / source.name).write_text(source.read_text())
    monkeypatch.setattr(sentinel, "PACKAGE_DIR", package)
    before = {step: sentinel.code_digest(step) for step in ("train", "staging")}
    (package / "head.py").write_text((package / "head.py").read_text() + "\n# edited\n")
    assert sentinel.code_digest("train") != before["train"]
    assert sentinel.code_digest("staging") == before["staging"]
