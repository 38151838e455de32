"""Shared fixtures: a tiny configuration and helpers that run real Snakemake on it."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from rffm.config import entry_defaults
from rffm.steps import build_cache, import_backbone, pretrain_backbone, stage_dataset, train_epoch
from warm_snakemake import WarmSnakemake

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEFILE = REPO / "workflow" / "Snakefile"
TINY = REPO / "config" / "examples" / "tiny.yaml"
TARGET_RULES = {"final_qualification", "validation_selection"}


# ---- how `make test` spreads the tests over its pytest-xdist workers (Makefile: XDIST) ----
# Each module is one work unit, run whole on one worker (its module fixtures built once), as --dist loadfile makes it;
# the modules of one SHARED entry are one unit (the SLURM modules: one local cluster per session, `cluster`).
SHARED = [("test_slurm", "test_slurm_guarantees")]
# Modules whose every test is a work unit of its own (they share only session fixtures): the kill battery's 23 points,
# the guarantee matrix's 57 cells.
SPLIT = {"test_kill_battery", "test_guarantee_matrix"}
# The longest units start first (from the 25 slowest tests `make test` prints), so that the end of the run is the
# short modules on both workers, not one long one on one of them; every other module follows in collection order.
LONGEST_FIRST = [
    "test_slurm",
    "test_googlebatch",
    "test_sweep_workflow",
    "test_export_workflow",
    "test_byo",
    "test_guarantees",
    "test_googlebatch_guarantees",
    "test_plans_workflow",
    "test_workflow",
    "test_everyday",
    "test_restored",
    "test_sources_workflow",
    "test_posttrain",
    "test_cores",
    "test_bench_sweep",
    "test_bench_grid",
    "test_gpu_check",
    "test_fixes_misc_workflow",
    "test_fixes_integrity_workflow",
    "test_fixes_cache_race_workflow",
    "test_kill_battery",  # 23 units of ~10 s each: filling in for the long ones
    "test_guarantee_matrix",  # 57 units of ~6 s each, once test_byo has built the matrix tree they copy
    "test_examples",
    "test_config_refusals",
]


def module_of(nodeid: str) -> str:
    """A test's module name from its node id (tests/workflow/test_x.py::test_y[z] -> test_x)."""
    return Path(nodeid.split("::")[0]).stem


def work_unit(nodeid: str) -> str:
    """The unit of work a test is scheduled in: its module, its SHARED entry, or (SPLIT) itself."""
    module = module_of(nodeid)
    if module in SPLIT:
        return nodeid
    return next((names[0] for names in SHARED if module in names), module)


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile's scheduler with the work units above (xdist's own loadgroup cannot group by module here)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(module_of(item.nodeid), len(first)))


# ---- the steps as a rule calls them: specs completed with the schema's defaults ----


def stage(spec: dict, out_dir: Path) -> Path:
    return stage_dataset.run(entry_defaults("datasets", spec), out_dir)


def make_backbone(spec: dict, dataset_dir: Path, out_dir: Path) -> Path:
    return pretrain_backbone.run(entry_defaults("backbones", spec), dataset_dir, out_dir)


def import_checkpoint(spec: dict, out_dir: Path) -> Path:
    return import_backbone.run(entry_defaults("backbones", spec), out_dir)


def cache_options(**options) -> dict:
    """How build_cache runs (the schema's defaults, overridden by `options`)."""
    cache = entry_defaults("cache", {})
    return {"batch_size": cache["batch_size"], "disk_headroom": cache["disk_headroom"], **options}


def cache_build(dataset_dir: Path, backbone_dir: Path, record_dir: Path, scratch: Path, **options) -> Path:
    """build_cache: the record in record_dir (results/caches/<d>__<b>), the memo under scratch."""
    return build_cache.run(dataset_dir, backbone_dir, record_dir, scratch, **cache_options(**options))


def train_one_epoch(spec: dict, record_dir: Path, number: int, previous_dir: Path | None, out_dir: Path, scratch: Path, **options) -> Path:
    """train_epoch as the rule runs it (cache options from the schema's defaults)."""
    options.setdefault("cache_options", cache_options())
    return train_epoch.run(entry_defaults("runs", spec), record_dir, number, previous_dir, out_dir, scratch=scratch, **options)


def tiny_text() -> str:
    """The tiny configuration's YAML without its leading comments (line numbers in messages start at its first key)."""
    lines = TINY.read_text().splitlines(keepends=True)
    return "".join(lines[next(i for i, line in enumerate(lines) if not line.startswith("#")) :])


def tiny_config(export: bool = False) -> dict:
    """A fresh copy of the tiny configuration. Its run is not exported unless asked (`export: false`, which plans no
    export job): the export (torch.export and the ONNX check, most of a tiny run's time) is tested where it is looked at,
    on `exported_workdir` and in the executors' end-to-end runs."""
    config = yaml.safe_load(TINY.read_text())
    config["runs"]["base"]["export"] = export
    return config


class PlainDumper(yaml.SafeDumper):
    """YAML without anchors: a block two entries share is written out twice, so a test that loads the file and edits
    one entry edits that entry alone."""

    def ignore_aliases(self, data) -> bool:
        return True


def write_config(workdir: Path, config: dict) -> Path:
    path = workdir / "config.yaml"
    path.write_text(yaml.dump(config, Dumper=PlainDumper, sort_keys=False))
    return path


# Snakemake's start-up (its plugins' imports) paid once per worker: tests/warm_snakemake.py.
WARM = WarmSnakemake(str(BIN / "python"))


def snakemake(workdir: Path, *args: str, check: bool = True, **popen) -> subprocess.CompletedProcess:
    """Run the real workflow in workdir with its config.yaml (a `snakemake` process forked warm: WARM)."""
    command = [
        str(BIN / "snakemake"),
        "-s",
        str(SNAKEFILE),
        "-d",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        "2",
        *args,
    ]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RFFM_PLAIN_PROGRESS": "1"}
    result = WARM.run_any(command, workdir, env, **popen)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}")
    return result


JOB_HEADER = re.compile(r"^\s*(?:local)?(?:rule|checkpoint) (\w+):$")  # indented: a member of a group job
WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")


def planned_jobs(workdir: Path, *targets: str) -> list[str]:
    """The jobs a dry run plans, as sorted 'rule[wildcards]' strings (target rules left out)."""
    return plan_of(snakemake(workdir, "-n", *targets).stdout)


def plan_of(output: str) -> list[str]:
    """The jobs in a dry run's output, as sorted 'rule[wildcards]' strings (target rules left out)."""
    jobs, current = [], None
    for line in output.splitlines():
        if match := JOB_HEADER.match(line):
            if current:
                jobs.append(current)
            current = match.group(1)
        elif current and (match := WILDCARDS.match(line)):
            current += f"[{match.group(1)}]"
    if current:
        jobs.append(current)
    return sorted(job for job in jobs if job.split("[")[0] not in TARGET_RULES)


def accuracy_of_examples(qualification: Path) -> float:
    """The test accuracy a qualification's own per-example record implies (metrics.json, correct_by_example): what a
    recorded accuracy must equal."""
    import json

    from rffm.model.metrics import CORRECT_KEY, unpack_correct

    metrics = json.loads((qualification / "metrics.json").read_text())
    return float(unpack_correct(metrics[CORRECT_KEY], metrics["count"]).mean())


def copy_workdir(source: Path, destination: Path) -> Path:
    """Copy a finished working directory, keeping modification times and Snakemake metadata."""
    shutil.copytree(source, destination, symlinks=True, copy_function=shutil.copy2)
    return destination


@pytest.fixture(scope="session", autouse=True)
def no_user_profiles(tmp_path_factory) -> Iterator[None]:
    """Tests never see the profiles a developer's `make setup` linked into ~/.config/snakemake: the user
    config directory (where Snakemake looks profile names up) is an empty one for the whole session."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    yield
    patch.undo()


@pytest.fixture(scope="session", autouse=True)
def releasable_ledgers(tmp_path_factory) -> Iterator[None]:
    """Ledger entries the workflow made immutable (chattr +i: it can where the tests run as root) are released when the
    session ends, so that pytest can remove its old temporary directories."""
    yield
    release_ledgers(tmp_path_factory.getbasetemp())


def release_ledgers(root: Path) -> None:
    """Make every ledger entry under root removable again."""
    from rffm.records.store import set_immutable

    for path in root.rglob("ledger/*/*.json"):
        set_immutable(path, False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller (or the only process) releases the trees every worker shared (`built_once`), after they all ended."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and hasattr(session.config, "_tmp_path_factory"):
        root = session.config._tmp_path_factory.getbasetemp()
        for shared in (path for path in root.glob("shared-*") if path.is_dir()):
            release_ledgers(shared)


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A directory built once per test session and shared by every pytest-xdist worker (read it, copy it; never change
    it): the first worker to ask builds it under an exclusive lock, the others wait for it and reuse it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's base directory, above every worker's popen-gw<N>
    target, built = root / f"shared-{name}", root / f"shared-{name}.built"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this worker dies
        if not built.exists():
            if target.exists():  # a worker's build failed half-way: start again
                release_ledgers(target)
                shutil.rmtree(target)
            target.mkdir()
            build(target)
            built.touch()
    return target


@pytest.fixture(scope="session")
def finished_workdir(tmp_path_factory) -> Path:
    """The tiny workflow run to completion once per session, for every worker (copy it before changing anything)."""

    def build(workdir: Path) -> None:
        write_config(workdir, tiny_config())
        snakemake(workdir)

    return built_once(tmp_path_factory, "finished", build)


@pytest.fixture(scope="session")
def exported_workdir(finished_workdir: Path, tmp_path_factory) -> Path:
    """The finished tiny workflow with its run's export turned on: the export is the one job it plans and runs."""

    def build(root: Path) -> None:
        workdir = copy_workdir(finished_workdir, root / "work")
        write_config(workdir, tiny_config(export=True))
        assert planned_jobs(workdir) == ["export[run=base]"]
        snakemake(workdir)

    return built_once(tmp_path_factory, "exported", build) / "work"


@pytest.fixture(scope="session")
def selected_tree(tmp_path_factory) -> Path:
    """The tiny workflow run to its validation selection only, once per session: never qualified, so its settings may
    change (a qualified run's are frozen)."""

    def build(workdir: Path) -> None:
        write_config(workdir, tiny_config())
        snakemake(workdir, "validation_selection")

    return built_once(tmp_path_factory, "selected", build)


GRID_RUNS = {"second": (1, 2), "third": (2, 2), "fourth": (3, 1), "fifth": (4, 1)}  # run -> (seed, epochs)


def grid_config(colocate: str | None = None, runs: int = 3) -> dict:
    """A grid on one cache (issue 36): the tiny run `base` as it is, plus `second` and `third` on its dataset and backbone
    (2 epochs each, their own seeds, not exported) and, of a 5-run grid (issue 47), `fourth` and `fifth` (1 epoch each);
    `colocate` sets cache.colocate (absent: the schema's default)."""
    config = tiny_config()
    base = config["runs"]["base"]
    for name, (seed, epochs) in list(GRID_RUNS.items())[: runs - 1]:
        train = {**base["train"], "epochs": epochs, "seed": seed}
        config["runs"][name] = {"dataset": "tiny", "backbone": "mini", "train": train, "export": False}
    if colocate:
        config["cache"]["colocate"] = colocate
    return config


@pytest.fixture(scope="session")
def grid_tree(selected_tree: Path, tmp_path_factory) -> Path:
    """The 5-run grid run locally to its validation selections, once per session (the selected tiny tree plus the four
    new runs): the reference of the executors' co-location tests. Read it or copy it."""

    def build(root: Path) -> None:
        workdir = copy_workdir(selected_tree, root / "work")
        write_config(workdir, grid_config(runs=5))
        snakemake(workdir, "validation_selection")

    return built_once(tmp_path_factory, "grid", build) / "work"


def artifact_digests(results: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under results/artifacts/ (the selected classifiers), as `rffm bench grid`
    compares its arms."""
    from rffm.bench.grid import artifacts

    return artifacts(results)


# ---- one run of every kind, qualified (the guarantee matrix: tests/workflow/test_guarantee_matrix.py) ----
# kind -> the run (or reference) that stands for it in matrix_config()
RUN_KINDS = {
    "pretrained backbone": "base",
    "random floor": "floor",
    "python source (.pth)": "waves",
    "python source, safetensors": "spectrum",
    "export source (.pt2)": "exported",
    "sweep": "sweep",
    "label-scarce": "scarce",
    "tail adaptation": "tail",
    "end-to-end reference": "cnn",
}


def tiny_cnn() -> dict:
    """A small end-to-end reference on the tiny dataset (a `references:` entry)."""
    return {"dataset": "tiny", "model": {"width": 8, "blocks": 2}, "train": {"epochs": 2, "lr": 0.01, "batch_size": 16, "seed": 0}}


def matrix_config(digests: dict[str, str]) -> dict:
    """The tiny config with a run of every kind on the tiny dataset: the embedded pretrained backbone (base), its random
    floor, the three example user backbones (tests/byo.py), a sweep, a label-scarce run, a tail-adaptation run (each of
    these one epoch) and an end-to-end reference."""
    from byo import backbones

    config = tiny_config()
    base = config["runs"]["base"]
    base.pop("profiling")
    config["backbones"] |= backbones(digests) | {"floor": {**config["backbones"]["mini"], "source": "random"}}
    config["backbones"]["floor"].pop("pretrain")
    # one epoch each: a kind is what its backbone, grid or labels make it (base, the tiny run, keeps its 3 epochs)
    kind = {**base, "train": {**base["train"], "epochs": 1}}
    runs = {name: {**kind, "backbone": name} for name in ("floor", "waves", "spectrum", "exported")}
    runs["sweep"] = {**kind, "sweep": {"train.lr": [0.01, 0.03]}}
    runs["scarce"] = {**kind, "train": {**kind["train"], "labels_per_class_snr": 2}}
    # the backbone's one block trained beside the head, on a random backbone that caches the block's input too
    config["backbones"]["tailed"] = {**config["backbones"]["floor"], "arch": {**config["backbones"]["mini"]["arch"], "output_layers": 2}}
    runs["tail"] = {**kind, "backbone": "tailed", "train": {**kind["train"], "tail": {"blocks": 1, "lr": 0.003}}}
    config["runs"] = {"base": base, **yaml.safe_load(yaml.safe_dump(runs))}  # no YAML aliases between runs
    config["references"] = {"cnn": tiny_cnn()}
    return config


@pytest.fixture(scope="session")
def matrix_selected_tree(tmp_path_factory) -> Path:
    """Every kind of run trained and selected (never qualified), once per session: read it or copy it."""

    def build(workdir: Path) -> None:
        from byo import user_models

        write_config(workdir, matrix_config(user_models(workdir)))
        snakemake(workdir, "validation_selection")

    return built_once(tmp_path_factory, "matrix-selected", build)


@pytest.fixture(scope="session")
def matrix_tree(matrix_selected_tree: Path, tmp_path_factory) -> Path:
    """Every kind of run qualified, once per session (the selected tree plus its qualifications): read it or copy it."""

    def build(root: Path) -> None:
        snakemake(copy_workdir(matrix_selected_tree, root / "work"))

    return built_once(tmp_path_factory, "matrix", build) / "work"


@pytest.fixture
def selected_workdir(selected_tree: Path, tmp_path: Path) -> Path:
    """A private copy of the validation-selected (never qualified) tiny workflow."""
    return copy_workdir(selected_tree, tmp_path / "selected")


@pytest.fixture
def workdir(finished_workdir: Path, tmp_path: Path) -> Path:
    """A private copy of the finished tiny workflow."""
    return copy_workdir(finished_workdir, tmp_path / "work")


@pytest.fixture
def fresh_workdir(tmp_path: Path) -> Path:
    """An empty working directory with the tiny configuration."""
    workdir = tmp_path / "fresh"
    workdir.mkdir()
    write_config(workdir, tiny_config())
    return workdir


@pytest.fixture(scope="session")
def cluster() -> Iterator[object]:
    """munged + slurmctld + slurmd on 127.0.0.1 (tests/executors/slurm_cluster.py), started once for the SLURM modules
    (one work unit: SHARED) and stopped by PID. tests/executors/test_slurm.py runs first, on a cluster with no job yet."""
    import slurm_cluster

    reason = slurm_cluster.unavailable_reason()
    if reason:
        if os.environ.get("RFFM_REQUIRE_SLURM") == "1":  # set by .ci/run, which installs SLURM
            pytest.fail(f"RFFM_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    with slurm_cluster.LocalSlurm() as running:
        yield running


def wait_for(path: Path, timeout: float = 1200) -> None:
    """Wait until a file exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout}s")
        time.sleep(0.05)


def sigkill_once_started(command: list[str], cwd: Path, env: dict[str, str], marker: Path) -> None:
    """Run a command in its own process group and SIGKILL the whole group soon after `marker` appears."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(marker)
        time.sleep(0.5)
        assert process.poll() is None, f"{command[0]} ended before it could be killed"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# The traces a profiled run publishes (config/examples/tiny.yaml profiles 2 batches): the cache build, epochs 1 and 2.
PROFILED_TRACES = [
    "cache_build.trace.json",
    "epoch1_train.trace.json",
    "epoch1_val.trace.json",
    "epoch2_train.trace.json",
    "epoch2_val.trace.json",
]


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody here can write in: chmod for a normal user; root ignores modes, so a read-only mount."""
    target = tmp_path / "ro"
    target.mkdir()
    if os.geteuid() != 0:
        target.chmod(0o555)
        yield target
        target.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(target)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"root cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)
