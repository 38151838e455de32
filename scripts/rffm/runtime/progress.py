"""Progress for long steps: a tqdm bar on a terminal, rate-limited plain lines in logs."""

from __future__ import annotations

import os
import sys
import time
from typing import IO

from tqdm import tqdm

PLAIN_INTERVAL_S = float(os.environ.get("RFFM_PROGRESS_INTERVAL", "15"))


class Progress:
    """Counts work units; shows rate and ETA."""

    def __init__(self, name: str, total: int, unit: str = "it", stream: IO[str] | None = None, interval_s: float | None = None):
        self.name, self.total, self.unit = name, total, unit
        self.stream = stream or sys.stderr
        self.interval_s = PLAIN_INTERVAL_S if interval_s is None else interval_s
        self.done = self.reported = 0
        self.started = self.last_line = time.monotonic()
        self.postfix: dict[str, str] = {}
        self.bar = tqdm(total=total, desc=name, unit=unit, file=self.stream, dynamic_ncols=True) if self._is_tty() else None

    def _is_tty(self) -> bool:
        return hasattr(self.stream, "isatty") and self.stream.isatty() and os.environ.get("RFFM_PLAIN_PROGRESS") != "1"

    def update(self, count: int = 1, **postfix: str) -> None:
        """Record `count` finished units."""
        self.done += count
        self.postfix.update(postfix)
        if self.bar is not None:
            self.bar.update(count)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            return
        now = time.monotonic()
        if now - self.last_line >= self.interval_s or self.done >= self.total:
            self.last_line = now
            self._line(now)

    def _line(self, now: float) -> None:
        self.reported = self.done
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        extras = "".join(f" {key}={value}" for key, value in self.postfix.items())
        percent = 100.0 * self.done / self.total if self.total else 100.0
        print(
            f"[{self.name}] {self.done}/{self.total} {self.unit} ({percent:.0f}%) "
            f"{rate:.1f} {self.unit}/s elapsed {elapsed:.1f}s eta {eta:.0f}s{extras}",
            file=self.stream,
            flush=True,
        )

    def note(self, message: str) -> None:
        """A one-off message that does not disturb the bar."""
        if self.bar is not None:
            self.bar.write(f"[{self.name}] {message}", file=self.stream)
        else:
            print(f"[{self.name}] {message}", file=self.stream, flush=True)

    def close(self) -> None:
        """Finish the bar (or print the final line if the last one is out of date)."""
        if self.bar is not None:
            self.bar.close()
        elif self.done != self.reported:
            self._line(time.monotonic())
