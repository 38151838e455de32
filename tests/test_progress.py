import io
import re

from rffm.progress import Progress


def test_non_tty_progress_is_plain_rate_limited_lines(monkeypatch):
    clock = iter([0.0, 0.0] + [0.5 * i for i in range(1, 200)])
    monkeypatch.setattr("rffm.progress.time.monotonic", lambda: next(clock))
    stream = io.StringIO()
    progress = Progress("build_cache", total=100, unit="batch", stream=stream, interval_s=10.0)
    for _ in range(100):
        progress.update(1)
    progress.close()
    lines = stream.getvalue().splitlines()
    # 100 updates over 50 s of fake time at one line per 10 s, plus the final line
    assert 4 <= len(lines) <= 6
    assert all(re.match(r"\[build_cache\] \d+/100 batch \(\d+%\) [\d.]+ batch/s elapsed \d+s eta \d+s", line) for line in lines)
    assert lines[-1].startswith("[build_cache] 100/100 batch (100%)")
    assert "\r" not in stream.getvalue()
