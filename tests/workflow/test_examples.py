"""Every example config plans: `snakemake -n` on each of config/examples/*.yaml, so an example that no longer plans
(a key renamed, a default it relied on changed, a backbone that does not fit its data) is caught.

A real-data example runs in a directory of its own with small real files in its source's layout where it names
them (tests/rfdata.py); one without `datasets` is used with the default config (its comment says so), merged as
`--configfile config/config.yaml <example>` merges it, with its weights written by make_weights.py."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

import byo
from conftest import BIN, REPO, planned_jobs, write_config
from rfdata import rml2016_data, rml2018_data, sigmf_recording, write_canonical_hdf5, write_rml2016_pickle, write_rml2018_hdf5
from rffm import config as rffm_config
from rffm.config.seeds import expand
from rffm.records.files import sha256_file

pytestmark = pytest.mark.workflow

EXAMPLES = sorted(path.stem for path in (REPO / "config/examples").glob("*.yaml"))
MODELS = REPO / "config/examples/models"


def write_source(spec: dict, workdir: Path) -> None:
    """A small real file where a dataset entry names its source (the examples' files are not shipped)."""
    source = spec["source"]
    if source == "radioml2016":
        write_rml2016_pickle(_parent(workdir / spec["radioml2016"]["path"]), rml2016_data())
    elif source == "radioml2018":
        write_rml2018_hdf5(_parent(workdir / spec["radioml2018"]["path"]), *rml2018_data(["BPSK", "QPSK", "8PSK", "16QAM"]))
    elif source == "sigmf":
        for recording in spec["sigmf"]["recordings"]:
            folder = workdir / recording
            sigmf_recording(_parent(folder / "capture"), ["BPSK", "QPSK"], window=spec["sigmf"]["window"])
    elif source == "hdf5":
        rng = np.random.default_rng(0)
        iq, labels = rng.normal(size=(64, 2, 128)), np.repeat(np.arange(2), 32)
        write_canonical_hdf5(_parent(workdir / spec["hdf5"]["path"]), iq, labels, ["BPSK", "QPSK"], np.zeros(64))


def _parent(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def example_weights(tmp_path_factory) -> Path:
    """The bring-your-own examples' user code and weights, as `make example-weights` writes them."""
    models = tmp_path_factory.mktemp("models") / "config/examples/models"
    shutil.copytree(MODELS, models, ignore=shutil.ignore_patterns("weights", "__pycache__"))
    subprocess.run([str(BIN / "python"), str(models / "make_weights.py"), str(models / "weights")], check=True, capture_output=True)
    return models


def example_config(name: str, workdir: Path, example_weights: Path) -> dict:
    """The config an example is run with: itself, or merged over the default config when it defines no datasets."""
    example = yaml.safe_load((REPO / f"config/examples/{name}.yaml").read_text())
    if "datasets" in example:
        for spec in example["datasets"].values():
            write_source(spec, workdir)
        return example
    shutil.copytree(example_weights, workdir / "config/examples/models")
    return rffm_config.merge(yaml.safe_load((REPO / "config/config.yaml").read_text()), example)


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_config_plans_every_run_it_defines(name: str, tmp_path: Path, example_weights: Path):
    config = example_config(name, tmp_path, example_weights)
    write_config(tmp_path, config)
    jobs = planned_jobs(tmp_path)
    config = expand(copy.deepcopy(config))  # each seed its own run (random_floor: 3 of each)
    assert qualified(jobs, "qualify") == set(config["runs"]), jobs
    assert qualified(jobs, "qualify_reference") == set(config.get("references", {})), jobs


def qualified(jobs: list[str], rule: str) -> set[str]:
    """The ids a plan qualifies with `rule` (its jobs' one wildcard value: the run or reference id)."""
    return {job.partition("=")[2].rstrip("]") for job in jobs if job.startswith(f"{rule}[")}


def test_example_weights_are_the_bytes_the_example_configs_pin(example_weights: Path):
    """`make example-weights` (the documented sizes), written in another directory than the pins were: the same bytes,
    so every example that pins one of them imports it (planning compares the digest, so the plan test above fails too)."""
    pins = {}
    for name in ("exported_backbone", "wavesfm_like", "spectrumfm_like"):
        for spec in yaml.safe_load((REPO / f"config/examples/{name}.yaml").read_text())["backbones"].values():
            pins[Path(spec["path"]).name] = spec["sha256"]
    assert set(pins) == {"spectrumfm_like.pt2", "wavesfm_like.pth", "spectrumfm_like.safetensors"}
    assert {name: sha256_file(example_weights / "weights" / name) for name in pins} == pins


def written_in(folder: Path) -> dict[str, str]:
    """make_weights.write_all (at the tests' sizes) run in a fresh interpreter from a copy of the example code in folder."""
    models = folder / "config/examples/models"
    shutil.copytree(MODELS, models, ignore=shutil.ignore_patterns("weights", "__pycache__"))
    code = (
        f"import json, sys; from pathlib import Path; sys.path.insert(0, {str(models)!r}); import make_weights; "
        f"print(json.dumps(make_weights.write_all(Path({str(models / 'weights')!r}), {byo.WAVES!r}, {byo.SPECTRUM!r}, "
        f"{byo.EXPORTED_LAYERS!r})))"
    )
    done = subprocess.run([str(BIN / "python"), "-c", code], cwd=folder, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_every_file_make_example_weights_writes_is_the_same_bytes_in_any_directory(tmp_path: Path):
    """Issue 34: the .pt2 held the checkout's absolute path (its stack traces), so each checkout had its own digest."""
    here = byo.make_weights.write_all(tmp_path / "here", byo.WAVES, byo.SPECTRUM, byo.EXPORTED_LAYERS)  # this checkout's code
    assert len(here) == 4 and written_in(tmp_path / "a checkout with a much longer path" / "and another level") == here
