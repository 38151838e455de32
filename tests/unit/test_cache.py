"""The hidden-state cache: node-local, built from a record in results, checked byte for byte by its readers."""

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import PROFILED_TRACES, cache_build, cache_options, make_backbone, stage, train_one_epoch
from rffm.data import cache_format, cache_local, cache_plan, cache_reader, cache_writer
from rffm.data.splits import read_split
from rffm.errors import ConfigError, IntegrityError
from rffm.model import backbone
from rffm.records.layout import cache_files
from rffm.records.sentinel import read_sentinel
from rffm.runtime import batching

DATASET = {
    "name": "t",
    "source": "synthetic",
    "seed": 2,
    "synthetic": {
        "classes": ["BPSK", "QPSK", "WBFM"],
        "snr_db": {"min": 0, "max": 10, "step": 10},
        "examples_per_class_snr": 10,
        "length": 32,
    },
}
SMALL = {"patch": 8, "dim": 16, "depth": 1, "heads": 2, "stem": "iq", "output_layers": 1}  # not the default backbone: small and fast
BACKBONE = {"name": "b", "source": "random", "dataset": "t", "arch": SMALL}
SPEC = {"run": "r", "train": {"lr": 0.01, "batch_size": 4, "seed": 0}}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A results tree with the staged dataset and the backbone."""
    root = tmp_path_factory.mktemp("inputs") / "results"
    stage(DATASET, root / "datasets/t")
    make_backbone(BACKBONE, root / "datasets/t", root / "backbones/b")
    return root


def build(results: Path, tmp_path: Path, name: str, **options) -> tuple[Path, Path]:
    """A cache record in a copy of the results tree and the cache in a scratch of its own: (record dir, cache dir)."""
    tree = tmp_path / name / "results"
    shutil.copytree(results, tree)
    cache_build(tree / "datasets/t", tree / "backbones/b", tree / "caches/t__b", tmp_path / name / "scratch", **options)
    return tree / "caches/t__b", tmp_path / name / "scratch/t__b"


def open_built(record_dir: Path, cache_dir: Path):
    return cache_reader.open_cache(cache_dir, cache_format.recipe(read_sentinel(record_dir / "sentinel.json")), "test")


def test_cache_holds_bf16_hidden_states_of_train_and_val_only(results, tmp_path: Path):
    record_dir, cache_dir = build(results, tmp_path, "c", batch_size=7)
    splits, meta = open_built(record_dir, cache_dir)
    assert set(splits) == {"train", "val"} and not list(cache_dir.glob("test*"))
    model = backbone.load(results / "backbones/b/backbone.pt")
    train = read_split(results / "datasets/t/train.h5")
    with torch.no_grad():
        expected = model(torch.from_numpy(train["iq"])).to(torch.bfloat16).float()
    hidden, labels = splits["train"].gather(np.arange(len(train["label"])))
    assert hidden.dtype == torch.float32 and torch.equal(hidden, expected)
    assert np.array_equal(labels.numpy(), train["label"])
    assert (cache_dir / "train.hidden.bf16").stat().st_size == hidden.numel() * 2
    assert sorted(p.name for p in record_dir.iterdir()) == ["provenance.json", "sentinel.json"]  # nothing heavy in results


def test_cache_is_identical_whatever_the_batch_size(results, tmp_path: Path):
    a = build(results, tmp_path, "a", batch_size=5)
    b = build(results, tmp_path, "b", batch_size=64)
    assert (a[0] / "sentinel.json").read_bytes() == (b[0] / "sentinel.json").read_bytes()
    for name in cache_files() + ["sentinel.json"]:
        assert (a[1] / name).read_bytes() == (b[1] / name).read_bytes(), name


@pytest.mark.parametrize("position", [0.0, 0.37, 0.999])
def test_a_flipped_byte_anywhere_in_the_cache_is_refused_by_its_readers(results, tmp_path: Path, position: float):
    record_dir, cache_dir = build(results, tmp_path, "c")
    data = bytearray((cache_dir / "val.hidden.bf16").read_bytes())
    data[int(position * (len(data) - 1))] ^= 1
    (cache_dir / "val.hidden.bf16").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"val\.hidden\.bf16.*Fix: delete"):
        open_built(record_dir, cache_dir)


def test_disk_budget_counts_every_file_and_names_both_numbers(tmp_path: Path, monkeypatch):
    needed = cache_plan.row_cache_bytes({"train": 10, "val": 3}, 4 * 8, meta_size=300)
    assert needed == 2 * 4096 + 4 * 4096 + 2 * 4096  # hidden states, labels and SNRs of each split, meta and sentinel: whole blocks
    monkeypatch.setattr(cache_local.shutil, "disk_usage", lambda path: type("U", (), {"free": 1000})())
    with pytest.raises(ConfigError, match=r"need 1.1x 2000 bytes.*free 1000 bytes"):
        cache_local.check_disk_budget(tmp_path, 2000, 1.1)


def test_a_full_scratch_disk_is_refused_before_anything_is_written(results, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(cache_local.shutil, "disk_usage", lambda path: type("U", (), {"free": 20 << 10})())
    with pytest.raises(ConfigError, match="not enough free space for the hidden-state cache"):
        build(results, tmp_path, "full")
    assert not (tmp_path / "full/scratch/t__b").exists() and not (tmp_path / "full/results/caches/t__b/sentinel.json").exists()


def test_a_slow_writer_never_holds_more_than_the_queue_bound(results, tmp_path: Path, monkeypatch):
    real_assign = cache_writer.BackgroundWriter.assign
    writers = []

    def slow_assign(self, start, bits):
        writers.append(self)
        time.sleep(0.2)  # far slower than a batch of the tiny backbone, even on a busy machine
        real_assign(self, start, bits)

    monkeypatch.setattr(cache_writer.BackgroundWriter, "assign", slow_assign)
    record_dir, _ = build(results, tmp_path, "c", batch_size=2)
    peak = max(w.max_in_flight for w in writers)
    # depth queued + one being assigned + one blocked in submit: never the whole split
    assert peak <= cache_writer.QUEUE_DEPTH + 2
    assert peak >= cache_writer.QUEUE_DEPTH and len(writers) > 3 * peak  # the writer fell behind; backpressure held the caller
    provenance = json.loads((record_dir / "provenance.json").read_text())
    assert provenance["phases"]["backpressure_wait"]["total_s"] > 0


def test_a_crash_during_the_build_leaves_nothing_and_a_rerun_rebuilds(results, tmp_path: Path, monkeypatch):
    reference = build(results, tmp_path, "ref", batch_size=8)
    calls = {"n": 0}
    real_assign = cache_writer.BackgroundWriter.assign

    def failing_assign(self, start, bits):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("scratch disk went away")
        real_assign(self, start, bits)

    monkeypatch.setattr(cache_writer.BackgroundWriter, "assign", failing_assign)
    with pytest.raises(OSError, match="scratch disk went away"):
        build(results, tmp_path, "c", batch_size=8)
    assert not (tmp_path / "c/results/caches/t__b/sentinel.json").exists()
    assert sorted(p.name for p in (tmp_path / "c/scratch").iterdir()) == [".t__b.lock"]  # no half-built cache under its name
    monkeypatch.setattr(cache_writer.BackgroundWriter, "assign", real_assign)
    cache_build(*(tmp_path / "c/results" / f for f in ("datasets/t", "backbones/b", "caches/t__b")), tmp_path / "c/scratch", batch_size=8)
    for name in cache_files() + ["sentinel.json"]:
        assert (tmp_path / "c/scratch/t__b" / name).read_bytes() == (reference[1] / name).read_bytes(), name


def test_injected_ooms_give_the_same_cache_bytes(results, tmp_path: Path, monkeypatch):
    plain = build(results, tmp_path, "plain", batch_size=64)
    monkeypatch.setenv(batching.INJECT_ENV, "5")
    profile = tmp_path / "profile.json"
    oom = build(results, tmp_path, "oom", batch_size=64, batch_profile=profile)
    unseeded = sum(s["ooms"] for s in json.loads((oom[0] / "provenance.json").read_text())["batch_stats"].values())
    assert unseeded >= 4
    for name in cache_files() + ["sentinel.json"]:
        assert (oom[1] / name).read_bytes() == (plain[1] / name).read_bytes(), name
    # the next pass is seeded from the profile: far fewer out-of-memory probes, same bytes
    seeded = build(results, tmp_path, "seeded", batch_size=64, batch_profile=profile)
    record = json.loads((seeded[0] / "provenance.json").read_text())
    assert record["profile_seeded"] is True
    assert sum(s["ooms"] for s in record["batch_stats"].values()) <= 0.25 * unseeded
    assert (seeded[0] / "sentinel.json").read_bytes() == (plain[0] / "sentinel.json").read_bytes()


def test_an_epoch_on_a_node_without_the_cache_builds_it_and_trains_the_same(results, tmp_path: Path):
    record_dir, cache_dir = build(results, tmp_path, "c")
    tree = record_dir.parents[1]
    train_one_epoch(SPEC, record_dir, 1, None, tree / "runs/r/epochs/1", tmp_path / "c/scratch", store=tree)
    shutil.rmtree(cache_dir)  # another node: no cache there
    train_one_epoch(SPEC, record_dir, 1, None, tmp_path / "fresh/1", tmp_path / "other-node", memo_store=tmp_path / "no-memo")
    assert (tmp_path / "other-node/t__b/sentinel.json").exists()
    assert (tmp_path / "fresh/1/checkpoint.pt").read_bytes() == (tree / "runs/r/epochs/1/checkpoint.pt").read_bytes()
    assert json.loads((tmp_path / "fresh/1/provenance.json").read_text())["cache_build"]["batch_size_max"] == cache_options()["batch_size"]


def test_profiling_publishes_chrome_traces_and_the_lifecycle_summary(results, tmp_path: Path):
    record_dir, _ = build(results, tmp_path, "c", batch_size=4, profile_runs=["r"], profile_batches=2, store=tmp_path / "c/results")
    tree = record_dir.parents[1]
    scratch = tmp_path / "c/scratch"
    epochs = tree / "runs/r/epochs"
    train_one_epoch(SPEC, record_dir, 1, None, epochs / "1", scratch, store=tree, profile_batches=2)
    train_one_epoch(SPEC, record_dir, 2, epochs / "1", epochs / "2", scratch, store=tree, profile_batches=2)
    profile_dir = tree / "runs/r/profiling"
    traces = sorted(p.name for p in profile_dir.glob("*.trace.json"))
    assert traces == PROFILED_TRACES
    for trace in traces:
        events = json.loads((profile_dir / trace).read_text())["traceEvents"]
        names = {event.get("name") for event in events}
        expected = {"source_read", "backbone", "cache_store"} if trace.startswith("cache") else {"prefetch_wait", "head"}
        assert expected <= names, (trace, expected - names)
    from rffm.steps import summarize_profiling

    summarize_profiling.run("r", record_dir, [epochs / "1", epochs / "2"], profile_dir, store=tree)
    summary = json.loads((profile_dir / "cache_lifecycle_summary.json").read_text())
    assert summary["schema_version"] == 1 and summary["traces"] == traces
    for phase in ("preallocation", "source_read", "staging", "backpressure_wait", "memmap_assign", "hash"):
        assert summary["phases"][f"cache_build.{phase}"]["count"] > 0
    for phase in ("memmap_read", "prefetch_wait", "head"):
        assert summary["phases"][f"epoch2.{phase}"]["count"] > 0
    # profiling never changes results
    train_one_epoch(SPEC, record_dir, 1, None, tmp_path / "plain1", scratch, memo_store=tmp_path / "no-memo")
    assert (tmp_path / "plain1/checkpoint.pt").read_bytes() == (epochs / "1/checkpoint.pt").read_bytes()


def test_a_multi_layer_backbone_caches_every_output_layer(results, tmp_path: Path):
    tree = tmp_path / "results"
    shutil.copytree(results / "datasets", tree / "datasets")
    spec = {
        **BACKBONE,
        "source": "pretrain",
        "arch": {**BACKBONE["arch"], "stem": "rf", "output_layers": 2},
        "pretrain": {"epochs": 1, "min_steps": 0},
    }
    make_backbone(spec, tree / "datasets/t", tree / "backbones/b")
    cache_build(tree / "datasets/t", tree / "backbones/b", tree / "caches/t__b", tmp_path / "scratch", batch_size=7)
    splits, meta = open_built(tree / "caches/t__b", tmp_path / "scratch/t__b")
    train = read_split(tree / "datasets/t/train.h5")
    assert meta["shapes"]["train"] == [len(train["label"]), 2, 4, 16]
    with torch.no_grad():
        expected = backbone.load(tree / "backbones/b/backbone.pt")(torch.from_numpy(train["iq"])).to(torch.bfloat16).float()
    assert torch.equal(splits["train"].gather(np.arange(len(train["label"])))[0], expected)


def test_the_disk_budget_counts_every_cached_layer():
    one = cache_plan.row_cache_bytes({"train": 1000}, 16 * 64, meta_size=300)
    assert cache_plan.row_cache_bytes({"train": 1000}, 4 * 16 * 64, meta_size=300) - one == 3 * 1000 * 16 * 64 * 2
