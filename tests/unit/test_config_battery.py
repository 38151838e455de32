"""Malformed configurations, one kind of problem each: every one is refused by rffm.config before anything
runs, as one line that names the key and says what to do (issue 14). The workflow-level counterpart,
which runs the real snakemake on a subset, is tests/workflow/test_config_refusals.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from conftest import REPO, TINY, tiny_config, tiny_text
from rffm import config
from rffm.errors import ConfigError

INF, NAN = float("inf"), float("nan")
TRAIN_CNN = {"epochs": 2, "lr": 0.01, "batch_size": 16, "seed": 0}


def train(c: dict) -> dict:
    return c["runs"]["base"]["train"]


def backbone(c: dict) -> dict:
    return c["backbones"]["mini"]


def dataset(c: dict) -> dict:
    return c["datasets"]["tiny"]


def synthetic(c: dict) -> dict:
    return dataset(c)["synthetic"]


def second_dataset(c: dict, **synthetic_options: Any) -> None:
    """A second synthetic dataset read by a second run on the same backbone."""
    c["datasets"]["long"] = {"source": "synthetic", "seed": 1, "synthetic": {"length": 64, **synthetic_options}}
    c["runs"]["other"] = {**c["runs"]["base"], "dataset": "long"}


def sigmf_dataset(c: dict, window: int) -> None:
    c["datasets"]["rec"] = {"source": "sigmf", "seed": 1, "sigmf": {"recordings": ["capture"], "window": window}}
    c["runs"]["other"] = {**c["runs"]["base"], "dataset": "rec"}


OTHER_WEIGHTS = hashlib.sha256(b"other weights").hexdigest()


def imported(c: dict, path: str) -> None:
    c["backbones"]["mini"] = {"source": "checkpoint", "path": path, "sha256": "0" * 64}


# (case id, change to the tiny config, the one line expected). Checked with the file and machine checks on
# (tmp_path as working directory), so every line below is the only problem found.
CASES: list[tuple[str, Callable[[dict], Any], str]] = [
    # results / scratch that would write at the filesystem root
    (
        "results-empty",
        lambda c: c.update(results=""),
        "results: empty, so every path under it would resolve against the filesystem root (/datasets, /runs ...). "
        "Fix: name a directory, e.g. results: results",
    ),
    (
        "results-root",
        lambda c: c.update(results="/"),
        "results: '/' resolves to the filesystem root, so the workflow would write straight into / (/datasets, /runs ...). "
        "Fix: name a directory of its own below the root",
    ),
    (
        "results-resolves-to-root",
        lambda c: c.update(results="/tmp/../.."),
        "results: '/tmp/../..' resolves to the filesystem root, so the workflow would write straight into / (/datasets, /runs ...). "
        "Fix: name a directory of its own below the root",
    ),
    (
        "scratch-empty",
        lambda c: c.update(scratch=""),
        "scratch: empty, so every path under it would resolve against the filesystem root. "
        "Fix: name a directory, e.g. scratch: scratch/hidden-states",
    ),
    (
        "scratch-root",
        lambda c: c.update(scratch="//"),
        "scratch: '//' resolves to the filesystem root, so the workflow would write straight into /. "
        "Fix: name a directory of its own below the root",
    ),
    (
        "checkpoint-store-root",
        lambda c: c.update(checkpoint_store="/."),
        "checkpoint_store: '/.' resolves to the filesystem root, so the workflow would write straight into /. "
        "Fix: name a directory of its own below the root",
    ),
    ("results-no-value", lambda c: c.update(results=None), "results: has no value. Fix: write a string"),
    ("results-not-text", lambda c: c.update(results=5), "results: 5 is not of type 'string'. Fix: write a string"),
    # NaN / infinity anywhere
    ("lr-inf", lambda c: train(c).update(lr=INF), "runs.base.train.lr: .inf is not a finite number. Fix: write a number > 0 and <= 10"),
    ("lr-nan", lambda c: train(c).update(lr=NAN), "runs.base.train.lr: .nan is not a finite number. Fix: write a number > 0 and <= 10"),
    (
        "labels-zero",
        lambda c: train(c).update(labels_per_class_snr=0),
        "runs.base.train.labels_per_class_snr: 0 is less than the minimum of 1. Fix: use an integer >= 1 and <= 2147483647",
    ),
    (
        "pretrain-lr-nan",
        lambda c: backbone(c)["pretrain"].update(lr=NAN),
        "backbones.mini.pretrain.lr: .nan is not a finite number. Fix: write a number > 0 and <= 10",
    ),
    (
        "snr-step-nan",
        lambda c: synthetic(c)["snr_db"].update(step=NAN),
        "datasets.tiny.synthetic.snr_db.step: .nan is not a finite number. Fix: write a number > 0 and <= 200",
    ),
    (
        "snr-max-inf",
        lambda c: synthetic(c)["snr_db"].update(max=INF),
        "datasets.tiny.synthetic.snr_db.max: .inf is not a finite number. Fix: write a number >= -100 and <= 100",
    ),
    (
        "headroom-minus-inf",
        lambda c: c["cache"].update(disk_headroom=-INF),
        "cache.disk_headroom: -.inf is not a finite number. Fix: write a number >= 0 and <= 100",
    ),
    (
        "seed-nan",
        lambda c: train(c).update(seed=NAN),
        "runs.base.train.seed: .nan is not a finite number. Fix: write an integer >= 0 and <= 4294967295",
    ),
    (
        "sample-rate-inf",
        lambda c: dataset(c).update(sample_rate=INF),
        "datasets.tiny.sample_rate: .inf is not a finite number. Fix: write a number > 0",
    ),
    (
        "high-snr-nan",
        lambda c: c["runs"]["base"].update(high_snr_db=NAN),
        "runs.base.high_snr_db: .nan is not a finite number. Fix: write a number >= -100 and <= 100",
    ),
    # integer-valued floats (and other non-integers) where an integer is required
    (
        "epochs-float",
        lambda c: train(c).update(epochs=3.0),
        "runs.base.train.epochs: 3.0 is not of type 'integer'. Fix: write 3 (an integer >= 1 and <= 10000)",
    ),
    (
        "pretrain-epochs-float",
        lambda c: backbone(c)["pretrain"].update(epochs=2.0),
        "backbones.mini.pretrain.epochs: 2.0 is not of type 'integer'. Fix: write 2 (an integer >= 0 and <= 10000)",
    ),
    (
        "batch-size-fraction",
        lambda c: train(c).update(batch_size=16.5),
        "runs.base.train.batch_size: 16.5 is not of type 'integer'. Fix: write an integer >= 1 and <= 1048576",
    ),
    (
        "epochs-yaml-1e9-is-text",  # YAML 1.1 reads 1e9 (no dot) as a string
        lambda c: train(c).update(epochs="1e9"),
        "runs.base.train.epochs: '1e9' is not of type 'integer'. Fix: write an integer >= 1 and <= 10000",
    ),
    (
        "seed-boolean",
        lambda c: dataset(c).update(seed=True),
        "datasets.tiny.seed: True is not of type 'integer'. Fix: write an integer >= 0 and <= 4294967295",
    ),
    # out-of-range numbers
    (
        "epochs-1e9",
        lambda c: train(c).update(epochs=10**9),
        "runs.base.train.epochs: 1000000000 is greater than the maximum of 10000. Fix: use an integer >= 1 and <= 10000",
    ),
    (
        "epochs-zero",
        lambda c: train(c).update(epochs=0),
        "runs.base.train.epochs: 0 is less than the minimum of 1. Fix: use an integer >= 1 and <= 10000",
    ),
    (
        "batch-size-1e15",
        lambda c: train(c).update(batch_size=10**15),
        "runs.base.train.batch_size: 1000000000000000 is greater than the maximum of 1048576. Fix: use an integer >= 1 and <= 1048576",
    ),
    (
        "pretrain-batch-size",
        lambda c: backbone(c)["pretrain"].update(batch_size=2**20 + 1),
        "backbones.mini.pretrain.batch_size: 1048577 is greater than the maximum of 1048576. Fix: use an integer >= 1 and <= 1048576",
    ),
    (
        "cache-batch-size",
        lambda c: c["cache"].update(batch_size=10**15),
        "cache.batch_size: 1000000000000000 is greater than the maximum of 1048576. Fix: use an integer >= 1 and <= 1048576",
    ),
    (
        "train-seed-2^64",
        lambda c: train(c).update(seed=2**64),
        "runs.base.train.seed: 18446744073709551616 is greater than the maximum of 4294967295. Fix: use an integer >= 0 and <= 4294967295",
    ),
    (
        "dataset-seed-2^32",
        lambda c: dataset(c).update(seed=2**32),
        "datasets.tiny.seed: 4294967296 is greater than the maximum of 4294967295. Fix: use an integer >= 0 and <= 4294967295",
    ),
    (
        "pretrain-seed-negative",
        lambda c: backbone(c)["pretrain"].update(seed=-1),
        "backbones.mini.pretrain.seed: -1 is less than the minimum of 0. Fix: use an integer >= 0 and <= 4294967295",
    ),
    (
        "examples-per-pair",
        lambda c: synthetic(c).update(examples_per_class_snr=10**9),
        "datasets.tiny.synthetic.examples_per_class_snr: 1000000000 is greater than the maximum of 100000. "
        "Fix: use an integer >= 1 and <= 100000",
    ),
    (
        "length",
        lambda c: synthetic(c).update(length=10**7),
        "datasets.tiny.synthetic.length: 10000000 is greater than the maximum of 65536. Fix: use an integer >= 1 and <= 65536",
    ),
    (
        "threads",
        lambda c: c.update(threads=10**6),
        "threads: 1000000 is greater than the maximum of 1024. Fix: use an integer >= 1 and <= 1024",
    ),
    (
        "lr-huge",
        lambda c: train(c).update(lr=1e6),
        "runs.base.train.lr: 1000000.0 is greater than the maximum of 10. Fix: use a number > 0 and <= 10",
    ),
    (
        "snr-min",
        lambda c: synthetic(c)["snr_db"].update(min=-1000),
        "datasets.tiny.synthetic.snr_db.min: -1000 is less than the minimum of -100. Fix: use a number >= -100 and <= 100",
    ),
    (
        "width",
        lambda c: backbone(c)["arch"].update(dim=10**6),
        "backbones.mini.arch.dim: 1000000 is greater than the maximum of 4096. Fix: use an integer >= 1 and <= 4096",
    ),
    (
        "cfo",
        lambda c: synthetic(c).update(impairments={"cfo_max": 0.9}),
        "datasets.tiny.synthetic.impairments.cfo_max: 0.9 is greater than the maximum of 0.5. Fix: use a number >= 0 and <= 0.5",
    ),
    # constraints between fields
    (
        "splits-below-1",
        lambda c: dataset(c)["splits"].update(train=0.4),
        "datasets.tiny.splits: train + val + test = 0.9, not 1. "
        "Fix: give fractions that sum to 1, e.g. splits: {{train: 0.6, val: 0.2, test: 0.2}}",
    ),
    (
        "splits-default-plus-one",
        lambda c: dataset(c).update(splits={"train": 0.8}),
        "datasets.tiny.splits: train + val + test = 1.2, not 1. "
        "Fix: give fractions that sum to 1, e.g. splits: {{train: 0.6, val: 0.2, test: 0.2}}",
    ),
    (
        "synthetic-snr-min-above-max",
        lambda c: synthetic(c)["snr_db"].update(min=20),
        "datasets.tiny.synthetic.snr_db: min 20 is above max 10. Fix: make min <= max",
    ),
    (
        "select-snr-min-above-max",
        lambda c: dataset(c).update(select={"snr_db": {"min": 5, "max": -5}}),
        "datasets.tiny.select.snr_db: min 5 is above max -5. Fix: make min <= max",
    ),
    (
        "snr-grid-too-fine",
        lambda c: synthetic(c)["snr_db"].update(step=0.001),
        "datasets.tiny.synthetic.snr_db.step: 0.001 makes 10001 SNR points from 0 to 10 dB (at most 1000). Fix: use a step >= 0.01001",
    ),
    (
        "pair-too-large",
        lambda c: synthetic(c).update(examples_per_class_snr=100000, length=65536),
        "datasets.tiny.synthetic.examples_per_class_snr: 100000 x length 65536 = 6553600000 IQ samples per (class, SNR) pair, "
        "generated in memory at once (at most 268435456). Fix: lower examples_per_class_snr or length",
    ),
    (
        "heads",
        lambda c: backbone(c)["arch"].update(heads=3),
        "backbones.mini.arch.heads: 3 does not divide dim 16. Fix: use one of 1, 2, 4, 8, 16",
    ),
    (
        "output-layers-default-over-a-lowered-depth",
        lambda c: backbone(c)["arch"].pop("output_layers"),
        "backbones.mini.arch.output_layers: 4 exceeds depth + 1 = 2 (the embedding and each block). "
        "Fix: set output_layers to 1 to 2 (when it is not written, its default is for the default depth)",
    ),
    (
        "heads-default-dim",
        lambda c: backbone(c).pop("arch") and backbone(c).update(arch={"heads": 5}),
        "backbones.mini.arch.heads: 5 does not divide dim 64. Fix: use one of 1, 2, 4, 8, 16, 32, 64",
    ),
    (
        "patch-longer-than-signal",
        lambda c: backbone(c)["arch"].update(patch=128),
        "backbones.mini.arch.patch: 128 is longer than the signal length 64 (datasets.tiny.synthetic.length). "
        "Fix: use a patch that divides 64, or change datasets.tiny.synthetic.length",
    ),
    (
        "patch-not-dividing",
        lambda c: backbone(c)["arch"].update(patch=24),
        "backbones.mini.arch.patch: 24 does not divide the signal length 64 (datasets.tiny.synthetic.length). "
        "Fix: use a patch that divides 64, or change datasets.tiny.synthetic.length",
    ),
    (
        "patch-vs-a-run-dataset",
        lambda c: second_dataset(c, length=40),
        "backbones.mini.arch.patch: 16 does not divide the signal length 40 (datasets.long.synthetic.length). "
        "Fix: use a patch that divides every length it reads (40, 64: one of 1, 2, 4, 8), or change datasets.long.synthetic.length",
    ),
    (
        "patch-vs-default-length",  # synthetic length defaults to 128 (the schema)
        lambda c: synthetic(c).pop("length") and backbone(c)["arch"].update(patch=48),
        "backbones.mini.arch.patch: 48 does not divide the signal length 128 (datasets.tiny.synthetic.length). "
        "Fix: use a patch that divides 128, or change datasets.tiny.synthetic.length",
    ),
    (
        "patch-vs-sigmf-window",
        lambda c: sigmf_dataset(c, window=100),
        "backbones.mini.arch.patch: 16 does not divide the signal length 100 (datasets.rec.sigmf.window). "
        "Fix: use a patch that divides every length it reads (64, 100: one of 1, 2, 4), or change datasets.rec.sigmf.window",
    ),
    # shape, names and references
    ("device-name", lambda c: c.update(device="gpu"), "device: 'gpu' is not allowed. Fix: use auto, cpu, cuda or cuda:N"),
    (
        "unknown-key",
        lambda c: train(c).update(epoch=3),
        "runs.base.train: unknown key(s) 'epoch'. Fix: remove or rename it; allowed here: batch_size, epochs, head, label_smoothing, "
        "labels_per_class_snr, labels_seed, lr, lr_decay_per_epoch, seed, tail, warmup_steps, weight_decay",
    ),
    (
        "bad-name",
        lambda c: c["runs"].update({"Big Run": c["runs"].pop("base")}),
        "runs: name 'Big Run' is not allowed. Fix: use lower-case letters, digits, '-' and '_' (no '__')",
    ),
    (
        "reference-sweep-key",  # a reference's sweep varies the CNN's train keys a run's sweep varies, and its epochs
        lambda c: c.update(
            references={"cnn": {"dataset": "tiny", "train": TRAIN_CNN, "sweep": {"train.lr": [0.01, 0.03], "train.batch_size": [8, 16]}}}
        ),
        "references.cnn.sweep: unknown key(s) 'train.batch_size'. Fix: remove or rename it; allowed here: train.epochs, train.lr, "
        "train.weight_decay",
    ),
    ("missing-lr", lambda c: train(c).pop("lr"), "runs.base.train.lr: missing (required). Fix: add it (see config/REFERENCE.md)"),
    (
        "source-without-options",
        lambda c: dataset(c).update(source="hdf5"),
        "datasets.tiny.hdf5: missing; source 'hdf5' needs it. Fix: add its options block (config/examples/hdf5.yaml)",
    ),
    (
        "sha256",
        lambda c: imported(c, str(TINY)) or backbone(c).update(sha256="abc"),
        "backbones.mini.sha256: 'abc' is not allowed. Fix: write the file's sha256 as 64 lower-case hex digits (`sha256sum <file>`)",
    ),
    (
        "mode",
        lambda c: c["runs"]["base"].update(selection={"mode": "best"}),
        "runs.base.selection.mode: 'best' is not allowed. Fix: use one of max, min",
    ),
    ("one-class", lambda c: synthetic(c).update(classes=["BPSK"]), "datasets.tiny.synthetic.classes: 1 item(s). Fix: list at least 2"),
    ("datasets-not-mapping", lambda c: c.update(datasets=5), "datasets: 5 is not of type 'object'. Fix: write a mapping"),
    ("no-runs", lambda c: c.update(runs={}), "runs: nothing defined. Fix: define at least one entry (see config/config.yaml)"),
    # files the config imports
    (
        "imported-backbone-missing",
        lambda c: imported(c, "models/backbone.pt"),
        "backbones.mini.path: models/backbone.pt does not exist. "
        "Fix: point it at the backbone.pt to import (relative paths start from {cwd})",
    ),
    (
        "imported-backbone-is-a-directory",
        lambda c: imported(c, "/"),
        "backbones.mini.path: / is a directory. Fix: point it at the backbone.pt to import",
    ),
    (
        "imported-backbone-not-the-pinned-bytes",
        lambda c: Path("weights.pt").write_bytes(b"other weights") and imported(c, "weights.pt"),
        f"backbones.mini.sha256: weights.pt has sha256 {OTHER_WEIGHTS}, config expects {'0' * 64}. Fix: point backbones.mini.path "
        f"at the pinned file, or set backbones.mini.sha256: {OTHER_WEIGHTS} if weights.pt is the file to import (which reruns "
        "everything built on that backbone)",
    ),
    (
        "dataset-source-missing",
        lambda c: dataset(c).update(source="radioml2016", radioml2016={"path": "/data/RML2016.10a_dict.pkl"}),
        "datasets.tiny.radioml2016.path: /data/RML2016.10a_dict.pkl does not exist. Fix: point it at the source file",
    ),
    # directories on this machine
    (
        "results-is-a-file",
        lambda c: c.update(results="config.yaml"),
        "results: {cwd}/config.yaml is a file, not a directory. "
        "Fix: set results to a directory you can write (relative paths start from {cwd})",
    ),
    (
        "results-under-a-file",
        lambda c: c.update(results="config.yaml/results"),
        "results: {cwd}/config.yaml/results lies under the file {cwd}/config.yaml. "
        "Fix: set results to a directory you can write (relative paths start from {cwd})",
    ),
    (
        "scratch-under-a-file",
        lambda c: c.update(scratch="config.yaml/deep/scratch"),
        "scratch: {cwd}/config.yaml/deep/scratch lies under the file {cwd}/config.yaml. "
        "Fix: set scratch to a directory you can write (relative paths start from {cwd})",
    ),
    (
        "checkpoint-store-is-a-file",
        lambda c: c.update(checkpoint_store="config.yaml"),
        "checkpoint_store: {cwd}/config.yaml is a file, not a directory. "
        "Fix: set checkpoint_store to a directory you can write (relative paths start from {cwd})",
    ),
    (  # root passes every mode check there: the kernel's own filesystem refuses mkdir (issue 23)
        "scratch-on-proc",
        lambda c: c.update(scratch="/proc/rffm-scratch"),
        "scratch: /proc is on the kernel's proc filesystem, where no directory can be made or written, "
        "so /proc/rffm-scratch cannot be created. Fix: set scratch to a directory you can write",
    ),
    (
        "results-on-sysfs",
        lambda c: c.update(results="/sys/rffm/results"),
        "results: /sys is on the kernel's sysfs filesystem, where no directory can be made or written, "
        "so /sys/rffm/results cannot be created. Fix: set results to a directory you can write",
    ),
    (
        "results-broken-link",
        lambda c: os.symlink("gone", "dangling") or c.update(results="dangling/results"),
        "results: {cwd}/dangling is a broken symbolic link (to gone). "
        "Fix: set results to a directory you can write (relative paths start from {cwd})",
    ),
]


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def here(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """An empty working directory holding one regular file, config.yaml, and nothing else."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("# a file, so that paths under it are unusable\n")
    os.mkdir(tmp_path / "capture")  # sigmf recordings are listed by name; the window check needs no data
    yield tmp_path


@pytest.mark.parametrize("change, expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_malformed_config_is_one_line_naming_the_key(here: Path, change, expected):
    bad = tiny_config()
    change(bad)
    before = tree(here)
    found = config.problems(bad, files=[], runs_here=True, local_files=True)
    assert found == [expected.format(cwd=here)]
    assert "Traceback" not in found[0] and "\n" not in found[0] and "Fix:" in found[0]
    assert tree(here) == before  # checking never creates anything
    with pytest.raises(ConfigError) as refused:
        config.check(bad, runs_here=True, local_files=True)
    assert expected.format(cwd=here) in str(refused.value).splitlines()[1]


def at(c: dict, key: str) -> tuple[dict, str]:
    """The mapping holding a dotted key, and the key's last part."""
    *parents, leaf = key.split(".")
    for part in parents:
        c = c[part]
    return c, leaf


def follow_fix(line: str, c: dict, here: Path) -> None:
    """Do to the config what a problem line's Fix says, as a user reading it would (the first option where it offers
    several); a Fix this does not understand fails the test, so a new kind of advice needs its reading here."""
    problem, fix = line.split(" Fix: ", 1)
    holder, leaf = at(c, problem.split(": ", 1)[0])
    quoted = re.findall(r"'([^']+)'", problem)
    if m := re.match(r"(?:write|use) (-?\d+) \(an integer", fix):
        holder[leaf] = int(m[1])
    elif m := re.match(r"(?:write|use) an? (number|integer) (>=?) (-?[\d.]+)(?: and <= (-?[\d.]+))?", fix):
        kind, bound, low, high = m.groups()
        number = float(low) if bound == ">=" else float(high) if high else float(low) + 1
        holder[leaf] = int(number) if kind == "integer" else number
    elif fix == "write a string":
        holder[leaf] = "elsewhere"
    elif m := re.match(r"name a directory, e\.g\. \w+: (\S+)$", fix):
        holder[leaf] = m[1]
    elif fix == "name a directory of its own below the root" or re.match(r"set \w+ to a directory you can write", fix):
        holder[leaf] = f"{leaf}-dir"
    elif m := re.match(r"give fractions that sum to 1, e\.g\. splits: (\{.+\})$", fix):
        holder[leaf] = yaml.safe_load(m[1])
    elif fix == "make min <= max":
        bounds = holder[leaf]
        bounds["min"], bounds["max"] = bounds["max"], bounds["min"]
    elif m := re.match(r"use a step >= ([\d.]+)$", fix):
        holder[leaf] = float(m[1])
    elif m := re.match(r"lower (\w+) or \w+$", fix):
        holder[m[1]] = 1
    elif m := re.match(r"use one of ([\w, ]+)$", fix):
        first = m[1].split(", ")[0]
        holder[leaf] = int(first) if first.isdigit() else first
    elif m := re.match(r"use (\w+), [\w, :]+ or [\w:]+$", fix):
        holder[leaf] = m[1]
    elif m := re.match(r"set (\w+) to (\d+) to \d+ ", fix):
        holder[m[1]] = int(m[2])
    elif m := re.match(r"use a patch that divides (\d+), or change", fix):
        length = int(m[1])
        holder[leaf] = max(d for d in range(1, length + 1) if length % d == 0 and d <= holder[leaf])
    elif m := re.match(r"use a patch that divides every length it reads \([\d, ]+: one of ([\d, ]+)\), or change", fix):
        holder[leaf] = max(d for d in map(int, m[1].split(", ")) if d <= holder[leaf])
    elif fix.startswith("remove or rename it;"):
        for name in quoted:
            holder[leaf].pop(name)
    elif fix.startswith("use lower-case letters, digits"):
        holder[leaf][re.sub(r"[^a-z0-9_-]", "-", quoted[0].lower())] = holder[leaf].pop(quoted[0])
    elif fix.startswith("add it (see config/REFERENCE.md)"):
        holder[leaf] = at(tiny_config(), problem.split(": ", 1)[0])[0][leaf]  # the value the tiny config writes
    elif m := re.match(r"add its options block \(([\w/.]+)\)$", fix):
        example = yaml.safe_load((REPO / m[1]).read_text())
        holder[leaf] = next(d[leaf] for d in example["datasets"].values() if leaf in d)
    elif fix.startswith("write the file's sha256"):
        holder[leaf] = hashlib.sha256(Path(holder["path"]).read_bytes()).hexdigest()
    elif m := re.search(r"set ([\w.]+): ([0-9a-f]{64}) if", fix):
        target, name = at(c, m[1])
        target[name] = m[2]
    elif fix.startswith("list at least 2"):
        holder[leaf] = [*holder[leaf], next(n for n in tiny_config()["datasets"]["tiny"]["synthetic"]["classes"] if n not in holder[leaf])]
    elif fix == "write a mapping" or fix.startswith("define at least one entry"):
        holder[leaf] = tiny_config()[leaf]
    elif m := re.match(r"point it at the (backbone\.pt|source file)", fix):
        made = here / "files" / (f"{leaf}-{len(list(here.rglob('*')))}")
        made.parent.mkdir(exist_ok=True)
        made.write_bytes(b"bytes a user points the config at")
        holder[leaf] = str(made)
    else:
        pytest.fail(f"no reading of this Fix: {fix}")


@pytest.mark.parametrize("change, expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_fix_as_printed_clears_its_problem(here: Path, change, expected):
    """Issue 34: every Fix a configuration problem prints is followed as written; the problem goes, and any it
    uncovers (a file that now exists but is not the pinned one) has its own Fix, followed in turn, until none is left."""
    fixing = tiny_config()
    change(fixing)
    seen = []
    while found := config.problems(fixing, files=[], runs_here=True, local_files=True):
        assert len(seen) < 3 and found[0] not in seen, f"the fixes go round in circles: {seen + found}"
        assert all(" Fix: " in line for line in found), found
        seen.append(found[0])
        follow_fix(found[0], fixing, here)
    assert seen[0] == expected.format(cwd=here)


def test_the_battery_covers_at_least_forty_cases():
    assert len(CASES) >= 40 and len({name for name, _, _ in CASES}) == len(CASES)


def test_a_nan_anywhere_is_named_once_with_its_key():
    bad = tiny_config()
    train(bad).update(lr=NAN, weight_decay=INF)
    dataset(bad)["class_map"] = {"bpsk2": NAN}
    assert config.problems(bad) == [
        "datasets.tiny.class_map.bpsk2: .nan is not a finite number. Fix: write a string",
        "runs.base.train.lr: .nan is not a finite number. Fix: write a number > 0 and <= 10",
        "runs.base.train.weight_decay: .inf is not a finite number. Fix: write a number >= 0 and <= 1",
    ]


def test_an_empty_config_names_each_missing_block():
    assert config.problems({}) == [
        f"{key}: missing (required). Fix: add it (see config/REFERENCE.md)" for key in ("datasets", "backbones", "runs")
    ]


def test_a_relative_results_dir_resolving_to_the_root_is_refused_only_where_it_resolves(monkeypatch):
    bad = {**tiny_config(), "results": "."}
    monkeypatch.chdir("/")
    assert config.problems(bad, local_files=True) == [
        "results: '.' resolves to the filesystem root, so the workflow would write straight into / (/datasets, /runs ...). "
        "Fix: name a directory of its own below the root"
    ]
    assert config.problems(bad, local_files=False) == []  # in a storage bucket, '.' is the storage prefix


# ---- machine checks apply only where the caller says files and jobs are on this machine ----


def test_scratch_and_device_are_not_checked_where_jobs_run_elsewhere(here: Path):
    bad = {**tiny_config(), "scratch": "config.yaml/scratch", "device": "cuda:99"}
    assert config.problems(bad, runs_here=False, local_files=True) == []
    found = config.problems(bad, runs_here=True, local_files=True)
    assert found[0].startswith(f"scratch: {here}/config.yaml/scratch lies under the file")
    assert found[1].startswith("device: 'cuda:99' but torch sees") and found[1].endswith(
        "Fix: set device: cpu (or auto), or run where that GPU is visible"
    )


def test_results_and_imported_files_are_not_checked_in_a_storage_bucket(here: Path):
    bad = {**tiny_config(), "results": "config.yaml/results"}
    imported(bad, "models/backbone.pt")
    assert config.problems(bad, runs_here=False, local_files=False) == []


def test_a_cuda_device_torch_cannot_see_is_refused(here: Path):
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    wanted = "cuda" if count == 0 else f"cuda:{count}"
    found = config.problems({**tiny_config(), "device": wanted}, runs_here=True, local_files=True)
    assert len(found) == 1 and found[0].startswith(f"device: {wanted!r} but torch sees")
    assert config.problems({**tiny_config(), "device": "auto"}, runs_here=True, local_files=True) == []


def test_an_unwritable_results_dir_is_refused_without_creating_it(read_only_dir: Path):
    for results in (read_only_dir, read_only_dir / "results" / "deep"):
        found = config.problems({**tiny_config(), "results": str(results)}, local_files=True)
        tail = "" if results == read_only_dir else f", so {results} cannot be created"
        assert found == [f"results: {read_only_dir} is not writable{tail}. Fix: set results to a directory you can write"]
    assert list(read_only_dir.iterdir()) == []


# ---- keys given twice in a file ----


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_key_given_twice_names_file_lines_and_key(tmp_path: Path):
    text = tiny_text().replace("results: results\n", "results: results\nthreads: 2\n").replace("threads: 1\n", "threads: 1\ncache: {}\n")
    path = write(tmp_path, "c.yaml", text)
    assert config.duplicate_keys(path) == [
        f"threads: given twice in {path} (lines 2 and 4); YAML silently keeps the last. Fix: keep one of them",
        f"cache: given twice in {path} (lines 5 and 6); YAML silently keeps the last. Fix: keep one of them",
    ]


def test_epochs_given_twice_in_a_flow_mapping_and_a_run_defined_twice(tmp_path: Path):
    text = tiny_text().replace("seed: 0}\n    profiling", "seed: 0, epochs: 30}\n    profiling")
    text += "  base:\n    dataset: tiny\n    backbone: mini\n    train: {epochs: 1, lr: 0.1, batch_size: 8, seed: 1}\n"
    path = write(tmp_path, "c.yaml", text)
    assert config.file_problems([path]) == [
        f"runs.base.train.epochs: given twice in {path} (twice on line 25); YAML silently keeps the last. Fix: keep one of them",
        f"runs.base: given twice in {path} (lines 22 and 27); YAML silently keeps the last. Fix: keep one of them",
    ]
    with pytest.raises(ConfigError, match=r"\n  runs\.base: given twice"):
        config.load([path])


def test_merge_keys_aliases_and_overrides_across_files_are_not_duplicates(tmp_path: Path):
    anchors = "x-train: &train {epochs: 2, lr: 0.1}\nruns:\n  a:\n    train:\n      <<: *train\n      lr: 0.2\n  b:\n    train: *train\n"
    path = write(tmp_path, "anchors.yaml", anchors)
    override = write(tmp_path, "override.yaml", "results: elsewhere\nruns:\n  base:\n    train: {epochs: 5}\n")
    assert config.file_problems([path, override, TINY]) == []


def test_keys_given_twice_in_a_json_config(tmp_path: Path):
    path = write(tmp_path, "c.json", '{\n  "results": "a",\n  "threads": 1,\n  "results": "b"\n}\n')
    assert config.duplicate_keys(path) == [
        f"results: given twice in {path} (lines 2 and 4); YAML silently keeps the last. Fix: keep one of them"
    ]


def test_a_json_nan_is_refused(tmp_path: Path):
    text = json.dumps(tiny_config()).replace('"lr": 0.01', '"lr": NaN')
    loaded = json.loads(text)  # how Snakemake reads a JSON --configfile
    assert config.problems(loaded) == ["runs.base.train.lr: .nan is not a finite number. Fix: write a number > 0 and <= 10"]


def test_files_that_vanished_or_are_not_yaml_are_left_to_their_reader(tmp_path: Path):
    assert config.file_problems([tmp_path / "gone.yaml", write(tmp_path, "tabs.json", '{\t"a": 1}')]) == []


# ---- rffm.config.load (rffm status, rffm posttrain) ----


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "{path}: the configuration file is empty. Fix: write the configuration (see config/config.yaml)"),
        ("# only a comment\n", "{path}: the configuration file is empty. Fix: write the configuration (see config/config.yaml)"),
        ("- a\n- b\n", "{path}: holds a list, not a mapping of keys. Fix: write `key: value` lines (see config/config.yaml)"),
        ("a: [1\n", "{path}:2:1: not valid YAML ("),
    ],
    ids=["empty", "comments-only", "list", "broken-yaml"],
)
def test_load_refuses_a_file_that_is_not_a_configuration(tmp_path: Path, text: str, expected: str):
    path = write(tmp_path, "c.yaml", text)
    with pytest.raises(ConfigError) as refused:
        config.load([path])
    assert str(refused.value).startswith(expected.format(path=path)) and "\n" not in str(refused.value)


def test_load_checks_the_yaml_as_written(tmp_path: Path):
    path = write(tmp_path, "c.yaml", tiny_text().replace("lr: 0.01", "lr: .nan").replace("epochs: 3,", "epochs: 3.0,"))
    with pytest.raises(ConfigError) as refused:
        config.load([path])
    assert str(refused.value).splitlines()[1:] == [
        "  runs.base.train.lr: .nan is not a finite number. Fix: write a number > 0 and <= 10",
        "  runs.base.train.epochs: 3.0 is not of type 'integer'. Fix: write 3 (an integer >= 1 and <= 10000)",
    ]


# ---- what common.smk passes: read from the Snakemake workflow being parsed ----


def workflow(**changes: Any) -> SimpleNamespace:
    """The attributes of snakemake.workflow.Workflow that snakemake_settings reads, for a local run by default."""
    settings = {
        "configfiles": ["/w/config.yaml", "config/config.yaml"],
        "overwrite_configfiles": ["/w/config.yaml"],
        "config_settings": SimpleNamespace(replace_workflow_config=False, overwrite_config={"results": "r"}),
        "resource_settings": SimpleNamespace(cores=2, nodes=None),
        "output_settings": SimpleNamespace(dryrun=False),
        "storage_settings": SimpleNamespace(default_storage_provider=None),
        "remote_exec": False,
        "subprocess_exec": False,
    }
    return SimpleNamespace(**{**settings, **changes})


def test_snakemake_settings_tell_local_runs_from_cluster_dry_and_remote_ones():
    local = config.snakemake_settings(workflow())
    assert local == {"files": [Path("/w/config.yaml"), Path("config/config.yaml")], "runs_here": True, "local_files": True}
    cluster = workflow(resource_settings=SimpleNamespace(cores=None, nodes=50))  # --executor slurm --jobs 50
    assert config.snakemake_settings(cluster)["runs_here"] is False
    assert config.snakemake_settings(workflow(output_settings=SimpleNamespace(dryrun=True)))["runs_here"] is False
    assert config.snakemake_settings(workflow(remote_exec=True))["runs_here"] is False
    bucket = config.snakemake_settings(workflow(storage_settings=SimpleNamespace(default_storage_provider="gcs")))
    assert bucket["local_files"] is False and bucket["runs_here"] is True
    replaced = workflow(config_settings=SimpleNamespace(replace_workflow_config=True, overwrite_config={"scratch": "c"}))
    assert config.snakemake_settings(replaced)["files"] == [Path("/w/config.yaml")]  # rffm posttrain: the Snakefile's file is dropped


def test_a_dry_run_is_checked_where_its_executor_runs_the_jobs(monkeypatch, tmp_path: Path):
    """Issue 34: a dry run has no cores or nodes of its own (Snakemake swaps its executor for "dryrun"); the command
    line and its profiles say where the real run's jobs would run: here (checked while planning) or on nodes."""
    import sys

    from rffm.config import invocation

    profile = tmp_path / "cluster"
    profile.mkdir()
    (profile / "config.yaml").write_text("executor: slurm\njobs: 5\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # where Snakemake is once it changed into --directory
    dry = workflow(output_settings=SimpleNamespace(dryrun=True), resource_settings=SimpleNamespace(cores=1, nodes=None))
    dry.main_snakefile = str(tmp_path / "workflow/Snakefile")  # found from the directory it was started in
    cases = {
        (): invocation.HERE,
        ("--executor", "local"): invocation.HERE,
        ("--executor", "slurm"): invocation.NODES,
        ("--profile", str(profile)): invocation.NODES,
        ("-d", "work", "--profile", "cluster"): invocation.NODES,  # a relative profile, read from where it was started
        ("-d", str(work), "--profile", "cluster"): invocation.NODES,  # there: the Snakefile's path less workflow/Snakefile
        ("--profile", str(profile), "--executor", "local"): invocation.HERE,  # the command line wins over a profile
    }
    for args, where in cases.items():
        monkeypatch.setattr(sys, "argv", [str(tmp_path / "bin/snakemake"), "-n", *args])
        assert config.where_jobs_run(dry) == where, args
        assert config.snakemake_settings(dry)["runs_here"] is (where == invocation.HERE), args
    assert os.getcwd() == str(work)
    monkeypatch.setattr(sys, "argv", ["rffm", "posttrain"])  # an API caller: no command line to read
    assert config.where_jobs_run(dry) is None
    assert config.where_jobs_run(workflow(resource_settings=SimpleNamespace(cores=None, nodes=50))) == invocation.NODES
    assert config.where_jobs_run(workflow()) == invocation.HERE
    assert config.where_jobs_run(workflow(remote_exec=True)) is None


def test_nested_command_line_values_are_typed_as_a_config_file_types_them():
    """Issue 34: `--config 'cache={batch_size: 8}'` reaches the workflow as {'batch_size': '8'} (YAML's base loader);
    where the schema wants a number, integer or boolean it is read as the YAML scalar, as a config file would be."""
    given = {
        "cache": {"batch_size": "8"},
        "runs": {"base": {"export": "false", "train": {"lr": "0.05", "epochs": "4"}, "sweep": {"train.warmup_steps": ["0", "10"]}}},
    }
    merged = config.merge(tiny_config(), given)  # as Snakemake merges --config into the config files
    config.typed_overrides(merged, given, config.load_schema())
    checked = config.check(merged)
    run = checked["runs"]["base"]
    assert checked["cache"]["batch_size"] == 8 and run["train"]["epochs"] == 4 and run["train"]["lr"] == 0.05
    assert run["export"] is False and run["sweep"] == {"train.warmup_steps": [0, 10]}
    wrong = {"cache": {"batch_size": "eight"}}
    merged = config.merge(tiny_config(), wrong)
    config.typed_overrides(merged, wrong, config.load_schema())
    assert "cache.batch_size: 'eight' is not of type 'integer'" in "\n".join(config.problems(merged))
