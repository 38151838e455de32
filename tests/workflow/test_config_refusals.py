"""The real `snakemake` (not a dry run) refuses malformed configurations before any job starts: a non-zero
exit, the one line naming the key in stderr, no Python traceback, and nothing written anywhere except
Snakemake's own .snakemake/ folder (issue 14); a local dry run checks this machine as the run does, a cluster's
leaves scratch and the GPU to the nodes and says so (issue 34). The full battery is tests/unit/test_config_battery.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from conftest import BIN, REPO, planned_jobs, snakemake, tiny_config, tiny_text

pytestmark = pytest.mark.workflow


def changed(change: Callable[[dict], object]) -> Callable[[Path], str]:
    """The tiny config with one change, as YAML (NaN and infinity written as .nan and .inf)."""

    def text(workdir: Path) -> str:
        config = tiny_config()
        change(config)
        return yaml.safe_dump(config, sort_keys=False)

    return text


def edited(old: str, new: str) -> Callable[[Path], str]:
    """config/examples/tiny.yaml with one text edit (for what a mapping cannot hold: a key written twice)."""
    return lambda workdir: tiny_text().replace(old, new, 1)


def train(config: dict) -> dict:
    return config["runs"]["base"]["train"]


def with_file(name: str, change: Callable[[dict], object]) -> Callable[[Path], str]:
    """A change that refers to a regular file `name` made in the working directory first."""

    def text(workdir: Path) -> str:
        (workdir / name).write_text("a regular file\n")
        return changed(change)(workdir)

    return text


CASES = [
    (
        "results-empty",
        changed(lambda c: c.update(results="")),
        "results: empty, so every path under it would resolve against the filesystem root (/datasets, /runs ...). "
        "Fix: name a directory, e.g. results: results",
    ),
    (
        "epochs-given-twice",
        edited("train: {epochs: 3,", "train: {epochs: 30, epochs: 3,"),
        "runs.base.train.epochs: given twice in {workdir}/config.yaml (twice on line 25); "
        "YAML silently keeps the last. Fix: keep one of them",
    ),
    (
        "run-defined-twice",
        edited(
            "runs:\n", "runs:\n  base:\n    dataset: tiny\n    backbone: mini\n    train: {epochs: 9, lr: 0.1, batch_size: 8, seed: 1}\n"
        ),
        "runs.base: given twice in {workdir}/config.yaml (lines 22 and 26); YAML silently keeps the last. Fix: keep one of them",
    ),
    (
        "lr-inf",
        changed(lambda c: train(c).update(lr=float("inf"))),
        "runs.base.train.lr: .inf is not a finite number. Fix: write a number > 0 and <= 10",
    ),
    (
        "epochs-3.0",
        changed(lambda c: train(c).update(epochs=3.0)),
        "runs.base.train.epochs: 3.0 is not of type 'integer'. Fix: write 3 (an integer >= 1 and <= 10000)",
    ),
    (
        "seed-2^64",
        changed(lambda c: train(c).update(seed=2**64)),
        "runs.base.train.seed: 18446744073709551616 is greater than the maximum of 4294967295. Fix: use an integer >= 0 and <= 4294967295",
    ),
    (
        "heads-not-dividing-dim",
        changed(lambda c: c["backbones"]["mini"]["arch"].update(heads=3)),
        "backbones.mini.arch.heads: 3 does not divide dim 16. Fix: use one of 1, 2, 4, 8, 16",
    ),
    (
        "patch-longer-than-signal",
        changed(lambda c: c["backbones"]["mini"]["arch"].update(patch=128)),
        "backbones.mini.arch.patch: 128 is longer than the signal length 64 (datasets.tiny.synthetic.length). "
        "Fix: use a patch that divides 64, or change datasets.tiny.synthetic.length",
    ),
    (
        "splits-not-summing-to-1",
        changed(lambda c: c["datasets"]["tiny"]["splits"].update(test=0.5)),
        "datasets.tiny.splits: train + val + test = 1.25, not 1. "
        "Fix: give fractions that sum to 1, e.g. splits: {{train: 0.6, val: 0.2, test: 0.2}}",
    ),
    (
        # Root may write through any mode bits, so chmod cannot make a directory unwritable for it; a path
        # under a regular file fails for everyone (ENOTDIR). The read-only mount is the next test.
        "results-under-a-file",
        with_file("taken", lambda c: c.update(results="taken/results")),
        "results: {workdir}/taken/results lies under the file {workdir}/taken. "
        "Fix: set results to a directory you can write (relative paths start from {workdir})",
    ),
    (
        "scratch-is-a-file",
        with_file("taken", lambda c: c.update(scratch="taken")),
        "scratch: {workdir}/taken is a file, not a directory. "
        "Fix: set scratch to a directory you can write (relative paths start from {workdir})",
    ),
    (
        "imported-backbone-missing",
        changed(lambda c: c["backbones"].update(mini={"source": "checkpoint", "path": "models/backbone.pt", "sha256": "0" * 64})),
        "backbones.mini.path: models/backbone.pt does not exist. "
        "Fix: point it at the backbone.pt to import (relative paths start from {workdir})",
    ),
    (  # issue 23: planning passed and build_cache died with a traceback after 12 files were written
        "scratch-uncreatable",
        changed(lambda c: c.update(scratch="/proc/rffm-scratch")),
        "scratch: /proc is on the kernel's proc filesystem, where no directory can be made or written, "
        "so /proc/rffm-scratch cannot be created. Fix: set scratch to a directory you can write",
    ),
    (  # issue 23: stage_dataset started and failed inside Snakemake ("Failed to create output directory")
        "results-uncreatable",
        changed(lambda c: c.update(results="/proc/rffm-results")),
        "results: /proc is on the kernel's proc filesystem, where no directory can be made or written, "
        "so /proc/rffm-results cannot be created. Fix: set results to a directory you can write",
    ),
    ("empty-mapping", lambda workdir: "{}\n", "datasets: missing (required). Fix: add it (see config/REFERENCE.md)"),
]


def tree(root: Path) -> set[str]:
    """Every path under root except Snakemake's own state folder."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if ".snakemake" not in p.relative_to(root).parts}


def refused(workdir: Path, expected: str, *args: str) -> subprocess.CompletedProcess:
    """Run the real workflow and assert it stopped at parse time with exactly this line and wrote nothing."""
    before, root_before = tree(workdir), set(os.listdir("/"))
    result = snakemake(workdir, *args, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert f"  {expected.format(workdir=workdir)}\n" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in output and "Exception" not in output
    assert tree(workdir) == before, sorted(tree(workdir) - before)
    assert set(os.listdir("/")) == root_before
    return result


@pytest.mark.parametrize("text, expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_real_run_refuses_before_any_job(tmp_path: Path, text: Callable[[Path], str], expected: str):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(text(workdir))
    refused(workdir, expected)


def test_an_unwritable_results_dir_is_refused(tmp_path: Path, read_only_dir: Path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(changed(lambda c: c.update(results=str(read_only_dir / "results")))(workdir))
    expected = f"results: {read_only_dir} is not writable, so {read_only_dir}/results cannot be created. "
    refused(workdir, expected + "Fix: set results to a directory you can write")


def test_a_read_only_scratch_dir_is_refused(tmp_path: Path, read_only_dir: Path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(changed(lambda c: c.update(scratch=str(read_only_dir)))(workdir))
    refused(workdir, f"scratch: {read_only_dir} is not writable. Fix: set scratch to a directory you can write")


def unseen_gpu() -> tuple[str, str]:
    """A CUDA device torch cannot see on this machine, and how the refusal says what it sees."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    build = f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}"
    return ("cuda", f"torch sees no GPU here ({build})") if count == 0 else (f"cuda:{count}", f"torch sees {count} GPU(s) here")


def test_a_gpu_that_is_not_here_is_refused_by_a_local_run_and_its_dry_run(tmp_path: Path):
    """Issue 34: a local dry run plans the jobs this machine runs, so it checks the machine as the run does; the
    Fix, applied to the config, then plans the workflow."""
    device, seen = unseen_gpu()
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(changed(lambda c: c.update(device=device))(workdir))
    expected = f"device: {device!r} but {seen}. Fix: set device: cpu (or auto), or run where that GPU is visible"
    refused(workdir, expected)
    refused(workdir, expected, "-n")
    (workdir / "config.yaml").write_text(changed(lambda c: c.update(device="cpu"))(workdir))  # the Fix
    assert "stage_dataset" in snakemake(workdir, "-n").stdout


def test_a_dry_run_names_an_unusable_scratch_not_the_cache_size(workdir: Path):
    """Issue 34: with the dataset staged, the dry run measured /proc's free space (0) for the cache and said to change
    `keep`; it now checks scratch first, as the run does, and its Fix plans nothing on the finished run."""
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    (workdir / "config.yaml").write_text(yaml.safe_dump({**config, "scratch": "/proc/rffm-scratch"}, sort_keys=False))
    expected = (
        "scratch: /proc is on the kernel's proc filesystem, where no directory can be made or written, "
        "so /proc/rffm-scratch cannot be created. Fix: set scratch to a directory you can write"
    )
    assert "keep" not in refused(workdir, expected, "-n").stderr
    (workdir / "config.yaml").write_text(yaml.safe_dump({**config, "scratch": "scratch-elsewhere"}, sort_keys=False))  # the Fix
    assert planned_jobs(workdir) == []


def test_a_cluster_dry_run_leaves_scratch_and_the_gpu_to_the_nodes_and_says_so(workdir: Path):
    """Issue 34: with --profile slurm the jobs run on the nodes, whose scratch and GPU the submitting host cannot
    see: the dry run plans, and one line says where they are checked; the same config planned locally is refused."""
    device, _ = unseen_gpu()
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    (workdir / "taken").write_text("a regular file\n")
    (workdir / "config.yaml").write_text(yaml.safe_dump({**config, "scratch": "taken/scratch", "device": device}, sort_keys=False))
    cluster = snakemake(workdir, "-n", "--profile", str(REPO / "profiles/slurm"))
    notes = [line for line in cluster.stderr.splitlines() if line.startswith("rffm: ")]
    assert len(notes) == 1 and notes[0].startswith("rffm: scratch (taken/scratch) and device ("), cluster.stderr[-3000:]
    assert notes[0].endswith("are checked on each compute node when its job starts, not while planning: the executor runs the jobs there")
    local = snakemake(workdir, "-n", check=False)
    assert local.returncode != 0 and f"  scratch: {workdir}/taken/scratch lies under the file {workdir}/taken. " in local.stderr
    assert f"  device: {device!r} but " in local.stderr and "compute node" not in local.stderr, local.stderr[-3000:]


def test_rffm_status_and_posttrain_refuse_keys_given_twice(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(tiny_text().replace("threads: 1\n", "threads: 1\nthreads: 4\n"))
    expected = f"  threads: given twice in {path} (lines 3 and 4); YAML silently keeps the last. Fix: keep one of them"
    for verb in (["status", "results", "--config"], ["posttrain", "--hidden-state-cache-directory", "c", "--config"]):
        result = subprocess.run([str(BIN / "rffm"), *verb, str(path)], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 2 and expected in result.stderr.splitlines() and "Traceback" not in result.stderr, result.stderr
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]
