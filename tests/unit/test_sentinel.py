from pathlib import Path

import numpy as np
import pytest

from rffm.errors import IntegrityError
from rffm.records import sentinel
from rffm.records.sentinel import check_record, file_record, parts_record, record_digest
from rffm.records.step import Step


def write_step(directory: Path, payload: bytes = b"hello") -> Path:
    with Step("demo", directory, key={"k": 1}, params={"p": 1}, code="records.files") as step:
        (directory / "data.bin").write_bytes(payload)
        step.output("data.bin")
    return step.sentinel


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


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda text: text.replace('"stage"', '"stag"'), "does not match its own sha256"),
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: "[]", "has no self_sha256"),
        (lambda text: text.replace('"k": 1', '"k": 2'), "does not match its own sha256"),
    ],
)
def test_an_edited_truncated_or_foreign_sentinel_is_one_clear_error(tmp_path: Path, damage, message):
    path = write_step(tmp_path / "s")
    path.write_text(damage(path.read_text()))
    with pytest.raises(IntegrityError, match=message) as error:
        sentinel.read_sentinel(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_a_consumer_refuses_a_sentinel_whose_upstream_changed_since(tmp_path: Path):
    upstream = write_step(tmp_path / "up")
    with Step("down", tmp_path / "down", key={}, params={}, code="records.files") as step:
        step.consume("up", upstream, ["data.bin"])
    assert sentinel.require_intact(tmp_path / "down/sentinel.json", [], "next")
    write_step(tmp_path / "up", b"another run")  # the upstream step ran again with other results
    with pytest.raises(IntegrityError, match="changed since this step consumed it"):
        sentinel.require_intact(tmp_path / "down/sentinel.json", [], "next")


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


def test_a_step_writes_provenance_then_the_sentinel_and_nothing_on_failure(tmp_path: Path):
    path = write_step(tmp_path / "ok")
    assert path == tmp_path / "ok/sentinel.json" and (tmp_path / "ok/provenance.json").exists()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/.data.bin.x1y2.tmp").write_bytes(b"left by a killed step")
    with pytest.raises(RuntimeError):
        with Step("demo", tmp_path / "bad", key={}, params={}, code="records.files"):
            raise RuntimeError("the step failed")
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == []  # its temporary file is gone, no sentinel
