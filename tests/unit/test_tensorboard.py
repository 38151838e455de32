"""TensorBoard event logs (optional extra: tested when tensorboardX is installed)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

pytest.importorskip("tensorboardX")

from rffm.cli import main  # noqa: E402
from rffm.runtime import tensorboard  # noqa: E402


def read_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar in the TFRecord event files of a directory: {tag: {step: value}}."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, dict[int, float]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = Event.FromString(data[offset + 12 : offset + 12 + length])  # skip length + its crc
            offset += 12 + length + 4  # record + its crc
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


def test_export_writes_every_finished_epoch_from_the_sentinels(finished_workdir: Path, tmp_path: Path, capsys):
    assert main(["tensorboard", str(finished_workdir / "results"), "--log-dir", str(tmp_path)]) == 0
    assert "base: 3 epoch(s)" in capsys.readouterr().out
    scalars = read_scalars(tmp_path / "base")
    assert set(scalars) == set(tensorboard.SCALARS)
    import json

    for epoch in (1, 2, 3):
        metrics = json.loads((finished_workdir / f"results/runs/base/epochs/{epoch}/metrics.json").read_text())
        for tag, key in tensorboard.SCALARS.items():
            assert scalars[tag][epoch] == pytest.approx(metrics[key], rel=1e-6)


def test_log_dir_comes_from_vertex_first_then_rffm(monkeypatch):
    monkeypatch.delenv("AIP_TENSORBOARD_LOG_DIR", raising=False)
    monkeypatch.delenv("RFFM_TENSORBOARD_DIR", raising=False)
    assert tensorboard.log_dir_from_env() is None and tensorboard.log_epoch("r", {"epoch": 1}) is None
    monkeypatch.setenv("RFFM_TENSORBOARD_DIR", "/tmp/a")
    assert tensorboard.log_dir_from_env() == "/tmp/a"
    monkeypatch.setenv("AIP_TENSORBOARD_LOG_DIR", "gs://bucket/tb")
    assert tensorboard.log_dir_from_env() == "gs://bucket/tb"


def test_a_missing_tensorboardx_only_warns(monkeypatch, tmp_path: Path, capsys):
    monkeypatch.setenv("RFFM_TENSORBOARD_DIR", str(tmp_path))
    monkeypatch.setitem(__import__("sys").modules, "tensorboardX", None)  # import now raises ImportError
    assert tensorboard.log_epoch("r", {"epoch": 1, "val_accuracy": 0.5}) is None
    assert "pip install 'rffm[tensorboard]'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
