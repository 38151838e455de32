"""The guarantee matrix (issue 34): every kind of run x every change a user makes, on qualified tiny runs.

One tree holds a qualified run of each kind (conftest.matrix_tree, RUN_KINDS). A cell makes one change to the config
(restricted to that kind's run) or to the files it reads, then pins what the README promises of a qualified run:
the plan — refused while planning, in one line naming the run and what changed, for the dry run and for the real
run of both targets; or exactly the jobs planned (none for a touch or an execution setting) —, every file under
results/ with its bytes, and `rffm verify` clean. A new run kind is an entry of RUN_KINDS (and a run in
matrix_config), a new change an entry of CHANGES.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import textwrap
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import yaml

from conftest import RUN_KINDS, copy_workdir, plan_of, snakemake, write_config
from rffm.cli import main

pytestmark = pytest.mark.workflow

USER_MODULES = {"waves": "models/wavesfm_like.py", "spectrum": "models/spectrumfm_like.py"}
WEIGHTS = {
    "waves": "weights/wavesfm_like.pth",
    "spectrum": "weights/spectrumfm_like.safetensors",
    "exported": "weights/spectrumfm_like.pt2",
}
REFUSED = "refused"  # a cell's expected plan, or the exact jobs (a list)


@pytest.fixture(scope="module")
def tree(matrix_tree: Path, tmp_path_factory) -> Path:
    """A private copy of the qualified tree; every cell leaves it as it found it (that is what a cell checks)."""
    return copy_workdir(matrix_tree, tmp_path_factory.mktemp("matrix") / "work")


def config_of(workdir: Path) -> dict:
    return yaml.safe_load((workdir / "config.yaml").read_text())


def only(config: dict, run: str) -> dict:
    """The config with this kind's run alone (a reference keeps `base`: a config needs a run), the others out of it."""
    kept = "base" if run in config["references"] else run
    config["runs"] = {kept: config["runs"][kept]}
    config["references"] = {name: spec for name, spec in config["references"].items() if name == run}
    return config


def spec_of(config: dict, run: str) -> tuple[str, dict]:
    """The run's (or reference's) config key and its block."""
    section = "references" if run in config["references"] else "runs"
    return f"{section}.{run}", config[section][run]


def results_bytes(workdir: Path) -> dict[str, str]:
    """sha256 of every file under results/."""
    root = workdir / "results"
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- the changes: each makes its change and yields the words its refusal names (None: nothing may be planned) ----


@contextmanager
def training_param(workdir: Path, config: dict, run: str):
    key, spec = spec_of(config, run)
    name = "labels_per_class_snr" if "labels_per_class_snr" in spec["train"] else "weight_decay" if run != "cnn" else "lr"
    value = spec["train"].get(name, 0.01)
    spec["train"][name] = value + 1 if isinstance(value, int) else value * 2
    yield f"{key}.train.{name}"


@contextmanager
def more_epochs(workdir: Path, config: dict, run: str):
    key, spec = spec_of(config, run)
    spec["train"]["epochs"] += 1
    yield f"{key}.train.epochs"


@contextmanager
def the_data(workdir: Path, config: dict, run: str):
    config["datasets"]["tiny"]["seed"] += 1
    yield "datasets.tiny.seed"


@contextmanager
def step_code(workdir: Path, config: dict, run: str):
    """An edit of the step that trains the run, as its code digest sees it (sitecustomize: the workflow's process only)."""
    step = "train_reference" if run == "cnn" else "train_epoch"
    hook = workdir / "edited" / "sitecustomize.py"
    hook.parent.mkdir()
    hook.write_text(
        "import rffm.records.code as c\n_real = c.code_digest\n"
        f"c.code_digest = lambda m: ('edited' + _real(m)) if m == 'steps.{step}' else _real(m)\n"
    )
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook.parent), before]))
    try:
        yield f"code of {step}"
    finally:
        os.environ.pop("PYTHONPATH") if before is None else os.environ.update(PYTHONPATH=before)
        hook.unlink()
        hook.parent.rmdir()


@contextmanager
def user_module_source(workdir: Path, config: dict, run: str):
    source = workdir / USER_MODULES[run]
    original = source.read_text()
    source.write_text(
        original
        + textwrap.dedent("""
        SCALE = 1.0  # an edit of the user's module: its source digest changes
    """)
    )
    try:
        yield "source of backbones"
    finally:
        source.write_text(original)


def perturbed(path: Path) -> bytes:
    """The weights file with one value changed, in its own format."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load, save

        state = load(path.read_bytes())
        first = sorted(state)[0]
        state[first] = state[first] + 1e-3
        return save(state)
    if path.suffix == ".pt2":
        program = torch.export.load(str(path))
        name = sorted(program.state_dict)[0]
        program.state_dict[name].data.add_(1e-3)
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        return buffer.getvalue()
    checkpoint = torch.load(path, weights_only=True)
    name = sorted(checkpoint["model"])[0]
    checkpoint["model"][name] = checkpoint["model"][name] + 1e-3
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


@contextmanager
def new_weights(workdir: Path, config: dict, run: str, pin: bool = True):
    """Other weights in the file the backbone names, its sha256 pin updated (pin=False: the pin left stale)."""
    path = workdir / WEIGHTS[run]
    original = path.read_bytes()
    changed = perturbed(path)
    path.write_bytes(changed)
    if pin:
        config["backbones"][run]["sha256"] = hashlib.sha256(changed).hexdigest()
    try:
        yield f"backbones.{run}.sha256" if pin else "sha256"
    finally:
        path.write_bytes(original)


@contextmanager
def stale_pin(workdir: Path, config: dict, run: str):
    with new_weights(workdir, config, run, pin=False) as words:
        yield words


@contextmanager
def the_grid(workdir: Path, config: dict, run: str):
    config["runs"][run]["sweep"]["train.lr"].append(0.1)
    yield f"runs.{run}.sweep.train.lr"


@contextmanager
def touch_everything(workdir: Path, config: dict, run: str):
    """Every file of the tree and every file it was made from, newer: content is what counts."""
    for path in [*(workdir / "results").rglob("*"), *(workdir / "models").rglob("*"), *(workdir / "weights").rglob("*")]:
        if path.is_file():
            os.utime(path)
    yield None


@contextmanager
def execution_setting(workdir: Path, config: dict, run: str):
    config["cache"]["batch_size"] = 8
    yield None


@contextmanager
def more_seeds(workdir: Path, config: dict, run: str):
    """seeds: 2 on the qualified run: its second seed is a run of its own (<run>-seed1), planned in full beside it."""
    spec_of(config, run)[1]["seeds"] = 2
    yield SEEDED


SEEDED = "plans the new seed's run alone"


@contextmanager
def a_design(workdir: Path, config: dict, run: str):
    """design: names records of variants compared on val behind the run: read by rffm compare only."""
    config["design"] = {run: ["pilot_variants"]}
    yield None


@contextmanager
def a_throughput_record(workdir: Path, config: dict, run: str):
    """throughput: a record of this tree's own jobs (`rffm throughput`): the plan then predicts cost; it plans nothing."""
    record = workdir / "throughput.json"
    assert main(["throughput", str(workdir / "results"), "--config", str(workdir / "config.yaml"), "--out", str(record)]) == 0
    config["throughput"] = str(record)
    try:
        yield None
    finally:
        record.unlink()


# change -> (what it does, the kinds it applies to: None for all)
CHANGES: dict[str, tuple[Callable, tuple[str, ...] | None]] = {
    "a training param": (training_param, None),
    "more epochs": (more_epochs, None),
    "the data": (the_data, None),
    "a step's code": (step_code, None),
    "the user's module source": (user_module_source, tuple(USER_MODULES)),
    "the weights file (pin updated)": (new_weights, tuple(WEIGHTS)),
    "the weights file (pin kept)": (stale_pin, tuple(WEIGHTS)),
    "the grid": (the_grid, ("sweep",)),
    "touch every file": (touch_everything, None),
    "an execution setting": (execution_setting, None),
    "more seeds": (more_seeds, None),
    "a design record": (a_design, None),
    "a throughput record": (a_throughput_record, None),
}
CELLS = [
    pytest.param(kind, change, id=f"{kind}-{change}")
    for kind, run in RUN_KINDS.items()
    for change, (_, kinds) in CHANGES.items()
    if kinds is None or run in kinds
]


def refusal_of(workdir: Path, *args: str) -> str:
    """The one line a refused snakemake printed (fails when it was not refused)."""
    done = snakemake(workdir, *args, check=False)
    lines = (done.stdout + done.stderr).splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("rffm")), None)
    assert done.returncode != 0 and first is not None, (args, done.stdout[-2000:], done.stderr[-2000:])
    listed = [line.strip() for line in lines[first + 1 :] if line.startswith("  ")]  # an invalid config lists its problems
    return " ".join([lines[first], *listed[:1]]) if lines[first].endswith(":") else lines[first]


@pytest.mark.parametrize("kind, change", CELLS)
def test_a_qualified_run_keeps_its_records_whatever_changes(tree: Path, kind: str, change: str, capsys):
    run = RUN_KINDS[kind]
    original = (tree / "config.yaml").read_text()
    before = results_bytes(tree)
    config = config_of(tree)
    make_change, _ = CHANGES[change]
    try:
        with make_change(tree, config, run) as named:
            if named == SEEDED:  # exactly the jobs the run itself took, under the new seed's name, and nothing of it again
                write_config(tree, config)
                replica = f"{run}-seed1"
                planned = plan_of(snakemake(tree, "-n").stdout)
                everything = plan_of(snakemake(tree, "-n", "--forceall").stdout)
                own = [job for job in everything if re.search(rf"\b(run|reference)={re.escape(run)}(,|\])", job)]
                expected = sorted(re.sub(rf"\b(run|reference)={re.escape(run)}\b", rf"\g<1>={replica}", job) for job in own)
                assert own and [job for job in planned if "=" in job] == expected, (kind, planned)
                assert {job for job in planned if "=" not in job} <= {"plot_comparison"}, planned
            elif named is None:  # content unchanged: exactly nothing to do, whatever the target (one plan of both: their union)
                write_config(tree, config)
                assert plan_of(snakemake(tree, "-n", "final_qualification", "validation_selection").stdout) == [], (kind, change)
            else:  # refused while planning, dry or real, whatever the target, in one line naming the run and the change
                write_config(tree, only(config, run))
                for args in (("-n",), (), ("validation_selection",)):  # a reference's selection is a target too
                    said = refusal_of(tree, *args)
                    assert named in said, (args, said)
                    if change not in ("the data", "the weights file (pin kept)"):  # those name the dataset or the file
                        assert f"{spec_of(config, run)[0]} was qualified" in said, said
            assert results_bytes(tree) == before, "a file under results/ was deleted or rewritten"
    finally:
        (tree / "config.yaml").write_text(original)
    capsys.readouterr()
    assert main(["verify", str(tree / "results")]) == 0, capsys.readouterr().out
