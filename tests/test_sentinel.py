from pathlib import Path

import numpy as np
import pytest

from rffm import sentinel
from rffm.errors import IntegrityError
from rffm.sentinel import check_record, file_record, parts_record, record_digest


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


def test_parts_record_catches_one_flipped_byte_in_any_part(tmp_path: Path):
    data = tmp_path / "train.h5"
    data.write_bytes(np.random.default_rng(0).bytes(3 << 20))
    record = parts_record(data, [4096, 2 << 20])
    assert (
        set(record) == {"bytes", "parts", "xxh3_128_of_parts"}
        and record_digest(record) == f"xxh3_128_of_parts:{record['xxh3_128_of_parts']}"
    )
    assert check_record(data, record) is None
    for position in (10, (1 << 20) + 12345, (3 << 20) - 1):  # one byte in each part, far from any sampled position
        with open(data, "r+b") as handle:
            handle.seek(position)
            byte = handle.read(1)
            handle.seek(position)
            handle.write(bytes([byte[0] ^ 0x01]))
        assert "xxh3_128_of_parts" in check_record(data, record)
        with open(data, "r+b") as handle:
            handle.seek(position)
            handle.write(byte)
        assert check_record(data, record) is None
    assert record_digest(file_record(data)).startswith("sha256:")
