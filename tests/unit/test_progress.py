import io
import re

import pytest

from rffm.runtime.progress import Progress


def test_non_tty_progress_is_plain_rate_limited_lines(monkeypatch):
    clock = iter([0.0, 0.0] + [0.5 * i for i in range(1, 200)])
    monkeypatch.setattr("rffm.runtime.progress.time.monotonic", lambda: next(clock))
    stream = io.StringIO()
    progress = Progress("build_cache", total=100, unit="batch", stream=stream, interval_s=10.0)
    for _ in range(100):
        progress.update(1)
    progress.close()
    lines = stream.getvalue().splitlines()
    # 100 updates over 50 s of fake time at one line per 10 s, plus the final line
    assert 4 <= len(lines) <= 6
    assert all(re.match(r"\[build_cache\] \d+/100 batch \(\d+%\) [\d.]+ batch/s elapsed [\d.]+s eta \d+s", line) for line in lines)
    assert lines[-1].startswith("[build_cache] 100/100 batch (100%)")
    assert "\r" not in stream.getvalue()


def test_terminal_progress_is_a_bar_with_rate_and_eta(monkeypatch):
    """On a real pseudo-terminal the same calls draw a tqdm bar (carriage returns, rate, ETA)."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios

    monkeypatch.delenv("RFFM_PLAIN_PROGRESS", raising=False)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 120-column terminal
    with os.fdopen(slave, "w") as terminal:
        progress = Progress("qualify", total=50, unit="example", stream=terminal)
        for _ in range(50):
            progress.update(1)
        progress.close()
        terminal.flush()
        chunks = []
        while select.select([master], [], [], 0.2)[0]:
            chunks.append(os.read(master, 65536))
        drawn = b"".join(chunks).decode()
    os.close(master)
    assert progress.bar is not None
    assert "\r" in drawn and "qualify" in drawn and "50/50" in drawn
    assert re.search(r"<\d\d:\d\d", drawn) and "example/s" in drawn  # ETA and rate


def test_a_real_staging_log_is_line_based_and_rate_limited(tmp_path):
    """`rffm stage` (the command stage_dataset runs) with stderr captured to a file, as in a cluster log."""
    import json
    import os
    import subprocess

    from conftest import BIN
    from rffm.config import entry_defaults

    synthetic = {"examples_per_class_snr": 30, "length": 128}
    spec = entry_defaults("datasets", {"name": "big", "source": "synthetic", "seed": 1, "synthetic": synthetic})  # as the rule passes it
    log = tmp_path / "stage.log"
    env = {k: v for k, v in os.environ.items() if k != "RFFM_PLAIN_PROGRESS"} | {"RFFM_PROGRESS_INTERVAL": "0.25"}
    with open(log, "w") as handle:
        subprocess.run(
            [str(BIN / "rffm"), "stage_dataset", "--spec", json.dumps(spec), "--out-dir", str(tmp_path / "out")],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            check=True,
        )
    text = log.read_text()
    assert "\r" not in text and "\x1b" not in text  # no bar redraws or terminal escapes in a file
    pattern = re.compile(r"\[stage_dataset big\] (\d+)/6600 example \(\d+%\) [\d.]+ example/s elapsed ([\d.]+)s eta \d+s$")
    matches = [pattern.match(line) for line in text.splitlines() if " example (" in line]  # notes aside
    assert all(matches), text
    elapsed = [float(m.group(2)) for m in matches]
    done = [int(m.group(1)) for m in matches]
    assert len(matches) >= 3, text  # periodic lines while it runs, not one at the end
    assert done[-1] == 6600 and done == sorted(done)
    # rate-limited: consecutive lines (except the final one) at least the interval apart (0.1 s of print rounding)
    assert all(b - a >= 0.25 - 0.1 for a, b in zip(elapsed[:-2], elapsed[1:-1], strict=True)), elapsed
    assert len(matches) <= elapsed[-1] / 0.25 + 2


@pytest.mark.workflow
def test_every_long_step_of_the_workflow_logs_plain_progress(finished_workdir):
    logs = finished_workdir / "results/logs"
    steps = {
        "stage_dataset/tiny.log": "stage_dataset tiny",
        "pretrain_backbone/mini.log": "pretrain_backbone",
        "build_cache/tiny__mini.log": "build_cache",
        "train_epoch/base/1.log": "train_epoch base/1",
        "qualify/base.log": "qualify (test split)",
    }
    for log, name in steps.items():
        text = (logs / log).read_text()
        assert "\r" not in text, log
        final = [line for line in text.splitlines() if line.startswith(f"[{name}] ") and "(100%)" in line]
        assert len(final) == 1 and re.search(r"/s elapsed [\d.]+s eta 0s", final[0]), (log, text)


def test_a_progress_keeps_a_heartbeat_with_rate_and_time_left_and_removes_it_on_close(tmp_path, monkeypatch):
    """Issue 50: `rffm status` reads it (results/running/, outside every step folder); written at most every few seconds."""
    import json

    from rffm.runtime.progress import HEARTBEAT_INTERVAL_S, heartbeat_for

    clock = [100.0]
    monkeypatch.setattr("rffm.runtime.progress.time.monotonic", lambda: clock[0])
    beat = heartbeat_for(tmp_path / "results/backbones/mini")
    assert (beat.path, beat.folder) == (tmp_path / "results/running/backbones+mini.json", "backbones/mini")
    progress = Progress("pretrain_backbone", total=2000, unit="batch", stream=io.StringIO(), heartbeat=beat)
    first = json.loads(beat.path.read_text())  # written at once: the step is named before its first interval
    assert {k: first[k] for k in ("name", "folder", "done", "total", "unit", "rate", "eta_s")} == {
        "name": "pretrain_backbone",
        "folder": "backbones/mini",
        "done": 0,
        "total": 2000,
        "unit": "batch",
        "rate": None,
        "eta_s": None,
    }
    assert isinstance(first["updated_unix"], float) and first["pid"] > 0 and first["host"]
    clock[0] += HEARTBEAT_INTERVAL_S / 2
    progress.update(1)
    assert json.loads(beat.path.read_text())["done"] == 0  # rate-limited: not written again yet
    clock[0] = 120.0
    progress.update(17)  # 18 batches in 20 s
    now = json.loads(beat.path.read_text())
    assert (now["done"], now["rate"], now["elapsed_s"]) == (18, 0.9, 20.0)
    assert now["eta_s"] == pytest.approx((2000 - 18) / 0.9, abs=0.1)
    clock[0] = 140.0
    progress.update(18)
    assert json.loads(beat.path.read_text())["done"] == 36  # updated
    progress.close()
    assert not beat.path.exists() and list(beat.path.parent.iterdir()) == []  # no partial write left either


def test_the_step_runner_s_heartbeat_is_every_progress_default_and_gone_when_the_step_fails(tmp_path):
    import json

    from rffm.runtime.progress import heartbeat_for, running_step

    out_dir = tmp_path / "results/runs/base/epochs/2"
    with pytest.raises(RuntimeError), running_step(out_dir) as beat:
        progress = Progress("train_epoch base/2", total=10, unit="batch", stream=io.StringIO())
        progress.update(3)
        assert progress.heartbeat == beat and json.loads(beat.path.read_text())["folder"] == "runs/base/epochs/2"
        assert not beat.path.is_relative_to(out_dir)  # never in the step's folder: its sentinel does not vouch for it
        raise RuntimeError("the step fails before it closes its progress")
    assert not beat.path.exists()
    assert Progress("predict", total=1, stream=io.StringIO()).heartbeat is None  # outside a step: no heartbeat
    assert heartbeat_for(tmp_path / "elsewhere") is None  # outside a results tree: none
