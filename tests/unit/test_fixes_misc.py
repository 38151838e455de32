"""Issue 34: printed Fixes no other test follows — the optional extras (`pip install 'rffm[...]'`), RadioML and HDF5
source files that are not the layout they claim, a checkpoint that is no rffm backbone, a hidden-state cache the scratch
disk cannot hold, a head tap its backbone lacks, a key with alternative forms, a hidden-state cache changed after it was
built, a plan judged by other config files than the recorded ones, and a GPU the job was given but torch cannot see.
Each is provoked, its Fix is done as written (the printed command run as printed, the file written or pointed at as it
says, the config edited as it says), and the same call then works."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys
import time
import tomllib
from importlib import metadata
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from cached_tiny import build_cache
from packaging.requirements import Requirement
from test_sources_malformed import CASES, SPLITS, poke, replace, rml2016, rml2018

import rfdata
from conftest import REPO, copy_workdir, import_checkpoint, stage, tiny_config, train_one_epoch, write_config
from fixes import fix_of, run_fix
from rffm import config
from rffm.cli import main
from rffm.config import check
from rffm.data import cache_plan
from rffm.errors import DataError, IntegrityError
from rffm.records import ledger, pipeline
from rffm.records.code import code_digest
from rffm.records.files import sha256_file
from rffm.records.store import PosixStore
from rffm.runtime import tensorboard

# A printed `pip install` run as printed, but never online and never changing this shared venv: it must find every
# requirement already satisfied (so it would install nothing), which is what a user with the extra installed sees.
OFFLINE_PIP = {"PIP_NO_INDEX": "1", "PIP_DRY_RUN": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
IMAGE = "us-central1-docker.pkg.dev/p/rffm/worker@sha256:" + "ab" * 32


def extra_installs(command: str, module: str) -> str:
    """The extra a printed `pip install 'rffm[<extra>]'` names, after checking pyproject.toml defines it and one of its
    requirements is the distribution that holds `module`."""
    match = re.fullmatch(r"pip install 'rffm\[(\w+)\]'", command)
    assert match, command
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert match[1] in extras, f"{command}: pyproject.toml has no extra {match[1]!r}"
    where = module.replace(".", "/")
    holders = [
        name
        for name in (Requirement(line).name for line in extras[match[1]])
        if any(str(file) == f"{where}.py" or str(file).startswith(f"{where}/") for file in metadata.files(name) or [])
    ]
    assert holders, f"no requirement of the extra {match[1]!r} installs {module}"
    return match[1]


def cli_refusal(capsys, argv: list[str]) -> str:
    """The one line `rffm <argv>` refuses with (exit 2)."""
    capsys.readouterr()
    assert main(argv) == 2
    return capsys.readouterr().err.strip()


def tensorboard_export(tmp: Path, finished: Path, capsys, refused: bool) -> str | bool:
    argv = ["tensorboard", str(finished / "results"), "--log-dir", str(tmp / "events")]
    if refused:
        return cli_refusal(capsys, argv)
    return main(argv) == 0 and (tmp / "events/base").is_dir()


def epoch_log(tmp: Path, finished: Path, capsys, refused: bool) -> str | bool:
    capsys.readouterr()
    written = tensorboard.log_epoch("r", {"epoch": 1, "val_accuracy": 0.5})
    if refused:
        assert written is None
        return capsys.readouterr().err.strip()
    return written == str(tmp / "epoch-events/r") and any((tmp / "epoch-events/r").iterdir())


def vertex_request(tmp: Path, finished: Path, capsys, refused: bool) -> str | bool:
    job = str(tmp / "job.json")
    argv = ["vertex-job", "--image", IMAGE, "--config", "/gcs/b/rffm/config.yaml", "--output", "gs://b/rffm", "--out", job]
    if refused:
        return cli_refusal(capsys, argv)
    return main(argv) == 0 and (tmp / "job.json").is_file()


# site -> (the modules hidden as if the extra were not installed, the call: refused -> its line, else -> it worked)
EXTRAS = {
    "rffm tensorboard": (["tensorboardX"], tensorboard_export),
    "an epoch's TensorBoard log": (["tensorboardX"], epoch_log),
    "rffm vertex-job": (["google.cloud.aiplatform_v1", "google.cloud.aiplatform_v1.types"], vertex_request),
}


@pytest.mark.parametrize("site", EXTRAS)
def test_a_missing_optional_package_is_fixed_by_the_printed_pip_install_of_its_extra(
    site: str, finished_workdir: Path, tmp_path: Path, monkeypatch, capsys
):
    """`rffm mlflow`'s line is followed in tests/workflow/test_fixes_misc_workflow.py."""
    modules, call = EXTRAS[site]
    pytest.importorskip(modules[-1])  # the dev extras installed (make setup)
    monkeypatch.delenv("AIP_TENSORBOARD_LOG_DIR", raising=False)
    monkeypatch.setenv("RFFM_TENSORBOARD_DIR", str(tmp_path / "epoch-events"))  # where an epoch logs (rffm tensorboard: --log-dir)
    with monkeypatch.context() as hidden:
        for module in modules:
            hidden.setitem(sys.modules, module, None)  # its import now raises ImportError, as when it is not installed
        line = call(tmp_path, finished_workdir, capsys, refused=True)
    assert line.count("\n") == 0 and " is not installed" in line, line
    command = fix_of(line)
    extra = extra_installs(command, modules[-1])
    done = run_fix(command, tmp_path, env=OFFLINE_PIP)
    assert f"Requirement already satisfied: rffm[{extra}]" in done.stdout and "Would install" not in done.stdout, done.stdout
    assert call(tmp_path, finished_workdir, capsys, refused=False)


# ---- source files that are not the layout they claim (provoked as tests/unit/test_sources_malformed.py does) ----

RML2018_FIX = "point radioml2018.path at GOLD_XYZ_OSC.0001_1024.hdf5 (X float32 [N, 1024, 2], Y one-hot [N, 24], Z SNR dB [N, 1])."


def extracted_rml2018(spec: dict, data: Path) -> None:
    """What DeepSig's archive extracts (the layout the Fix spells out: X [N, 1024, 2]), pointed at."""
    (data / "extracted").mkdir(exist_ok=True)
    x, columns, snrs = rfdata.rml2018_data(["BPSK", "QPSK"], per_key=4, length=1024)
    path = rfdata.write_rml2018_hdf5(data / "extracted/GOLD_XYZ_OSC.0001_1024.hdf5", x, columns, snrs)
    spec.update(source="radioml2018", radioml2018={"path": str(path)}, select={"classes": ["BPSK", "QPSK"]})


def extracted_rml2016(spec: dict, data: Path) -> None:
    (data / "extracted").mkdir(exist_ok=True)
    path = rfdata.write_rml2016_pickle(data / "extracted/RML2016.10a_dict.pkl", rfdata.rml2016_data(per_key=4))
    spec["radioml2016"]["path"] = str(path)


def off_grid_rml2016(data: Path) -> dict:
    """A pickle of the RML2016 dict layout holding an SNR no RML2016 file has (random examples: no duplicates)."""
    arrays = rfdata.rml2016_data(per_key=4)
    arrays[("QPSK", 19)] = np.random.default_rng(5).standard_normal((4, 2, 128)).astype(np.float32)
    return rml2016(data, arrays)


def as_canonical_hdf5(spec: dict, data: Path) -> None:
    """The Fix for a dict that is not RML2016's: converted to the canonical layout, and `source: hdf5`."""
    with open(spec["radioml2016"]["path"], "rb") as handle:
        arrays = pickle.load(handle, encoding="latin1")  # the user's own file: they trust it
    keys = sorted(arrays)
    classes = sorted({modulation for modulation, _ in keys})
    iq = np.concatenate([arrays[key] for key in keys])
    labels = np.concatenate([np.full(len(arrays[key]), classes.index(key[0])) for key in keys])
    snrs = np.concatenate([np.full(len(arrays[key]), key[1], np.float32) for key in keys])
    path = rfdata.write_canonical_hdf5(data / "converted.h5", iq, labels, classes, snrs)
    del spec["radioml2016"]
    spec.update(source="hdf5", hdf5={"path": str(path)})


def edit_rml2018(spec: dict, edit) -> None:
    with h5py.File(spec["radioml2018"]["path"], "a") as handle:
        edit(handle)


ORIGINAL_Z = rfdata.rml2018_data(["BPSK", "QPSK"], per_key=4, length=32)[2]  # what test_sources_malformed's file holds

# kind -> (how the file is made: a CASES kind or a builder, the printed Fix, what a user does on reading it)
FILE_FIXES = {
    "rml2016 not a pickle": (
        "rml2016 not a pickle",
        "point radioml2016.path at RML2016.10a_dict.pkl or RML2016.10b.dat as extracted from DeepSig's archive.",
        extracted_rml2016,
    ),
    "rml2016 snr off grid": (
        off_grid_rml2016,
        "this is not an RML2016.10a/b file; convert it to the canonical layout and use source: hdf5.",
        as_canonical_hdf5,
    ),
    "rml2018 missing dataset": ("rml2018 missing dataset", RML2018_FIX, extracted_rml2018),
    "rml2018 X transposed": ("rml2018 X transposed", RML2018_FIX, extracted_rml2018),
    "rml2018 X not float32": ("rml2018 X not float32", RML2018_FIX, extracted_rml2018),
    "rml2018 Y width": ("rml2018 Y width", RML2018_FIX, extracted_rml2018),
    "rml2018 Y rows mismatch": ("rml2018 Y rows mismatch", RML2018_FIX, extracted_rml2018),
    "rml2018 Z misshapen": (lambda t: rml2018(t, replace("Z", np.zeros((16, 2), np.int64))), RML2018_FIX, extracted_rml2018),
    "rml2018 Y not one-hot": (
        "rml2018 Y not one-hot",
        "each Y row needs exactly one 1 (the class column) and zeros elsewhere.",
        lambda spec, data: edit_rml2018(spec, poke("Y", (5, 7), 0)),  # row 5's stray 1 (column 7) made 0
    ),
    "rml2018 snr off grid": (
        "rml2018 snr off grid",
        "Z must hold the SNR in dB of each row; for other data use source: hdf5.",
        lambda spec, data: edit_rml2018(spec, poke("Z", (9, 0), ORIGINAL_Z[9])),  # row 9's SNR in dB
    ),
    "rml2018 not hdf5": ("rml2018 not hdf5", "check the path and that the file is complete.", extracted_rml2018),
}


@pytest.mark.parametrize("kind", FILE_FIXES)
def test_a_source_file_not_in_its_layout_is_fixed_by_the_file_the_fix_describes(tmp_path: Path, kind: str):
    made, expected, follow = FILE_FIXES[kind]
    data = tmp_path / "data"
    data.mkdir()
    spec = {"name": "d", "seed": 0, "splits": SPLITS} | (CASES[made][0](data) if isinstance(made, str) else made(data))
    with pytest.raises(DataError) as caught:
        stage(spec, tmp_path / "refused")
    assert fix_of(caught) == expected
    follow(spec, data)
    assert (stage(spec, tmp_path / "out").parent / "train.h5").is_file()


def test_a_checkpoint_that_is_no_rffm_backbone_is_fixed_by_pointing_at_a_backbone_pt_pretrain_backbone_wrote(
    tmp_path: Path, finished_workdir: Path
):
    foreign = tmp_path / "model.pt"
    foreign.write_bytes(b"\x80\x04K\x01.")  # a pickle torch cannot load as a checkpoint
    spec = {"name": "b", "source": "checkpoint", "path": str(foreign), "sha256": sha256_file(foreign)}
    with pytest.raises(IntegrityError) as caught:
        import_checkpoint(spec, tmp_path / "refused")
    assert fix_of(caught) == "point at an rffm backbone.pt (the files pretrain_backbone writes)."
    written = finished_workdir / "results/backbones/mini/backbone.pt"  # pretrain_backbone's, in the session's tiny run
    spec.update(path=str(written), sha256=sha256_file(written))
    assert (import_checkpoint(spec, tmp_path / "imported").parent / "backbone.pt").read_bytes() == written.read_bytes()


# ---- planning: the scratch disk, head taps, a key of alternative forms ----


def scratch_refusal(config_: dict, scratch: Path) -> str | None:
    problems = cache_plan.refusals(check(config_), "/nonexistent", str(scratch))
    assert len(problems) <= 1, problems
    return problems[0] if problems else None


@pytest.mark.parametrize("follow", ["keep", "scratch"])
def test_a_cache_the_scratch_disk_cannot_hold_is_fixed_by_a_keep_option_that_fits_or_a_larger_disk(
    tmp_path: Path, monkeypatch, follow: str
):
    small = tmp_path / "small"
    real = shutil.disk_usage

    def usage(path):  # the tiny cache is 36 KiB with keep: all, 32 KiB with the others: 37 KB free / 1.1 holds those only
        return type("Usage", (), {"free": 37_000})() if Path(path).is_relative_to(small) else real(path)

    monkeypatch.setattr(cache_plan.shutil, "disk_usage", usage)
    small.mkdir()
    fixing = tiny_config()
    problem = scratch_refusal(fixing, small / "scratch")
    assert fix_of(problem) == "set backbones.mini.keep to an option that fits (or fewer taps), or point `scratch` at a larger disk."
    if follow == "keep":
        budget = int(re.search(r"the scratch disk allows (\d+) bytes", problem)[1])
        sizes = re.search(r"size by keep option: (.+)\. Fix:", problem)[1]
        fits = [option for option, size in re.findall(r"(\S+) (\d+) bytes \(", sizes) if int(size) <= budget]
        fixing["backbones"]["mini"]["keep"] = fits[0]
        assert scratch_refusal(fixing, small / "scratch") is None
    else:
        assert scratch_refusal(fixing, tmp_path / "large/scratch") is None


@pytest.mark.parametrize("where", ["train.head.taps", "sweep"])
def test_a_head_tap_its_backbone_lacks_is_fixed_by_naming_taps_from_the_listed_ones(where: str):
    fixing = tiny_config()
    fixing["backbones"]["mini"]["arch"]["output_layers"] = 2
    run = fixing["runs"]["base"]
    if where == "sweep":
        run["sweep"] = {"train.head.taps": [["output 1"], ["output 2"]]}
    else:
        run["train"]["head"] = {"taps": ["blocks.0"]}
    (problem,) = config.problems(fixing)
    assert fix_of(problem) == "name taps from that list"
    listed = re.search(r"\(its cache holds (.+)\)\.", problem)[1].split(", ")
    if where == "sweep":
        run["sweep"]["train.head.taps"] = [[tap] for tap in listed]
    else:
        run["train"]["head"]["taps"] = listed[-1:]
    assert config.problems(fixing) == []


@pytest.mark.parametrize("form", ["number", "list"])
def test_a_value_of_neither_form_a_key_takes_is_fixed_by_writing_one_of_them(form: str):
    fixing = tiny_config()
    fixing["datasets"]["tiny"]["synthetic"]["sps"] = 1  # samples per symbol: an integer >= 2, or a list of them
    (problem,) = config.problems(fixing)
    fix = fix_of(problem)
    assert fix == "write an integer >= 2 and <= 1024, or a list of distinct items, each an integer >= 2 and <= 1024", fix
    number = int(re.match(r"write an integer >= (\d+)", fix)[1])
    fixing["datasets"]["tiny"]["synthetic"]["sps"] = number if form == "number" else [number, number + 1]
    assert config.problems(fixing) == []


# ---- the hidden-state cache on this node's scratch disk ----


def test_a_hidden_state_cache_changed_after_it_was_built_is_fixed_by_deleting_it(tmp_path: Path):
    """The printed Fix and troubleshooting.md's: delete <scratch>/<dataset>__<backbone>/ (a memo), and run again."""
    record = build_cache(tmp_path)
    memo = tmp_path / "scratch/t__b"
    damaged = max((path for path in memo.rglob("*") if path.is_file() and path.name != "sentinel.json"), key=lambda p: p.stat().st_size)
    body = bytearray(damaged.read_bytes())
    body[len(body) // 2] ^= 0xFF
    damaged.write_bytes(bytes(body))
    spec = {"run": "r", "train": {"lr": 0.01, "batch_size": 8, "seed": 0}}
    with pytest.raises(IntegrityError) as caught:
        train_one_epoch(spec, record, 1, None, tmp_path / "refused/1", tmp_path / "scratch", memo_store=tmp_path / "memo")
    assert "(the hidden-state cache was changed after it was built)" in str(caught.value)
    assert fix_of(caught) == f"delete {memo}; the next run builds it again."
    shutil.rmtree(memo)
    epoch = train_one_epoch(spec, record, 1, None, tmp_path / "run/1", tmp_path / "scratch", memo_store=tmp_path / "memo")
    assert epoch.is_file() and (memo / "sentinel.json").is_file()


# ---- the everyday commands judged by other config files than the plan recorded ----


@pytest.mark.parametrize("follow", ["the recorded files", "--by-config"])
def test_a_config_that_plans_a_run_otherwise_than_recorded_is_fixed_by_the_recorded_files_or_by_config(
    finished_workdir: Path, tmp_path: Path, monkeypatch, capsys, follow: str
):
    """troubleshooting.md: `note: plan: --config plans runs … otherwise than the workflow recorded …` — pass the recorded
    files, or add `--by-config` to judge by yours."""
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    mine = tiny_config()
    mine["runs"]["base"]["train"]["lr"] = 0.02
    (workdir / "mine.yaml").write_text(yaml.safe_dump(mine))

    def status(*options: str) -> str:
        capsys.readouterr()
        assert main(["status", "results", *options]) == 0
        return capsys.readouterr().out

    monkeypatch.chdir(workdir)
    notes = [line for line in status("--config", "mine.yaml").splitlines() if line.startswith("note: plan:")]
    assert len(notes) == 1 and "otherwise than the workflow recorded" in notes[0], notes
    if follow == "--by-config":
        options = ["--config", "mine.yaml", "--by-config"]
    else:
        recorded = re.search(r"\(base \(runs/base/launch/plan-\d+\.json: ([^)]+)\)\)", notes[0])[1].split()
        assert recorded == ["config.yaml"], notes[0]
        options = ["--config", *recorded]
    again = status(*options)
    assert "note: plan:" not in again and re.search(r"^base\s+qualified\s+3/3", again, re.M), again


# ---- a qualified run whose code changed (records/ledger.py, the plan's refusal) ----


def test_a_qualified_runs_changed_code_is_fixed_by_taking_the_run_out_and_the_code_under_a_new_id(
    finished_workdir: Path, tmp_path: Path, monkeypatch, capsys
):
    """The refusal's second way out for changed code, checked as planning checks each run (FrozenRuns.refuse: the
    ledger's entries against ledger.selection_source of the config and CODE as workflow/rules/common.smk computes
    them). Restoring the code is followed in tests/workflow/test_byo.py, the Fix for changed settings in
    tests/workflow/test_everyday.py."""
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    entries = ledger.runs_qualified(PosixStore(workdir / "results"))
    code = {step.rule: code_digest(step.module) for step in pipeline.STEPS}
    assert ledger.frozen_run_problem(entries["base"], ledger.selection_source(check(tiny_config()), "base", code)) is None
    code["select_checkpoint"] = "edited " + code["select_checkpoint"]  # rffm/steps/select_checkpoint.py edited
    problem = ledger.frozen_run_problem(entries["base"], ledger.selection_source(check(tiny_config()), "base", code))
    assert problem.startswith("runs.base was qualified") and "changed since: code of select_checkpoint." in problem, problem
    assert fix_of(problem) == (
        "restore that code, or take runs.base out of your config (its qualified records stay, listed stale) and train the "
        "changed code under a new run id"
    )
    fixed = tiny_config()
    fixed["runs"]["base_2"] = fixed["runs"].pop("base")
    write_config(workdir, fixed)
    planned = check(fixed)
    assert all(
        ledger.frozen_run_problem(entries.get(run, []), ledger.selection_source(planned, run, code)) is None for run in planned["runs"]
    )
    monkeypatch.chdir(workdir)
    capsys.readouterr()
    assert main(["prune", "results"]) == 0  # judged by the plans the tree recorded: base's files no longer plan it
    assert "stale results/runs/base/qualification" in capsys.readouterr().out
    assert (workdir / "results/runs/base/qualification/sentinel.json").is_file()


# ---- a GPU the job was given that torch cannot see (runtime/device.py) ----


def resolve_cuda(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "from rffm.runtime.device import resolve; print(resolve('cuda'))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA build of torch and a GPU it can see")
def test_a_granted_gpu_torch_cannot_see_is_fixed_by_making_it_visible(tmp_path: Path):
    """The Fix (a CUDA build of torch, the GPU made visible to it) can only be done where there is a GPU: here the job
    is given a GPU (SLURM_GPUS_ON_NODE) that CUDA_VISIBLE_DEVICES hides, then the same call with the GPU visible."""
    granted = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"} | {"SLURM_GPUS_ON_NODE": "1"}
    hidden = resolve_cuda(granted | {"CUDA_VISIBLE_DEVICES": ""})
    line = hidden.stderr.strip().splitlines()[-1]
    assert hidden.returncode != 0 and "this job was given a GPU (SLURM_GPUS_ON_NODE=1) but torch sees none" in line, hidden.stderr
    assert fix_of(line.split(": ", 1)[1]).startswith("run a CUDA build of torch in the job's environment or image, and make the GPU")
    visible = resolve_cuda(granted)
    assert visible.returncode == 0 and visible.stdout.strip() == "cuda", visible.stderr


def test_a_bench_on_a_busy_machine_is_fixed_by_stopping_the_listed_schedulers(tmp_path: Path, monkeypatch):
    import rffm.bench
    from rffm.bench import other_schedulers, require_idle
    from rffm.errors import RffmError

    (tmp_path / "snakemake").symlink_to(shutil.which("sleep"))
    leftover = subprocess.Popen([str(tmp_path / "snakemake"), "60"])
    # until it execs, the child's command line is still this Python's: the scan would not see a scheduler yet
    for _ in range(500):
        if b"snakemake" in Path(f"/proc/{leftover.pid}/cmdline").read_bytes():
            break
        time.sleep(0.01)
    # the process table shows the leftover alone: the Fix run as printed must not stop the suite's other schedulers
    table = tmp_path / "proc"
    table.mkdir()
    (table / str(leftover.pid)).symlink_to(f"/proc/{leftover.pid}")
    monkeypatch.setattr(rffm.bench, "PROC", table)
    try:
        with pytest.raises(RffmError, match=rf"pid [0-9 ]*\b{leftover.pid}\b") as caught:
            require_idle("scale")
        run_fix(fix_of(caught), tmp_path)
        assert leftover.wait(timeout=10) != 0
        assert leftover.pid not in other_schedulers()
    finally:
        leftover.kill()
