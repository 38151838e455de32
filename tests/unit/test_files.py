import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash

from rffm.records import files
from rffm.records.files import FAST_HASH_CHUNK, start_writeback, xxh3_parts


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


def test_xxh3_parts_hashes_every_byte_and_trusts_only_the_given_parts(tmp_path: Path):
    data = np.random.default_rng(0).bytes(FAST_HASH_CHUNK + 1234)  # a part longer than one read block
    (tmp_path / "f").write_bytes(data)
    cut = [100, FAST_HASH_CHUNK + 200]
    pieces = [data[:100], data[100 : FAST_HASH_CHUNK + 200], data[FAST_HASH_CHUNK + 200 :]]
    expected = xxhash.xxh3_128_hexdigest(b"".join(xxhash.xxh3_128_digest(piece) for piece in pieces))
    assert xxh3_parts(tmp_path / "f", cut) == expected
    assert xxh3_parts(tmp_path / "f", cut, {1: xxhash.xxh3_128_digest(pieces[1])}) == expected
    assert xxh3_parts(tmp_path / "f") == xxhash.xxh3_128_hexdigest(xxhash.xxh3_128_digest(data))


def test_start_writeback_leaves_the_bytes_alone(tmp_path: Path):
    path = tmp_path / "f"
    with open(path, "wb") as handle:
        handle.write(b"x" * 10000)
        handle.flush()
        start_writeback(handle.fileno(), 0, 10000)
        start_writeback(handle.fileno(), 5000, 0)  # length 0: to the end of the file
    assert path.read_bytes() == b"x" * 10000


def test_a_create_only_write_clears_what_a_killed_writer_left_but_not_a_live_ones(tmp_path: Path, monkeypatch):
    import socket
    import subprocess

    monkeypatch.setattr(files, "_link_unnamed", lambda *args: False)  # the named-temporary path (no O_TMPFILE)
    host = socket.gethostname()
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "30"])
    zombie = subprocess.Popen(["true"])  # killed and not reaped: /proc/<pid> stays while init does not reap it (as on CI)
    while Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.01)
    try:
        left = tmp_path / f".entry.json.{host}.{dead.pid}.tmp"
        left_by_zombie = tmp_path / f".entry.json.{host}.{zombie.pid}.tmp"
        running = tmp_path / f".entry.json.{host}.{live.pid}.tmp"
        other_host = tmp_path / f".entry.json.elsewhere.{dead.pid}.tmp"
        for path in (left, left_by_zombie, running, other_host):
            path.write_bytes(b"partial")
        files.atomic_write_bytes(tmp_path / "entry.json", b"{}", create_only=True)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["entry.json", running.name, other_host.name])
    finally:
        live.kill()
        live.wait()
        zombie.wait()
