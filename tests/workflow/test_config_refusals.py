"""The real `snakemake` (not a dry run) refuses malformed configurations before any job starts: a non-zero
exit, the one line naming the key in stderr, no Python traceback, and nothing written anywhere except
Snakemake's own .snakemake/ folder (issue 14). The full battery of cases is tests/unit/test_config_battery.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from conftest import BIN, snakemake, tiny_config, tiny_text

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
        "datasets.tiny.splits: train + val + test = 1.25, not 1. Fix: give fractions that sum to 1 (e.g. 0.6, 0.2, 0.2)",
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


def refused(workdir: Path, expected: str, *args: str) -> None:
    """Run the real workflow and assert it stopped at parse time with exactly this line and wrote nothing."""
    before, root_before = tree(workdir), set(os.listdir("/"))
    result = snakemake(workdir, *args, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert f"  {expected.format(workdir=workdir)}\n" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in output and "Exception" not in output
    assert tree(workdir) == before, sorted(tree(workdir) - before)
    assert set(os.listdir("/")) == root_before


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


def test_a_gpu_that_is_not_here_is_refused_by_a_local_run_but_not_by_a_dry_run(tmp_path: Path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(changed(lambda c: c.update(device="cuda"))(workdir))
    build = f"torch {torch.__version__}, CUDA build none"
    refused(
        workdir, f"device: 'cuda' but torch sees no GPU here ({build}). Fix: set device: cpu (or auto), or run where that GPU is visible"
    )
    # A dry run starts no job; where jobs will run (here, or on cluster nodes) is known only once it executes.
    assert "stage_dataset" in snakemake(workdir, "-n").stdout


def test_rffm_status_and_posttrain_refuse_keys_given_twice(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(tiny_text().replace("threads: 1\n", "threads: 1\nthreads: 4\n"))
    expected = f"  threads: given twice in {path} (lines 3 and 4); YAML silently keeps the last. Fix: keep one of them"
    for verb in (["status", "results", "--config"], ["posttrain", "--hidden-state-cache-directory", "c", "--config"]):
        result = subprocess.run([str(BIN / "rffm"), *verb, str(path)], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 2 and expected in result.stderr.splitlines() and "Traceback" not in result.stderr, result.stderr
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]
