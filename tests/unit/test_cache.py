import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import cache_build, make_backbone, stage, train_one_epoch
from rffm.data import cache
from rffm.data.splits import read_split
from rffm.errors import ConfigError, IntegrityError
from rffm.model import backbone
from rffm.records.layout import cache_files
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
BACKBONE = {"name": "b", "source": "random", "dataset": "t", "arch": {"patch": 8, "dim": 16, "depth": 1, "heads": 2}}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("inputs")
    stage(DATASET, root / "ds")
    make_backbone(BACKBONE, root / "ds", root / "bb")
    return root / "ds", root / "bb"


def test_cache_holds_bf16_hidden_states_of_train_and_val_only(inputs, tmp_path: Path):
    dataset_dir, backbone_dir = inputs
    cache_build(dataset_dir, backbone_dir, tmp_path / "c", tmp_path / "prov.json", batch_size=7)
    splits, meta = cache.open_cache(tmp_path / "c", "test")
    assert set(splits) == {"train", "val"} and not list((tmp_path / "c").glob("test*"))
    model = backbone.load(backbone_dir / "backbone.pt")
    train = read_split(dataset_dir / "train.h5")
    with torch.no_grad():
        expected = model(torch.from_numpy(train["iq"])).to(torch.bfloat16).float()
    hidden, labels = splits["train"].gather(np.arange(len(train["label"])))
    assert hidden.dtype == torch.float32 and torch.equal(hidden, expected)
    assert np.array_equal(labels.numpy(), train["label"])
    assert (tmp_path / "c/train.hidden.bf16").stat().st_size == hidden.numel() * 2


def test_cache_is_identical_whatever_the_batch_size(inputs, tmp_path: Path):
    dataset_dir, backbone_dir = inputs
    cache_build(dataset_dir, backbone_dir, tmp_path / "a", tmp_path / "a.json", batch_size=5)
    cache_build(dataset_dir, backbone_dir, tmp_path / "b", tmp_path / "b.json", batch_size=64)
    for name in cache_files() + ["sentinel.json"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_a_changed_cache_is_refused_by_its_readers(inputs, tmp_path: Path):
    dataset_dir, backbone_dir = inputs
    cache_build(dataset_dir, backbone_dir, tmp_path / "c", tmp_path / "prov.json")
    stored = np.memmap(tmp_path / "c/val.hidden.bf16", dtype=np.uint16, mode="r+")
    stored[0] ^= 1
    stored.flush()
    with pytest.raises(IntegrityError, match="val.hidden.bf16"):
        cache.open_cache(tmp_path / "c", "train_epoch")


def test_disk_budget_refusal_names_both_numbers(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda path: type("U", (), {"free": 1000})())
    with pytest.raises(ConfigError, match=r"need 1.1x 2000 bytes.*free 1000 bytes"):
        cache.check_disk_budget(tmp_path, 2000, 1.1)


def test_a_slow_writer_never_holds_more_than_the_queue_bound(inputs, tmp_path: Path, monkeypatch):
    dataset_dir, backbone_dir = inputs
    real_assign = cache.BackgroundWriter.assign
    writers = []

    def slow_assign(self, start, bits):
        writers.append(self)
        time.sleep(0.05)
        real_assign(self, start, bits)

    monkeypatch.setattr(cache.BackgroundWriter, "assign", slow_assign)
    cache_build(dataset_dir, backbone_dir, tmp_path / "c", tmp_path / "prov.json", batch_size=2)
    peak = max(w.max_in_flight for w in writers)
    # depth queued + one being assigned + one blocked in submit: never the whole split
    assert peak <= cache.QUEUE_DEPTH + 2
    assert peak >= cache.QUEUE_DEPTH and len(writers) > 3 * peak  # the writer fell behind; backpressure held the caller
    provenance = json.loads((tmp_path / "prov.json").read_text())
    assert provenance["phases"]["backpressure_wait"]["total_s"] > 0


def test_a_crash_during_the_build_leaves_no_sentinel_and_a_rerun_rebuilds(inputs, tmp_path: Path, monkeypatch):
    dataset_dir, backbone_dir = inputs
    cache_build(dataset_dir, backbone_dir, tmp_path / "ref", tmp_path / "ref.json", batch_size=8)
    calls = {"n": 0}
    real_assign = cache.BackgroundWriter.assign

    def failing_assign(self, start, bits):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("scratch disk went away")
        real_assign(self, start, bits)

    monkeypatch.setattr(cache.BackgroundWriter, "assign", failing_assign)
    with pytest.raises(OSError, match="scratch disk went away"):
        cache_build(dataset_dir, backbone_dir, tmp_path / "c", tmp_path / "prov.json", batch_size=8)
    assert not (tmp_path / "c/sentinel.json").exists()
    with pytest.raises(IntegrityError, match="sentinel is missing"):
        cache.open_cache(tmp_path / "c", "train_epoch")
    monkeypatch.setattr(cache.BackgroundWriter, "assign", real_assign)
    cache_build(dataset_dir, backbone_dir, tmp_path / "c", tmp_path / "prov.json", batch_size=8)
    for name in cache_files() + ["sentinel.json"]:
        assert (tmp_path / "c" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name


def test_injected_ooms_give_the_same_cache_bytes(inputs, tmp_path: Path, monkeypatch):
    dataset_dir, backbone_dir = inputs
    cache_build(dataset_dir, backbone_dir, tmp_path / "plain", tmp_path / "plain.json", batch_size=64)
    monkeypatch.setenv(batching.INJECT_ENV, "5")
    profile = tmp_path / "profile.json"
    cache_build(dataset_dir, backbone_dir, tmp_path / "oom", tmp_path / "oom.json", batch_size=64, batch_profile=profile)
    unseeded = sum(s["ooms"] for s in json.loads((tmp_path / "oom.json").read_text())["batch_stats"].values())
    assert unseeded >= 4
    for name in cache_files() + ["sentinel.json"]:
        assert (tmp_path / "oom" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
    # the next pass is seeded from the profile: far fewer out-of-memory probes, same bytes
    cache_build(dataset_dir, backbone_dir, tmp_path / "seeded", tmp_path / "seeded.json", batch_size=64, batch_profile=profile)
    seeded = json.loads((tmp_path / "seeded.json").read_text())
    assert seeded["profile_seeded"] is True
    assert sum(s["ooms"] for s in seeded["batch_stats"].values()) <= 0.25 * unseeded
    assert (tmp_path / "seeded/sentinel.json").read_bytes() == (tmp_path / "plain/sentinel.json").read_bytes()


def test_profiling_writes_chrome_traces_and_the_lifecycle_summary(inputs, tmp_path: Path):

    dataset_dir, backbone_dir = inputs
    profile_dir = tmp_path / "profiling"
    cache_build(dataset_dir, backbone_dir, tmp_path / "c", tmp_path / "p.json", batch_size=4, profile_dirs=[profile_dir], profile_batches=2)
    spec = {"run": "r", "train": {"lr": 0.01, "batch_size": 4, "seed": 0}}
    train_one_epoch(spec, tmp_path / "c", 1, None, tmp_path / "e1", profile_dir=profile_dir, profile_batches=2)
    train_one_epoch(spec, tmp_path / "c", 2, tmp_path / "e1", tmp_path / "e2", profile_dir=profile_dir, profile_batches=2)
    traces = sorted(p.name for p in profile_dir.glob("*.trace.json"))
    assert traces == [
        "cache_build.trace.json",
        "epoch1_train.trace.json",
        "epoch1_val.trace.json",
        "epoch2_train.trace.json",
        "epoch2_val.trace.json",
    ]
    for trace in traces:
        events = json.loads((profile_dir / trace).read_text())["traceEvents"]
        names = {event.get("name") for event in events}
        expected = {"source_read", "backbone", "cache_store"} if trace.startswith("cache") else {"prefetch_wait", "head"}
        assert expected <= names, (trace, expected - names)
    from rffm.steps import summarize_profiling

    summarize_profiling.run("r", tmp_path / "p.json", [tmp_path / "e1", tmp_path / "e2"], profile_dir)
    summary = json.loads((profile_dir / "cache_lifecycle_summary.json").read_text())
    assert summary["schema_version"] == 1 and summary["traces"] == traces
    for phase in ("preallocation", "source_read", "staging", "backpressure_wait", "memmap_assign"):
        assert summary["phases"][f"cache_build.{phase}"]["count"] > 0
    for phase in ("memmap_read", "prefetch_wait", "head"):
        assert summary["phases"][f"epoch2.{phase}"]["count"] > 0
    # profiling never changes results
    train_one_epoch(spec, tmp_path / "c", 1, None, tmp_path / "plain1")
    assert (tmp_path / "plain1/checkpoint.pt").read_bytes() == (tmp_path / "e1/checkpoint.pt").read_bytes()
