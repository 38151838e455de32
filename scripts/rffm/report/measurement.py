"""`rffm record NAME -- COMMAND...`: run a measuring command and keep what it printed as a committed record.

A record is one JSON file, workflow/docs/records/NAME.json (the folder the documentation's figures are generated
from: rffm.report.figures), holding
  output    the JSON object the command printed last (`rffm bench cache|sweep|staging`, `rffm compare|status --json`), or
            null for a command that prints none (`make run`: its figure is the wall time);
  printed   the other lines it printed on stdout (the last 200), as the reader saw them;
  log       the lines it printed on stderr (the last 200): a Snakemake run's log, the table of a `--json` command;
  wall_s    the command's wall-clock time, measured here; cpu_s, the CPU seconds of it and every process it waited
            for; exit_code (always 0: a failed command writes no record);
  command   the command as typed (shell-quoted), and the folder it ran in relative to the checkout when inside it;
  commit    the checkout's HEAD (and whether tracked files differed from it), date (UTC, the start);
  machine   CPU model, cores (online and usable by this process), RAM, GPUs (nvidia-smi), the load average before
            and after, the platform; never the host's name;
  note      what the command alone does not say (e.g. "from a clean clone, setup included");
  read      the sha256 of what the command read or built, so a reader can tell which results a figure came from:
            every file its arguments (and --reads) name, and of a results tree they name (a folder holding runs/)
            every run's manifest and selection record, each path as given (`results/runs/<run>/...`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from rffm.errors import RffmError
from rffm.records.files import sha256_file
from rffm.records.layout import MANIFEST_NAME, QUALIFICATION, RUNS, SELECTION, SENTINEL_NAME
from rffm.records.manifest import source_revision
from rffm.runtime.processes import dies_with_parent

RECORDS = Path("workflow/docs/records")  # relative to the checkout
PRINTED_LINES = 200


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine() -> dict[str, Any]:
    """The machine as this process sees it (no host name)."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines() if line.startswith("model name")), None)
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal:")), None)
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        gpus = [line.strip() for line in listed.stdout.splitlines() if line.strip()] if listed.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        gpus = []
    return {
        "cpu_model": cpu or platform.processor() or None,
        "cores_online": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gb": round(mem_kb / 2**20, 1) if mem_kb else None,
        "gpus": gpus,
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
    }


def checkout_commit(folder: Path) -> dict[str, Any]:
    """{commit: HEAD of the git checkout holding `folder`, dirty: tracked files differ from it} (None: not a checkout)."""
    revision = source_revision(folder)
    return {"commit": revision["source_revision"], "dirty": revision["dirty"]}


def rows_json(rows: list[dict[str, Any]], **more: list[dict[str, Any]]) -> str:
    """`rffm compare --json`, `rffm status --json`: the rows a table is rendered from (and compare's seed groups), as
    one JSON line {"rows": [...], ...}."""
    return json.dumps({"rows": rows, **more}, sort_keys=True)


def last_json(lines: list[str]) -> tuple[Any, list[str]]:
    """(the JSON value of the last non-empty line if it is one, else None; the other lines)."""
    for index in range(len(lines) - 1, -1, -1):
        if not lines[index].strip():
            continue
        try:
            value = json.loads(lines[index])
        except ValueError:
            return None, lines
        if not isinstance(value, dict | list):
            return None, lines
        return value, lines[:index] + lines[index + 1 :]
    return None, lines


def run_and_capture(command: list[str], cwd: Path) -> tuple[int, list[str], list[str], float, float]:
    """Run `command` in `cwd`, echoing its stdout and stderr line by line: (exit code, stdout lines, stderr lines, wall
    seconds, CPU seconds of the command and the processes it waited for)."""
    start, cpu = time.monotonic(), _children_cpu()
    try:
        process = subprocess.Popen(
            command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1, preexec_fn=dies_with_parent
        )
    except OSError as exc:
        raise RffmError(f"{shlex.join(command)}: cannot start it ({exc}). Fix: check the command after `--`") from exc
    lines: list[str] = []
    log: list[str] = []
    assert process.stdout is not None and process.stderr is not None
    errors = threading.Thread(target=_echo, args=(process.stderr, sys.stderr, log), daemon=True)  # both pipes drained at once
    errors.start()
    _echo(process.stdout, sys.stdout, lines)
    errors.join()
    code = process.wait()
    return code, lines, log, time.monotonic() - start, _children_cpu() - cpu


def _echo(source: IO[str], target: IO[str], lines: list[str]) -> None:
    """Copy `source` to `target` line by line, keeping each line (without its newline)."""
    for line in source:
        target.write(line)
        target.flush()
        lines.append(line.rstrip("\n"))


def _children_cpu() -> float:
    """CPU seconds (user + system) of every finished descendant this process waited for, theirs included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def read_digests(paths: list[str], folder: Path) -> dict[str, str]:
    """{path as given: sha256} of each named file, and of each named results tree's run manifests and selection
    records; a path that names neither (an option, a folder the command made for itself) is left out."""
    digests: dict[str, str] = {}
    for given in dict.fromkeys(p.partition("=")[2] if p.startswith("--") else p for p in paths):
        path = folder / given
        if not given:  # an option without a value
            continue
        if path.is_file():
            digests[given] = sha256_file(path)
        elif (path / RUNS).is_dir():
            for step in (f"{QUALIFICATION}/{MANIFEST_NAME}", f"{SELECTION}/{SENTINEL_NAME}"):
                for found in sorted((path / RUNS).glob(f"*/{step}")):
                    digests[f"{given.rstrip('/')}/{found.relative_to(path).as_posix()}"] = sha256_file(found)
    return digests


def record(name: str, command: list[str], out_dir: Path, cwd: Path | None = None, note: str | None = None, reads: list[str] = ()) -> Path:
    """Run the command and write out_dir/NAME.json (see the module docstring); a command that fails writes nothing."""
    if not name or "/" in name or "." in name or name.startswith("-"):
        raise RffmError(
            f"record name {name!r}: not a record name. Fix: name it with letters, digits, _ and - only, e.g. bench_cache_default"
        )
    if not command:
        raise RffmError("the command: none given. Fix: put the command after `--`, e.g. rffm record NAME -- rffm bench cache")
    folder = (cwd or Path.cwd()).resolve()
    load_before = os.getloadavg()
    started = dt.datetime.now(dt.UTC).replace(microsecond=0)
    code, lines, log, wall, cpu = run_and_capture(command, folder)
    if code != 0:
        raise RffmError(f"`{shlex.join(command)}`: exited {code}; no record written. Fix: make the command succeed, then record it again")
    output, printed = last_json(lines)
    checkout = Path.cwd().resolve()
    body = {
        "name": name,
        "command": shlex.join(command),
        "cwd": str(folder.relative_to(checkout)) if folder.is_relative_to(checkout) else "(outside the checkout)",
        **checkout_commit(folder),
        "date": started.isoformat().replace("+00:00", "Z"),
        "machine": {
            **machine(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "exit_code": code,
        "note": note,
        "read": read_digests([*command[1:], *reads], folder),
        "output": output,
        "printed": printed[-PRINTED_LINES:],
        "log": log[-PRINTED_LINES:],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(body, indent=1, sort_keys=False) + "\n")
    print(f"rffm record: wrote {path}", file=sys.stderr)
    return path
