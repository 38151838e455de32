"""Progress for long steps: a tqdm bar on a terminal, rate-limited plain lines in logs, and a heartbeat file.

Under Snakemake a step's stderr is its log file, so the terminal shows nothing of it. While a step's runner holds
`running_step(out_dir)`, every Progress of the step also keeps its heartbeat (results/running/<step folder>.json:
done, total, unit, rate, time left, when) for `rffm status` to say which step runs, how fast and for how long yet.
The heartbeat is ephemeral (no sentinel vouches for it, nothing checks it) and lies outside every step folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from rffm.records.layout import RUNNING, results_root

PLAIN_INTERVAL_S = float(os.environ.get("RFFM_PROGRESS_INTERVAL", "15"))
HEARTBEAT_INTERVAL_S = 5.0  # at most one heartbeat write per this many seconds: a few hundred bytes, no fsync


@dataclass(frozen=True)
class Heartbeat:
    """Where a running step keeps its progress for `rffm status`: the file, and the step folder it speaks for."""

    path: Path
    folder: str  # the step folder, relative to results


_current: Heartbeat | None = None  # the running step's (running_step): the default of every Progress made meanwhile


def heartbeat_for(out_dir: str | Path) -> Heartbeat | None:
    """The heartbeat of the step writing into `out_dir`: results/running/<its folder, '/' as '+'>.json (config names
    never hold '+'); None outside a results tree."""
    folder = Path(os.path.abspath(out_dir))
    root = results_root(folder)
    if root is None:
        return None
    relative = folder.relative_to(root).as_posix()
    return Heartbeat(root / RUNNING / f"{relative.replace('/', '+')}.json", relative)


def _remove(beat: Heartbeat) -> None:
    for path in (beat.path, _partial(beat.path)):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _partial(path: Path) -> Path:
    # one name per heartbeat, not per process: a write a kill interrupted is replaced by the step's next run
    return path.with_name(path.name + ".partial")


@contextlib.contextmanager
def running_step(out_dir: str | Path) -> Iterator[Heartbeat | None]:
    """While the step writing into `out_dir` runs, its Progress bars keep its heartbeat; gone when it ends, also on an error."""
    global _current
    beat = heartbeat_for(out_dir)
    previous, _current = _current, beat
    try:
        yield beat
    finally:
        _current = previous
        if beat is not None:
            _remove(beat)


class Progress:
    """Counts work units; shows rate and ETA; keeps the running step's heartbeat (`heartbeat`, default: running_step's)."""

    def __init__(
        self,
        name: str,
        total: int,
        unit: str = "it",
        stream: IO[str] | None = None,
        interval_s: float | None = None,
        heartbeat: Heartbeat | None = None,
    ):
        self.name, self.total, self.unit = name, total, unit
        self.stream = stream or sys.stderr
        self.interval_s = PLAIN_INTERVAL_S if interval_s is None else interval_s
        self.done = self.reported = 0
        self.started = self.last_line = time.monotonic()
        self.postfix: dict[str, str] = {}
        self.bar = tqdm(total=total, desc=name, unit=unit, file=self.stream, dynamic_ncols=True) if self._is_tty() else None
        self.heartbeat = heartbeat or _current
        self.last_beat = self.started
        if self.heartbeat is not None:
            self._beat(self.started)  # at once: `rffm status` names the step before its first interval has passed

    def _is_tty(self) -> bool:
        return hasattr(self.stream, "isatty") and self.stream.isatty() and os.environ.get("RFFM_PLAIN_PROGRESS") != "1"

    def update(self, count: int = 1, **postfix: str) -> None:
        """Record `count` finished units."""
        self.done += count
        self.postfix.update(postfix)
        if self.heartbeat is not None:
            now = time.monotonic()
            if now - self.last_beat >= HEARTBEAT_INTERVAL_S:
                self._beat(now)
        if self.bar is not None:
            self.bar.update(count)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            return
        now = time.monotonic()
        if now - self.last_line >= self.interval_s or self.done >= self.total:
            self.last_line = now
            self._line(now)

    def _rate(self, now: float) -> tuple[float, float, float | None]:
        """(elapsed s, units per s, s left; None while nothing is done)."""
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        return elapsed, rate, (max(self.total - self.done, 0) / rate if rate > 0 else None)

    def _line(self, now: float) -> None:
        self.reported = self.done
        elapsed, rate, eta = self._rate(now)
        extras = "".join(f" {key}={value}" for key, value in self.postfix.items())
        percent = 100.0 * self.done / self.total if self.total else 100.0
        print(
            f"[{self.name}] {self.done}/{self.total} {self.unit} ({percent:.0f}%) "
            f"{rate:.1f} {self.unit}/s elapsed {elapsed:.1f}s eta {float('inf') if eta is None else eta:.0f}s{extras}",
            file=self.stream,
            flush=True,
        )

    def beat_record(self, now: float) -> dict[str, Any]:
        """The heartbeat's content at monotonic time `now` (updated_unix: the wall clock, for `rffm status` to age it)."""
        elapsed, rate, eta = self._rate(now)
        return {
            "name": self.name,
            "folder": self.heartbeat.folder if self.heartbeat else None,
            "done": self.done,
            "total": self.total,
            "unit": self.unit,
            "rate": round(rate, 4) if self.done else None,
            "eta_s": None if eta is None else round(eta, 1),
            "elapsed_s": round(elapsed, 1),
            "updated_unix": round(time.time(), 3),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def _beat(self, now: float) -> None:
        self.last_beat = now
        beat = self.heartbeat
        try:
            beat.path.parent.mkdir(parents=True, exist_ok=True)
            partial = _partial(beat.path)
            partial.write_text(json.dumps(self.beat_record(now), sort_keys=True) + "\n")
            os.replace(partial, beat.path)  # atomic: `rffm status` reads the old beat or the new one, never half of one
        except OSError as error:  # a status display must never fail the step: it goes on without one
            self.heartbeat = None
            self.note(f"no heartbeat for `rffm status` ({error})")

    def note(self, message: str) -> None:
        """A one-off message that does not disturb the bar."""
        if self.bar is not None:
            self.bar.write(f"[{self.name}] {message}", file=self.stream)
        else:
            print(f"[{self.name}] {message}", file=self.stream, flush=True)

    def close(self) -> None:
        """Finish the bar (or print the final line if the last one is out of date); remove the heartbeat."""
        if self.bar is not None:
            self.bar.close()
        elif self.done != self.reported:
            self._line(time.monotonic())
        if self.heartbeat is not None:
            _remove(self.heartbeat)
            self.heartbeat = None
