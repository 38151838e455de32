"""Bring your own backbone (issue 20): the three example backbones through the real workflow on the tiny config.

A WavesFM-shaped ViT (python, {"model": state_dict} .pth, hooks on blocks + CLS prefix), a SpectrumFM-shaped
model (python, safetensors, a method returning layers, one token per sample) and a .pt2 exported from it
(export, its outputs in order), at test sizes; then the reruns each change plans, and the cache planner.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from byo import backbones, user_models
from conftest import BIN, accuracy_of_examples, copy_workdir, planned_jobs, snakemake, tiny_config, write_config
from fixes import fix_of
from rffm.data import cache_plan
from rffm.errors import IntegrityError
from rffm.model import foreign
from rffm.model.taps import keep_options, spec_for
from rffm.records.files import sha256_file
from rffm.records.layout import BACKBONE_NAME, SENTINEL_NAME

pytestmark = pytest.mark.workflow

RUNS = ("waves", "spectrum", "exported")


def byo_config(specs: dict) -> dict:
    config = tiny_config()
    config["backbones"] = specs
    base = config["runs"].pop("base")
    base.pop("profiling")
    config["runs"] = {name: copy.deepcopy({**base, "backbone": name}) for name in RUNS}  # no YAML aliases between runs
    return config


@pytest.fixture
def byo_selected(matrix_selected_tree: Path) -> Path:
    """The three runs (waves, spectrum, exported) trained and selected, never qualified, beside a run of every other kind
    (conftest.matrix_config): read it, or copy it before a change."""
    return matrix_selected_tree


@pytest.fixture
def byo_finished(matrix_tree: Path) -> Path:
    """The same runs qualified: read it, or copy it before a change."""
    return matrix_tree


@pytest.fixture
def byo_workdir(byo_selected: Path, tmp_path: Path) -> Path:
    return copy_workdir(byo_selected, tmp_path / "work")


def results_files(workdir: Path) -> dict[str, bytes]:
    """Every file under results/ with its bytes."""
    return {p.relative_to(workdir).as_posix(): p.read_bytes() for p in sorted((workdir / "results").rglob("*")) if p.is_file()}


def config_of(workdir: Path) -> dict:
    import yaml

    return yaml.safe_load((workdir / "config.yaml").read_text())


def test_each_example_backbone_runs_to_a_qualified_run_and_verifies(byo_finished: Path):
    results = byo_finished / "results"
    for run in RUNS:
        manifest = json.loads((results / f"runs/{run}/qualification/run_manifest.json").read_text())
        assert manifest["backbone"]["name"] == run
        assert manifest["qualification"]["accuracy"] == accuracy_of_examples(results / f"runs/{run}/qualification")
    waves = json.loads((results / "runs/waves/qualification/run_manifest.json").read_text())["backbone"]
    assert waves["source"] == "python" and waves["entry_point"] == "wavesfm_like:build" and waves["parameters"] > 10_000
    assert waves["package"]["name"] == "wavesfm_like" and len(waves["package"]["source_sha256"]) == 64
    assert json.loads((results / "runs/exported/qualification/run_manifest.json").read_text())["backbone"]["source"] == "export"
    shapes = {run: json.loads((results / f"caches/tiny__{run}/sentinel.json").read_text())["cache"]["shapes"]["train"][1:] for run in RUNS}
    assert shapes == {"waves": [2, 2, 32], "spectrum": [2, 1, 16], "exported": [2, 8, 16]}  # prefix+mean; mean; every:8 of 64
    verify = subprocess.run([str(BIN / "rffm"), "verify", str(results)], capture_output=True, text=True)
    assert verify.returncode == 0 and " 0 problem(s)" in verify.stdout, verify.stdout + verify.stderr


def after_cache(run: str) -> list[str]:
    epochs = [f"train_epoch[run={run}, epoch=1]"]  # the matrix's runs of a user backbone train one epoch
    return [f"build_cache[dataset=tiny, backbone={run}]", *epochs, f"select_checkpoint[run={run}]", f"plot_training[run={run}]"]


def test_editing_the_user_class_reruns_import_cache_epochs_and_selection(byo_workdir: Path, monkeypatch: pytest.MonkeyPatch):
    source = byo_workdir / "models/spectrumfm_like.py"
    source.write_text(source.read_text().replace("x = x + 0.5 * self.ff2(x)", "x = x + 0.5 * self.ff2(x)  # edited"))
    expected = ["import_backbone[backbone=spectrum]", *after_cache("spectrum")]
    assert planned_jobs(byo_workdir, "validation_selection") == sorted(expected)
    # issue 34: a step that loads the backbone after the edit (a job started before it) refuses; its Fix works as printed
    folder = byo_workdir / "results/backbones/spectrum"
    monkeypatch.chdir(byo_workdir)  # where the jobs run: the config's import_path is relative to it

    def load() -> str:
        record = json.loads((folder / SENTINEL_NAME).read_text())["backbone"]
        return foreign.load(record, folder / BACKBONE_NAME, "backbones.spectrum")[1]

    with pytest.raises(IntegrityError, match="changed since it was imported") as refused:
        load()
    assert fix_of(refused) == "rerun snakemake, which imports it again."
    snakemake(byo_workdir, "validation_selection")
    assert load() == json.loads((folder / SENTINEL_NAME).read_text())["backbone"]["fingerprint"]


def test_editing_a_qualified_runs_user_class_is_refused_before_anything_runs_or_is_deleted(byo_finished: Path, tmp_path: Path):
    """Issue 34: the ledger entry records the user module's source digest; an edit is refused for every target, in one
    line naming it, and the tree is left byte for byte; restoring the source (the first fix) plans nothing again."""
    workdir = copy_workdir(byo_finished, tmp_path / "work")
    before = results_files(workdir)
    source = workdir / "models/spectrumfm_like.py"
    original = source.read_text()
    source.write_text(original.replace("x = x + 0.5 * self.ff2(x)", "x = x + 0.5 * self.ff2(x)  # edited"))
    for args in ([], ["validation_selection"], ["-n"], ["-n", "validation_selection"]):
        refused = snakemake(workdir, *args, check=False)
        lines = [line for line in (refused.stdout + refused.stderr).splitlines() if line.startswith("rffm: runs.spectrum")]
        assert refused.returncode != 0 and len(lines) == 1, (args, refused.stderr[-2000:])
        assert "source of backbones.spectrum.python.entry_point" in lines[0] and "Fix: restore that code" in lines[0]
    assert results_files(workdir) == before
    source.write_text(original)
    assert planned_jobs(workdir) == []
    verify = subprocess.run([str(BIN / "rffm"), "verify", str(workdir / "results")], capture_output=True, text=True)
    assert verify.returncode == 0 and " 0 problem(s)" in verify.stdout, verify.stdout + verify.stderr


def test_touching_the_weights_and_the_user_code_reruns_nothing(byo_finished: Path, tmp_path: Path):
    workdir = copy_workdir(byo_finished, tmp_path / "work")
    later = time.time() + 5
    for path in [*(workdir / "weights").iterdir(), *(workdir / "models").glob("*.py")]:
        os.utime(path, (later, later))
    assert planned_jobs(workdir) == []


def pin_refusal(workdir: Path, *args: str) -> str:
    """The one line a plan refused with for the exported backbone's pin (nothing may have run)."""
    refused = snakemake(workdir, *args, check=False)
    lines = [line.strip() for line in (refused.stdout + refused.stderr).splitlines() if "backbones.exported.sha256" in line]
    assert refused.returncode != 0 and len(lines) == 1, (args, refused.stderr[-2000:])
    return lines[0]


def test_a_backbone_file_that_is_not_the_pinned_one_is_refused_while_planning_and_each_fix_works(byo_workdir: Path):
    """Issue 34: planning compares an existing file's sha256 with the pin (-n included), before any job; both fixes the
    line names, applied literally, plan and finish the workflow with verify clean."""
    config = config_of(byo_workdir)
    program, pinned = byo_workdir / "weights/spectrumfm_like.pt2", config["backbones"]["exported"]["sha256"]
    before = results_files(byo_workdir)
    # a typo in the pin: set sha256 to what the file has (the file is the one to import)
    typo = copy.deepcopy(config)
    typo["backbones"]["exported"]["sha256"] = "0" * 64
    write_config(byo_workdir, typo)
    for args in (["-n"], ["validation_selection"]):
        line = pin_refusal(byo_workdir, *args)
        assert line == (
            f"backbones.exported.sha256: weights/spectrumfm_like.pt2 has sha256 {pinned}, config expects {'0' * 64}. "
            f"Fix: point backbones.exported.path at the pinned file, or set backbones.exported.sha256: {pinned} if "
            "weights/spectrumfm_like.pt2 is the file to import (which reruns everything built on that backbone)"
        )
    assert results_files(byo_workdir) == before
    write_config(byo_workdir, config)  # sha256: the digest the line named
    assert planned_jobs(byo_workdir, "validation_selection") == []
    # the file replaced: point path at the pinned file (kept elsewhere)
    shutil.copyfile(program, byo_workdir / "weights/pinned.pt2")
    program.write_bytes(program.read_bytes() + b"not the pinned bytes")
    line = pin_refusal(byo_workdir, "-n", "validation_selection")
    assert f"weights/spectrumfm_like.pt2 has sha256 {sha256_file(program)}, config expects {pinned}." in line
    assert results_files(byo_workdir) == before
    config["backbones"]["exported"]["path"] = "weights/pinned.pt2"
    write_config(byo_workdir, config)
    snakemake(byo_workdir, "validation_selection")
    assert planned_jobs(byo_workdir, "validation_selection") == []
    verify = subprocess.run([str(BIN / "rffm"), "verify", str(byo_workdir / "results")], capture_output=True, text=True)
    assert verify.returncode == 0 and " 0 problem(s)" in verify.stdout, verify.stdout + verify.stderr


@pytest.mark.parametrize("change", ["taps", "keep"])
def test_changing_the_taps_or_the_token_choice_reruns_the_cache_and_what_follows(byo_workdir: Path, change: str):
    config = config_of(byo_workdir)
    if change == "taps":
        config["backbones"]["waves"]["taps"]["modules"] = ["blocks.1", "norm"]
    else:
        config["backbones"]["waves"]["keep"] = "mean"
    write_config(byo_workdir, config)
    assert planned_jobs(byo_workdir, "validation_selection") == sorted(after_cache("waves"))


def test_changing_the_head_lr_reruns_neither_import_nor_cache(byo_workdir: Path):
    config = config_of(byo_workdir)
    config["runs"]["waves"]["train"]["lr"] = 0.02
    write_config(byo_workdir, config)
    assert planned_jobs(byo_workdir, "validation_selection") == sorted(after_cache("waves")[1:])


def test_a_cache_that_cannot_fit_is_refused_while_planning_and_mean_tokens_plan_and_run(tmp_path: Path):
    workdir = tmp_path / "fit"
    workdir.mkdir()
    specs = backbones(user_models(workdir))
    config = byo_config(specs)
    config["runs"] = {"spectrum": config["runs"]["spectrum"]}
    config["backbones"] = {"spectrum": {**specs["spectrum"], "keep": "all"}}
    write_config(workdir, config)
    counts = {"train": 64, "val": 32, "test": 32}  # the tiny config: 4 classes x 2 SNRs x 16, split 0.5 / 0.25 / 0.25
    spec = spec_for(specs["spectrum"])
    classes = tiny_config()["datasets"]["tiny"]["synthetic"]["classes"]
    sizes = cache_plan.option_sizes(counts, [(64, 16, False)] * 2, spec, classes, keep_options(0, "all"))
    disk_mb = (sizes["all"] + sizes["mean"]) / 2 * 1.1 / 1e6  # between what mean and every token need
    result = snakemake(workdir, "-n", "--set-resources", f"build_cache:disk_mb={disk_mb:.3f}", check=False)
    assert result.returncode != 0
    (line,) = [line for line in (result.stdout + result.stderr).splitlines() if "caches/tiny__spectrum" in line]
    assert f"needs {sizes['all']} bytes" in line and "disk_mb" in line and "Fix:" in line
    for option in ("all", "mean", "every:4"):
        assert f"{option} {sizes[option]} bytes" in line
    assert not (workdir / "results").exists()
    config["backbones"]["spectrum"]["keep"] = "mean"
    write_config(workdir, config)
    snakemake(workdir, "--set-resources", f"build_cache:disk_mb={disk_mb:.3f}")
    memo = workdir / "scratch/tiny__spectrum"
    files = list(memo.iterdir())
    assert len(files) == 8  # hidden states, labels and SNRs of train and val, meta.json, the sentinel
    assert sum(-(-p.stat().st_size // 4096) * 4096 for p in files) == sizes["mean"]  # exact, in 4 KiB blocks
    on_disk = sum(p.stat().st_blocks * 512 for p in files)  # what this filesystem allocated
    assert abs(on_disk - sizes["mean"]) <= len(files) * 4096, (on_disk, sizes["mean"])
    assert (workdir / "results/runs/spectrum/qualification/run_manifest.json").exists()
