"""Following a printed `Fix:` (development.md, "Every Fix is followed by a test"): read it off the one-line error and,
where it is a command, run it literally as a user would paste it into a shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def fix_of(caught: pytest.ExceptionInfo | str) -> str:
    """The text after ` Fix: ` of a one-line error (an exception caught by pytest.raises, or a printed line)."""
    message = caught if isinstance(caught, str) else str(caught.value)
    assert "\n" not in message, message
    return message.split(" Fix: ", 1)[1]


def run_fix(command: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a printed fix command in bash, with this venv's commands (rffm, snakemake) first on PATH; it must succeed."""
    environment = {**os.environ, **(env or {}), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=environment, capture_output=True, text=True)
    assert done.returncode == 0, f"the fix `{command}` failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done
