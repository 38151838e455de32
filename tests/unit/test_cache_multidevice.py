"""The multi-device cache build (issue 36, acceptance 3) on CPU, with worker processes standing in for GPUs: the same
bytes as the one-process build, a killed worker that leaves nothing sealed, and one device per concurrent job."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import cache_build, cache_options, make_backbone, stage
from fixes import fix_of
from rffm.data import cache_local, cache_writer
from rffm.data.cache_format import built_recipe, recipe
from rffm.errors import ConfigError
from rffm.records.layout import CACHED_SPLITS, cache_files
from rffm.records.sentinel import read_sentinel
from rffm.runtime import device as device_module
from rffm.runtime import devices
from rffm.runtime.profiling import PhaseTimes

DATASET = {
    "name": "t",
    "source": "synthetic",
    "seed": 5,
    "synthetic": {
        "classes": ["BPSK", "QPSK", "WBFM"],
        "snr_db": {"min": 0, "max": 10, "step": 10},
        "examples_per_class_snr": 10,
        "length": 32,
    },
}
SMALL = {"patch": 8, "dim": 16, "depth": 1, "heads": 2, "stem": "iq", "output_layers": 1}
BACKBONE = {"name": "b", "source": "random", "dataset": "t", "arch": SMALL}
BATCH = 4  # small enough that both workers get rows of both splits
TWO = ["cpu", "cpu"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    """The one-process build: (its record in results, the cache under its scratch)."""
    root = tmp_path_factory.mktemp("multidevice")
    stage(DATASET, root / "results/datasets/t")
    make_backbone(BACKBONE, root / "results/datasets/t", root / "results/backbones/b")
    cache_build(root / "results/datasets/t", root / "results/backbones/b", root / "results/caches/t__b", root / "scratch", batch_size=BATCH)
    return root / "results/caches/t__b", root / "scratch/t__b"


def ensure(record_dir: Path, scratch: Path) -> tuple[Path, dict | None]:
    """What build_cache (or an epoch on a node without the cache) does, with the build spread over two CPU workers."""
    options = cache_options(batch_size=BATCH, devices=TWO)
    return cache_local.ensure(read_sentinel(record_dir / "sentinel.json"), record_dir, scratch, options, PhaseTimes())


def test_a_killed_worker_seals_nothing_and_the_rerun_builds_the_one_process_bytes(reference, tmp_path: Path, monkeypatch):
    record_dir, expected = reference
    record = read_sentinel(record_dir / "sentinel.json")
    for split in CACHED_SPLITS:  # disjoint, contiguous, covering, cut at batch multiples, and both workers busy
        count = record["cache"]["shapes"][split][0]
        ranges = cache_writer.worker_rows(count, 2, BATCH)
        assert ranges[0][0] == 0 and ranges[0][1] == ranges[1][0] and ranges[1][1] == count
        assert ranges[0][1] % BATCH == 0 and all(stop > first for first, stop in ranges)
    scratch = tmp_path / "scratch"
    monkeypatch.setenv(cache_writer.KILL_ENV, f"1:{BATCH}")  # worker 1 SIGKILLs itself after its first batch
    with pytest.raises(
        cache_writer.CacheBuildError, match=r"cache build worker 1 \(cpu, rows \d+\.\.\d+ of train\) died \(killed by SIGKILL\)"
    ) as caught:
        ensure(record_dir, scratch)
    assert multiprocessing.active_children() == []  # the other worker was stopped too
    directory = cache_local.local_dir(scratch, record["key"])
    assert not directory.exists() and built_recipe(directory) is None  # nothing a later step could take for complete
    assert sorted(p.name for p in scratch.iterdir()) == [".t__b.lock"]  # the half-built directory is gone
    assert fix_of(caught).startswith("rerun snakemake")
    monkeypatch.delenv(cache_writer.KILL_ENV)
    _, stats = ensure(record_dir, scratch)  # what rerunning snakemake does: build_cache (or the epoch) ensures the cache again
    assert stats["devices"] == TWO and built_recipe(directory) == recipe(record)
    for name in [*cache_files(), "sentinel.json"]:  # the two workers' cache is the one-process build's, byte for byte
        assert (directory / name).read_bytes() == (expected / name).read_bytes(), name


HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from rffm.runtime.devices import acquire
    directory, log, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with acquire(["gpu:0", "gpu:1"], directory) as lease:
        with open(log, "a") as out:
            out.write(f"{lease.device} {time.monotonic()} start {os.getpid()}\\n")
        time.sleep(hold)
        with open(log, "a") as out:
            out.write(f"{lease.device} {time.monotonic()} stop {os.getpid()}\\n")
    """
)


def test_concurrent_jobs_never_share_a_device_and_each_gets_one(tmp_path: Path):
    assert devices.choose(["gpu:0", "gpu:1"], []) == ["gpu:0"]
    assert devices.choose(["gpu:0", "gpu:1"], ["gpu:0"]) == ["gpu:1"]
    assert devices.choose(["gpu:0", "gpu:1"], ["gpu:0", "gpu:1"]) is None  # a job waits rather than run without one
    assert devices.choose(["gpu:0", "gpu:1"], ["gpu:1"], count=2) is None
    locks, log = tmp_path / "devices", tmp_path / "log"
    jobs = [subprocess.Popen([sys.executable, "-c", HOLDER, str(locks), str(log), "0.3"]) for _ in range(5)]
    assert [job.wait(timeout=60) for job in jobs] == [0] * 5
    events = sorted((float(at), kind, device, pid) for device, at, kind, pid in (line.split() for line in log.read_text().splitlines()))
    assert sorted(pid for _, kind, _, pid in events if kind == "start") == sorted(str(job.pid) for job in jobs)  # every job got a device
    holding: dict[str, str] = {}
    for _, kind, device, pid in events:
        if kind == "start":
            assert device not in holding, f"{device} given to {pid} while {holding.get(device)} held it"
            holding[device] = pid
        else:
            assert holding.pop(device) == pid
    assert {device for _, _, device, _ in events} == {"gpu:0", "gpu:1"}
    # a job finding every device held waits, then says who holds them; ending the holder (its Fix) frees the device
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(locks), str(tmp_path / "log2"), "60"])
    deadline = time.monotonic() + 30
    while not (tmp_path / "log2").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert devices.try_acquire(["gpu:0", "gpu:1"], locks, count=2) is None  # a whole-node job takes all or none
    with devices.acquire(["gpu:0", "gpu:1"], locks) as lease:
        assert lease.device == "gpu:1"
        with pytest.raises(ConfigError, match=r"no 1 of the node's devices came free in 0.1 s") as caught:
            devices.acquire(["gpu:0", "gpu:1"], locks, timeout_s=0.1)
        assert "end the processes named" in fix_of(caught)
        os.kill(int(re.search(r"gpu:0 by pid (\d+)", str(caught.value))[1]), signal.SIGKILL)  # a killed job keeps no device
        assert holder.wait(timeout=30) == -signal.SIGKILL
        with devices.acquire(["gpu:0", "gpu:1"], locks, timeout_s=5) as again:
            assert again.device == "gpu:0"
    with devices.acquire(["gpu:0", "gpu:1"], locks, count=2, timeout_s=5) as lease:
        assert lease.devices == ["gpu:0", "gpu:1"]


def test_build_cache_hands_the_gpus_it_holds_to_the_build(reference, tmp_path: Path, monkeypatch):
    """build_cache passes two or more devices on to the build (one worker each); one device (the CPU) stays the
    one-process build, its options as before."""
    from rffm.steps import build_cache

    record_dir, _ = reference
    results = record_dir.parent.parent
    given = []
    monkeypatch.setattr(build_cache, "ensure", lambda record, out, scratch, options, *rest: given.append(options) or (tmp_path, None))
    for devices_held in (TWO, ["cpu"]):
        cache_build(results / "datasets/t", results / "backbones/b", tmp_path / "record", tmp_path / "scratch", devices=devices_held)
    assert [options["devices"] for options in given] == [TWO, None]


def step_options(step: str, tmp_path: Path, monkeypatch, device: str, visible: list[str]) -> dict:
    """What `rffm <step> --device <device>` hands its run() on a node whose GPUs are `visible` (fakes: no GPU here)."""
    import argparse

    from rffm.cli import steps as cli
    from rffm.records.pipeline import STEPS

    [rule] = [row for row in STEPS if row.rule == step]
    module = __import__(f"rffm.{rule.module}", fromlist=["run"])
    signature = inspect.signature(module.run)
    passed: dict = {}

    def run(*args, **kwargs) -> Path:
        passed.update(signature.bind(*args, **kwargs).arguments)
        held = devices.try_acquire(visible, device_module.lock_directory(tmp_path / "scratch"), count=1)
        passed["free while it ran"] = held.devices if held else []
        if held:
            held.release()
        return tmp_path / "sentinel.json"

    run.__signature__ = signature
    monkeypatch.setattr(module, "run", run)
    monkeypatch.setattr("rffm.runtime.device.setup", lambda threads: None)
    monkeypatch.setattr("rffm.runtime.device.resolve", lambda name: name)  # no CUDA here: the device as named
    monkeypatch.setattr("rffm.runtime.device.visible_gpus", lambda: visible)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    args = {cli._dest(flag): "" for flag in rule.flags} | {"scratch": str(tmp_path / "scratch"), "members": ""}
    for flag in rule.flags:
        if cli.FLAGS[flag].get("type") in (int, float):
            args[cli._dest(flag)] = 0
    args |= {"spec": {"run": "r"}} if rule.spec else {}
    monkeypatch.setattr("rffm.steps.train_epoch.check_planned_members", lambda *_: None)
    cli.run_step(argparse.Namespace(step=rule, threads=1, device=device, **args))
    return passed


FAKE_GPUS = ["cuda:0", "cuda:1", "cuda:2"]


@pytest.mark.parametrize(
    ("step", "device", "others_hold", "computes_on", "free_while_it_ran"),
    [
        ("build_cache", "cuda", [], ("cuda:0", FAKE_GPUS), []),  # every GPU of the node, one worker each
        ("build_cache", "cuda", ["cuda:0"], ("cuda:1", ["cuda:1", "cuda:2"]), []),  # every free one
        ("train_epoch", "cuda", [], ("cuda:0", None), ["cuda:1"]),  # one GPU of its own, the others free
        ("train_epoch", "cuda", ["cuda:0", "cuda:1"], ("cuda:2", None), []),  # not one a concurrent epoch holds
        ("build_cache", "cpu", [], ("cpu", ["cpu"]), ["cuda:0"]),  # the CPU: nothing held, the one-process build
        ("train_epoch", "cuda:1", [], ("cuda:1", None), ["cuda:0"]),  # a GPU the config names: as it is
    ],
)
def test_each_group_member_computes_on_gpus_of_its_own(step, device, others_hold, computes_on, free_while_it_ran, tmp_path, monkeypatch):
    """Issue 36: the epochs a group job runs at once each pin one GPU of the node (never one another holds; waiting
    while all are held: test_concurrent_jobs_never_share_a_device_and_each_gets_one), a cache build every free one."""
    locks = device_module.lock_directory(tmp_path / "scratch")
    others = devices.try_acquire(FAKE_GPUS, locks, count=len(others_hold)) if others_hold else None  # concurrent epochs
    assert others is None or others.devices == others_hold
    passed = step_options(step, tmp_path, monkeypatch, device, FAKE_GPUS)
    assert (passed["device"], passed.get("devices")) == computes_on
    assert passed["free while it ran"] == free_while_it_ran
    assert devices.try_acquire(FAKE_GPUS, locks, count=3 - len(others_hold)) is not None  # it let its GPUs go
