"""`make setup` installs the right torch: a CPU build without an NVIDIA GPU, a CUDA build with one.

The Makefile's choice is read with `make torch-choice` (nothing installed) under a fake `nvidia-smi`
(one that lists a GPU, one that fails as it does without a driver), and what pip does with that choice
is read from `pip install --dry-run --report` (nothing installed either). Offline here:
- the official CPU wheel index cannot be reached from this machine, so the "reachable" branch is shown
  with a local PEP 503 index on 127.0.0.1 serving a stand-in `torch-2.13.0+cpu` wheel: it proves the
  Makefile's probe and the pip arguments it builds, not what download.pytorch.org serves;
- where it is unreachable the plain pin is resolved the way this machine's pip is configured: here that
  is a local CPU wheel (the report says so; on a machine whose pip only knows PyPI, the Linux x86-64
  wheel is the CUDA build, and setup prints a note);
- that PyPI's own `torch==2.13.0` is a CUDA build (the GPU choice) needs PyPI: skipped when unreachable.
A fake `.venv/bin/python` that logs its arguments shows which choice changes reinstall torch.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

PIN = "torch==2.13.0"
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 that refuses connections (an unreachable wheel index, instantly)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"


def fake_nvidia_smi(directory: Path, gpu: bool) -> Path:
    """`nvidia-smi -L` listing one GPU, or failing like nvidia-smi on a machine without a working driver."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    if gpu:
        script.write_text('#!/bin/sh\necho "GPU 0: NVIDIA L4 (UUID: GPU-00000000-0000-0000-0000-000000000000)"\n')
    else:
        script.write_text('#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n')
    script.chmod(0o755)
    return directory


def path_with(directory: Path | None) -> str:
    """PATH without any real nvidia-smi, with `directory` (a fake one) first."""
    entries = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    return os.pathsep.join(([str(directory)] if directory else []) + entries)


def make(directory: Path, *args: str, path: str, **variables: str) -> subprocess.CompletedProcess:
    # nothing from a calling make (`make test`) or the shell may choose for the Makefile
    ignored = {"TORCH_SPEC", "TORCH_BUILD", "DEVICE", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}
    env = {key: value for key, value in os.environ.items() if key not in ignored}
    env["PATH"] = path
    command = [MAKE, "-C", str(directory), *args, *(f"{key}={value}" for key, value in variables.items())]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def torch_choice(path: str, **variables: str) -> dict[str, str]:
    result = make(REPO, "-s", "torch-choice", path=path, **variables)
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(line.split("=", 1) for line in result.stdout.splitlines())


def pip_dry_run(spec: str, *options: str) -> dict:
    """The torch pip would install for these arguments (dry run, no dependencies, nothing installed)."""
    command = [sys.executable, "-m", "pip", *options, "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet"]
    command += ["--retries", "0", "--timeout", "10", "--report", "-", *spec.split()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    [torch] = [item for item in json.loads(result.stdout)["install"] if item["metadata"]["name"] == "torch"]
    return torch


def is_cuda_build(torch: dict) -> bool:
    requires = torch["metadata"].get("requires_dist") or []
    return any(r.startswith(("nvidia-", "cuda-")) for r in requires) or "+cu" in torch["metadata"]["version"]


@pytest.fixture(scope="module")
def cpu_index(tmp_path_factory):
    """A PEP 503 wheel index on 127.0.0.1 holding a stand-in torch-2.13.0+cpu wheel (metadata only)."""
    root = tmp_path_factory.mktemp("index")
    wheel = root / "files" / "torch-2.13.0+cpu-py3-none-any.whl"
    wheel.parent.mkdir()
    info = "torch-2.13.0+cpu.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: rffm-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    page = root / "whl" / "cpu" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    link = '<a href="/files/torch-2.13.0%2Bcpu-py3-none-any.whl">torch-2.13.0+cpu-py3-none-any.whl</a>'
    page.write_text(f"<html><body>{link}</body></html>\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()
    server.server_close()


def test_without_a_gpu_and_the_cpu_index_unreachable_the_pin_resolves_as_pip_is_configured(tmp_path):
    unreachable = closed_port_url()
    for path in (path_with(fake_nvidia_smi(tmp_path / "no-driver", gpu=False)), path_with(None)):
        choice = torch_choice(path, TORCH_CPU_INDEX=unreachable)
        assert choice["TORCH_BUILD"] == "cpu" and choice["DEVICE"] == ""
        assert choice["TORCH_SPEC"] == PIN, "an unreachable CPU index must not end up in the pip arguments"
    torch = pip_dry_run(choice["TORCH_SPEC"])
    if is_cuda_build(torch):
        pytest.skip(f"this machine's pip resolves {PIN} to a CUDA build ({torch['download_info']['url']}): setup notes it")
    # here: the local CPU wheel this machine's pip configuration points at
    assert torch["metadata"]["version"] == "2.13.0+cpu", torch["download_info"]["url"]


def test_without_a_gpu_a_reachable_cpu_index_is_used(tmp_path, cpu_index):
    choice = torch_choice(path_with(fake_nvidia_smi(tmp_path / "no-driver", gpu=False)), TORCH_CPU_INDEX=cpu_index)
    assert choice["TORCH_BUILD"] == "cpu" and choice["DEVICE"] == ""
    assert choice["TORCH_SPEC"] == f"{PIN} --index-url {cpu_index}"
    # only the Makefile's arguments (--isolated: no local wheel directories or extra indexes of this machine)
    torch = pip_dry_run(choice["TORCH_SPEC"], "--isolated")
    assert torch["metadata"]["version"] == "2.13.0+cpu" and not is_cuda_build(torch)
    assert torch["download_info"]["url"].startswith(cpu_index.removesuffix("/whl/cpu") + "/files/")


def test_with_a_gpu_the_plain_pin_and_device_cuda(tmp_path, cpu_index):
    path = path_with(fake_nvidia_smi(tmp_path / "gpu", gpu=True))
    for index in (cpu_index, closed_port_url()):  # the CPU index is not used, reachable or not
        choice = torch_choice(path, TORCH_CPU_INDEX=index)
        assert choice == {"TORCH_BUILD": "cuda", "TORCH_SPEC": PIN, "TORCH_STAMP": choice["TORCH_STAMP"], "DEVICE": "cuda"}
    # overrides: the build, the device, the whole pip argument list
    assert torch_choice(path, TORCH_BUILD="cpu", TORCH_CPU_INDEX=cpu_index)["TORCH_SPEC"] == f"{PIN} --index-url {cpu_index}"
    assert torch_choice(path, DEVICE="cpu")["DEVICE"] == "cpu"
    custom = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
    assert torch_choice(path, TORCH_SPEC=custom)["TORCH_SPEC"] == custom


def test_pypi_resolves_the_gpu_pin_to_a_cuda_build():
    """What the GPU choice installs from PyPI on this platform (needs PyPI: skipped offline)."""
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
    except OSError as error:
        pytest.skip(f"PyPI is not reachable ({error})")
    if not sys.platform.startswith("linux"):
        pytest.skip("PyPI's torch wheels are CUDA builds on Linux only")
    torch = pip_dry_run(PIN, "--isolated")
    assert torch["metadata"]["version"] == "2.13.0" and is_cuda_build(torch), torch["metadata"].get("requires_dist")


FAKE_PYTHON = """#!/bin/sh
# stands in for .venv/bin/python: logs pip calls and the post-install check, installs nothing
case "$1" in
  -c) echo "check $3 $4" >> "$RFFM_TEST_LOG" ;;
  *) echo "$*" >> "$RFFM_TEST_LOG" ;;
esac
"""


def test_a_new_torch_choice_reinstalls_torch_in_the_existing_venv(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(REPO / "Makefile", project / "Makefile")
    shutil.copy(REPO / "pyproject.toml", project / "pyproject.toml")
    python = project / ".venv" / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("RFFM_TEST_LOG", str(log))
    index = closed_port_url()
    no_gpu = path_with(fake_nvidia_smi(tmp_path / "no-driver", gpu=False))
    gpu = path_with(fake_nvidia_smi(tmp_path / "gpu", gpu=True))

    def setup(path: str, **variables: str) -> list[str]:
        log.write_text("")
        result = make(project, "setup", path=path, TORCH_CPU_INDEX=index, **variables)
        assert result.returncode == 0, result.stdout + result.stderr
        return log.read_text().splitlines()

    def stamps() -> list[str]:
        return [p.read_text().strip() for p in (project / ".venv").glob("torch-*.stamp")]

    # an existing .venv without a record of its torch (e.g. made before this Makefile): torch is reinstalled
    first = setup(no_gpu)
    assert first == [
        "-m pip uninstall --quiet --yes torch",
        f"-m pip install --quiet {PIN}",
        "check cpu undefined",
        "-m pip install --quiet -e .[dev]",
    ]
    assert stamps() == [f"cpu: {PIN}"]
    assert setup(no_gpu) == [], "the same choice must install nothing"
    # another TORCH_SPEC: torch only is reinstalled (then the package, which keeps it)
    assert setup(no_gpu, TORCH_SPEC="torch==2.12.0")[:2] == ["-m pip uninstall --quiet --yes torch", "-m pip install --quiet torch==2.12.0"]
    assert stamps() == ["cpu: torch==2.12.0"]
    # back to the default, then a GPU appears: the detected choice changed
    assert f"-m pip install --quiet {PIN}" in setup(no_gpu)
    assert setup(gpu)[:3] == ["-m pip uninstall --quiet --yes torch", f"-m pip install --quiet {PIN}", "check cuda undefined"]
    assert stamps() == [f"cuda: {PIN}"]
    assert setup(gpu) == []
