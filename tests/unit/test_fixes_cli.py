"""Issue 34: refusals of the command line and of the configuration files it is handed whose printed Fix no other test
follows; each is provoked, its Fix is done as written (the file written or passed, the option or device it names),
and the same command or call then succeeds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import REPO, tiny_text
from fixes import fix_of
from rffm import config
from rffm.cli import main
from rffm.errors import ConfigError
from rffm.runtime import device

IMAGE = "us-central1-docker.pkg.dev/p/rffm/worker"
DIGEST = "sha256:" + "ab" * 32


def refused(capsys, *argv: str) -> str:
    """The Fix the command prints for argv (it must exit 2 with one line)."""
    capsys.readouterr()
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and " Fix: " in err, err
    return err.strip().split(" Fix: ", 1)[1]


def test_a_key_given_twice_is_fixed_by_keeping_one_of_them(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(tiny_text() + "threads: 2\n")  # the tiny config says `threads: 1` already
    (problem,) = config.duplicate_keys(path)
    assert problem.startswith("threads: given twice") and problem.endswith("Fix: keep one of them"), problem
    with pytest.raises(ConfigError):
        config.load([path])
    path.write_text(tiny_text())  # the later line removed
    assert config.duplicate_keys(path) == [] and config.load([path])["threads"] == 1


def test_a_file_that_is_not_there_is_fixed_by_passing_an_existing_yaml_file(tmp_path: Path):
    (tmp_path / "config.yaml").write_text(tiny_text())
    with pytest.raises(ConfigError) as caught:
        config.load([tmp_path / "confg.yaml"])
    assert fix_of(caught) == "pass an existing YAML file."
    assert config.load([tmp_path / "config.yaml"])["runs"]


EMPTY = "write the configuration (see config/config.yaml)"
NOT_A_MAPPING = "write `key: value` lines (see config/config.yaml)"


@pytest.mark.parametrize("text, expected", [("", EMPTY), ("# all commented out\n", EMPTY), ("- datasets\n- runs\n", NOT_A_MAPPING)])
def test_an_empty_or_listed_file_is_fixed_by_writing_the_configuration_as_config_yaml_does(
    tmp_path: Path, monkeypatch, text: str, expected: str
):
    monkeypatch.chdir(tmp_path)  # config/config.yaml's relative paths (results, scratch) land here
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        config.load([path])
    assert fix_of(caught) == expected
    path.write_text((REPO / "config/config.yaml").read_text())
    assert config.load([path])["runs"]


def test_prune_without_a_config_is_fixed_by_passing_one(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no config/config.yaml here to fall back on
    (tmp_path / "results").mkdir()
    (tmp_path / "config.yaml").write_text(tiny_text())
    assert refused(capsys, "prune", "results") == "pass --config FILE"
    assert main(["prune", "results", "--config", "config.yaml"]) == 0
    assert "nothing stale under results" in capsys.readouterr().out


def vertex_job(tmp_path: Path, image: str, output: str) -> list[str]:
    return ["vertex-job", "--image", image, "--config", "/gcs/b/rffm/config.yaml", "--output", output, "--out", str(tmp_path / "job.json")]


def test_a_vertex_job_on_a_tag_is_fixed_by_passing_the_pushed_digest(tmp_path: Path, capsys):
    fix = refused(capsys, *vertex_job(tmp_path, f"{IMAGE}:latest", "gs://b/rffm"))
    assert fix == "pass the digest the registry printed when you pushed (profiles/README.md, Google Cloud)."
    assert not (tmp_path / "job.json").exists()
    assert main(vertex_job(tmp_path, f"{IMAGE}@{DIGEST}", "gs://b/rffm")) == 0
    assert (
        json.loads((tmp_path / "job.json").read_text())["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["imageUri"] == f"{IMAGE}@{DIGEST}"
    )


def test_a_vertex_job_writing_to_a_local_folder_is_fixed_by_a_gs_uri(tmp_path: Path, capsys):
    assert refused(capsys, *vertex_job(tmp_path, f"{IMAGE}@{DIGEST}", str(tmp_path / "out"))) == "gs://<bucket>/<prefix>"
    assert main(vertex_job(tmp_path, f"{IMAGE}@{DIGEST}", "gs://b/rffm/vertex")) == 0
    assert json.loads((tmp_path / "job.json").read_text())["jobSpec"]["baseOutputDirectory"]["outputUriPrefix"] == "gs://b/rffm/vertex"


def test_cuda_where_no_gpu_is_visible_is_fixed_by_device_cpu_or_auto(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this host as a CPU-only node sees itself
    for name in device.GPU_GRANT_VARS:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as caught:
        device.resolve("cuda")
    assert fix_of(caught) == "set `device: cpu` (or auto), or run on a GPU node."
    assert device.resolve("cpu") == device.resolve("auto") == "cpu"


def test_a_cache_bench_on_a_config_without_backbones_is_fixed_by_passing_one_with_a_backbones_entry(tmp_path: Path):
    from rffm.bench.cache import user_backbone

    (tmp_path / "mine.yaml").write_text("results: results\n")
    with pytest.raises(SystemExit) as caught:
        user_backbone(str(tmp_path / "mine.yaml"))
    fix = str(caught.value).split(" Fix: ", 1)[1]
    assert fix == "pass a config with a backbones: entry (e.g. config/examples/wavesfm_like.yaml)"
    example = re.search(r"e\.g\. (\S+)\)", fix).group(1)
    assert user_backbone(str(REPO / example))["source"] == "python"


def test_a_mistyped_flag_of_a_verb_prints_that_verbs_usage(capsys):
    """Issue 50: `rffm predict --topk` printed the top-level usage with every verb instead of predict's options."""
    with pytest.raises(SystemExit) as stopped:
        main(["predict", "model.pt2", "capture.sigmf-meta", "--topk", "2"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert err.startswith("usage: rffm predict ") and "--top-k" in err and "posttrain" not in err, err
    assert err.strip().endswith("rffm predict: error: unrecognized arguments: --topk 2")
    with pytest.raises(SystemExit):
        main(["bench", "plan", "--rnus", "3"])  # a verb of a verb: its own usage too
    assert capsys.readouterr().err.startswith("usage: rffm bench plan ")
