"""A warm `snakemake` for the tests: each run is a child forked from a server that imported Snakemake once.

Every `snakemake` process imports Snakemake and, through its plugin registries, every installed executor and storage
plugin (pandas for the SLURM plugin's efficiency report, the Google Cloud clients, SQLModel for Snakemake's own
records): ~1.8 s of CPU before it reads the Snakefile, and `make test` starts ~200 of them. The server pays that once
per pytest worker. Each request forks a child that becomes a `snakemake` process in all but its import history: a
new session, the request's working directory, environment and argv, stdin from /dev/null, stdout and stderr into
files, then Snakemake's own command-line entry point (snakemake.cli.main) and the interpreter's normal exit (its objects
frozen out of the final garbage collection, as rffm's console script does). The child
reads the Snakefile and imports rffm itself, as the console script does.

Runs whose point is the process itself start the console script instead (conftest.snakemake falls back to it for an
environment with another PYTHONPATH, e.g. the kill-point hook's sitecustomize), as do the SLURM and Batch job steps.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# Third-party modules a planning run imports after Snakemake (rffm's own modules are left to the child: a test that
# edits rffm code in a work directory must see the edit).
PRELOADED = ("numpy", "h5py", "yaml", "xxhash", "jsonschema", "docutils", "pygments", "PIL", "smart_open", "yte", "dpath")


def serve() -> None:
    """The server's loop: one request per stdin line, one child at a time; replies {"pid"}, then {"returncode"}."""
    import snakemake.cli

    for registry in (snakemake.cli.StoragePluginRegistry, snakemake.cli.ReportPluginRegistry, snakemake.cli.LoggerPluginRegistry):
        registry()  # the singletons import their plugins when first made: every run's argument parser makes them
    for name in PRELOADED:
        importlib.import_module(name)

    replies = sys.stdout.buffer
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            become_snakemake(request)  # never returns
        replies.write(json.dumps({"pid": pid}).encode() + b"\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        replies.flush()


def become_snakemake(request: dict) -> None:
    """In the forked child: set up the process as the request says, run snakemake's main and exit through SystemExit."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY), (2, request["stderr"], os.O_WRONLY)):
        opened = os.open(path, flags | (os.O_CREAT | os.O_TRUNC if fd else 0), 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = list(request["argv"])
    from snakemake.cli import main

    try:
        main()  # raises SystemExit(0 or 1)
    finally:
        gc.freeze()  # the exit's garbage collection would walk the server's whole import history once per run


class WarmSnakemake:
    """The pytest worker's side: starts the server on first use, runs one command at a time through it."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.server: subprocess.Popen | None = None
        self.pythonpath = os.environ.get("PYTHONPATH")

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a run in this environment can be a forked child (what the interpreter read at start-up is the same)."""
        return env.get("PYTHONPATH") == self.pythonpath

    def start(self) -> subprocess.Popen:
        if self.server is None or self.server.poll() is not None:
            self.server = subprocess.Popen([self.python, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
            atexit.register(self.server.stdin.close)  # the server ends when its stdin does
        return self.server

    def run(self, command: list[str], cwd: Path, env: dict[str, str], timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run `command` (the snakemake console script and its arguments) as subprocess.run(capture_output, text) would."""
        server = self.start()
        folder = Path(tempfile.mkdtemp(prefix="warm-snakemake-"))
        try:
            request = {"argv": command, "cwd": str(cwd), "env": env, "stdout": str(folder / "out"), "stderr": str(folder / "err")}
            server.stdin.write(json.dumps(request).encode() + b"\n")
            server.stdin.flush()
            pid = json.loads(server.stdout.readline())["pid"]
            timed_out = timeout is not None and not select.select([server.stdout], [], [], timeout)[0]
            if timed_out:
                os.killpg(pid, signal.SIGKILL)
            returncode = json.loads(server.stdout.readline())["returncode"]
            out, err = ((folder / name).read_text(errors="replace") for name in ("out", "err"))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if timed_out:
            raise subprocess.TimeoutExpired(command, timeout, out, err)
        return subprocess.CompletedProcess(command, returncode, out, err)


if __name__ == "__main__":
    serve()
