"""A warm `snakemake` for the tests: each run is a child forked from a server that imported Snakemake once.

Every `snakemake` process imports Snakemake and, through its plugin registries, every installed executor and storage
plugin (pandas for the SLURM plugin's efficiency report, the Google Cloud clients, SQLModel for Snakemake's own
records): ~1.8 s of CPU before it reads the Snakefile, and `make test` starts ~200 of them. The server pays that once
per pytest worker. Each request forks a child that becomes a `snakemake` process in all but its import history: a
new session, the request's working directory, environment and argv, stdin from /dev/null, stdout and stderr into
files, then Snakemake's own command-line entry point (snakemake.cli.main) and the interpreter's normal exit (its objects
frozen out of the final garbage collection, as rffm's console script does). A request may instead name a Python script
that runs Snakemake's CLI in-process (`python tests/executors/fake_batch.py STATE -- <snakemake arguments>`, the fake
Batch API): the child runs that script as __main__, as the interpreter would. The child
reads the Snakefile and imports rffm itself, as the console script does, but for the few modules of rffm's code digests:
the server computes those once (warm_code_digests), cached per module file's path, mtime and size.

A request may put directories in front of the server's PYTHONPATH (a test's hook: tests/killpoint, tests/cacherace, an
edited code digest): the child puts them in front of its sys.path and, when one of them holds a sitecustomize.py, imports
it, as a fresh interpreter with that PYTHONPATH does at start-up (the server imported no sitecustomize; of rffm it holds
only the code-digest modules, and a hook that edits a digest patches that module object before the Snakefile reads it);
the jobs it starts are fresh interpreters and read them themselves.
A PYTHONPATH that drops one of the server's directories starts the console script instead, as do the SLURM and Batch
job steps.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
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

    registries = (
        "ExecutorPluginRegistry",
        "StoragePluginRegistry",
        "ReportPluginRegistry",
        "LoggerPluginRegistry",
        "SchedulerPluginRegistry",
    )
    for registry in registries:
        getattr(snakemake.cli, registry)()  # the singletons import their plugins when first made: every run's argument parser makes them
    for name in PRELOADED:
        importlib.import_module(name)
    warm_code_digests()

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


def warm_code_digests() -> None:
    """The code digests the workflow computes for every step when it reads the Snakefile (rffm.records.code parses ~80
    modules for their imports: ~40 % of a planning run's CPU), computed once here. Its cache is keyed by each module
    file's path, mtime and size, so a child still sees an edit made after the server started."""
    from rffm.records import pipeline
    from rffm.records.code import code_digest

    for step in pipeline.STEPS:
        code_digest(step.module)


def become_snakemake(request: dict) -> None:
    """In the forked child: set up the process as the request says, run snakemake's main (or the script) and exit through
    SystemExit."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    added = prepended(request["env"].get("PYTHONPATH"), os.environ.get("PYTHONPATH"))
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY), (2, request["stderr"], os.O_WRONLY)):
        opened = os.open(path, flags | (os.O_CREAT | os.O_TRUNC if fd else 0), 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    script = Path(request["argv"][0]).name.startswith("python")  # `python SCRIPT ARGS`: the script is the program
    sys.argv = list(request["argv"][1:] if script else request["argv"])
    if script:
        sys.path[0] = str(Path(sys.argv[0]).resolve().parent)  # the script's own folder, as the interpreter puts it
    sys.path[1:1] = added or []  # after the script's own folder, as PYTHONPATH's entries come
    if any((Path(folder) / "sitecustomize.py").is_file() for folder in added):
        importlib.import_module("sitecustomize")
    from snakemake.cli import main

    try:
        if script:
            runpy.run_path(sys.argv[0], run_name="__main__")  # ends in sys.exit(), as the script does when run
        else:
            main()  # raises SystemExit(0 or 1)
    finally:
        gc.freeze()  # the exit's garbage collection would walk the server's whole import history once per run


def entries(pythonpath: str | None) -> list[str]:
    return [entry for entry in (pythonpath or "").split(os.pathsep) if entry]


def prepended(requested: str | None, server: str | None) -> list[str] | None:
    """The directories a request's PYTHONPATH puts in front of the server's ([]: the same; None: it drops one of them)."""
    theirs, mine = entries(requested), entries(server)
    extra = len(theirs) - len(mine)
    return theirs[:extra] if extra >= 0 and theirs[extra:] == mine else None


class WarmSnakemake:
    """The pytest worker's side: starts the server on first use, runs one command at a time through it."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.server: subprocess.Popen | None = None
        self.pythonpath = os.environ.get("PYTHONPATH")

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a run in this environment can be a forked child: its PYTHONPATH is the server's, or the server's with
        directories in front of it (become_snakemake puts them on the child's sys.path)."""
        return prepended(env.get("PYTHONPATH"), self.pythonpath) is not None

    def start(self) -> subprocess.Popen:
        if self.server is None or self.server.poll() is not None:
            env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # the server's own, whatever a test set
            env.update({"PYTHONPATH": self.pythonpath} if self.pythonpath is not None else {})
            command = [self.python, __file__]
            self.server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True)
            atexit.register(self.server.stdin.close)  # the server ends when its stdin does
        return self.server

    def run_any(self, command: list[str], cwd: Path, env: dict[str, str], timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run a `snakemake` command line forked warm where the server serves its environment, else the console script."""
        if self.serves(env):
            return self.run(command, cwd, env, timeout)
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)

    def run(self, command: list[str], cwd: Path, env: dict[str, str], timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run `command` (the snakemake console script and its arguments, or a Python interpreter, a script that runs
        Snakemake's CLI in-process and its arguments) as subprocess.run(capture_output, text) would."""
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
