"""Issue 34: the Fixes of launching a run — the workflow's planning checks (rffm.plan.planning: the storage prefix, the
command line's targets), the launch record (rffm.records.launch), `rffm install_profiles`, `rffm posttrain`'s
Snakefile and `rffm unlock` — each provoked, followed as printed (a command run as printed), and the same call or
command then works. The workflow's checks are called as common.smk calls them, with Snakemake's `workflow` reduced
to what they read."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import BIN, REPO, SNAKEFILE, TINY, WARM, copy_workdir, tiny_text
from fixes import fix_of, run_fix
from rffm import config as rffm_config
from rffm.cloud import posttrain
from rffm.cloud.profiles import install_profiles
from rffm.errors import ConfigError, PlanRefused, RffmError
from rffm.ops import unlock as locks
from rffm.plan import planning
from rffm.records import launch
from rffm.records.store import PosixStore

WORKFLOW_FILES = [SNAKEFILE, *(REPO / "workflow").rglob("*.smk")]
RULES = sorted({name for path in WORKFLOW_FILES for name in re.findall(r"^rule (\w+):", path.read_text(), re.M)})


def test_an_unset_bucket_variable_in_the_storage_prefix_is_fixed_by_exporting_it(monkeypatch):
    """profiles/gcp-batch: default-storage-prefix: gs://$RFFM_GCS_BUCKET/rffm, which Snakemake expands from the environment."""
    from snakemake.exceptions import WorkflowError

    setting = yaml.safe_load((REPO / "profiles/gcp-batch/config.yaml").read_text())["default-storage-prefix"]

    def workflow() -> SimpleNamespace:
        return SimpleNamespace(storage_settings=SimpleNamespace(default_storage_prefix=os.path.expandvars(setting)))

    monkeypatch.delenv("RFFM_GCS_BUCKET", raising=False)
    with pytest.raises(WorkflowError) as caught:
        planning.results_store(workflow(), "results")
    assert fix_of(caught.value.args[0]) == "export it (profiles/README.md, Google Cloud)."
    monkeypatch.setenv("RFFM_GCS_BUCKET", "my-project-rffm")
    assert planning.results_store(workflow(), "results") == "gs://my-project-rffm/rffm/results"


def check_targets(monkeypatch, config: dict, *targets: str) -> None:
    """planning.check_targets as `snakemake -n <targets>` runs it while parsing the workflow (the targets as Snakemake's
    parser reads them off its command line: command_line_targets; tests/workflow/test_targets.py runs that parser)."""
    monkeypatch.setattr(planning, "command_line_targets", lambda workflow: sorted(targets))
    workflow = SimpleNamespace(rules=[SimpleNamespace(name=name) for name in RULES], is_rule=lambda name: name in RULES)
    planning.check_targets(workflow, config, config["results"])


def renamed(old: str, new: str) -> Callable[[str, dict, str], tuple[str, dict]]:
    return lambda target, config, fix: (target.replace(old, new), config)


def a_listed_rule(target: str, config: dict, fix: str) -> tuple[str, dict]:
    listed = re.search(r"name one of its rules \(([^)]*)\)", fix).group(1).split(", ")
    assert "final_qualification" in listed, fix
    return "final_qualification", config


def a_file_under_results(target: str, config: dict, fix: str) -> tuple[str, dict]:
    return "results/runs/base/qualification/run_manifest.json", config


def the_run_added(target: str, config: dict, fix: str) -> tuple[str, dict]:
    config["runs"]["bsae"] = config["runs"]["base"]
    return target, config


def more_epochs(target: str, config: dict, fix: str) -> tuple[str, dict]:
    config["runs"]["base"]["train"]["epochs"] = 7
    return target, config


TARGETS = {  # a target nothing makes -> its Fix, and each way the Fix names, done
    "final_qualificaton": ("name one of its rules (", [a_listed_rule, a_file_under_results]),
    "results/runs/bsae/qualification/run_manifest.json": (
        "name one of them, or add the run to the config",
        [renamed("bsae", "base"), the_run_added],
    ),
    "results/runs/base/epochs/7/checkpoint.pt": (
        "name an epoch from 1 to 3, or raise runs.base.train.epochs (a qualified run is frozen: give it a new id)",
        [renamed("/7/", "/3/"), more_epochs],
    ),
}


@pytest.mark.parametrize("target", TARGETS)
def test_a_target_nothing_makes_is_fixed_by_each_way_its_line_names(target: str, monkeypatch):
    expected, ways = TARGETS[target]
    with pytest.raises(PlanRefused) as caught:
        check_targets(monkeypatch, rffm_config.load([TINY]), target)
    fix = fix_of(caught)
    assert fix.startswith(expected), fix
    for way in ways:
        fixed, config = way(target, rffm_config.load([TINY]), fix)
        check_targets(monkeypatch, config, fixed)


def profile(root: Path, name: str, text: str) -> Path:
    path = root / name / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_launch_profile_snakemake_cannot_find_by_name_is_fixed_by_putting_it_where_it_looks(tmp_path: Path, monkeypatch):
    """A profile launched by its path (snakemake --profile ~/profiles/mine) whose config: says launch_profile: mine."""
    monkeypatch.chdir(tmp_path)
    source = profile(tmp_path / "elsewhere", "mine", "config:\n  launch_profile: mine\n")
    store = PosixStore(tmp_path / "results")
    with pytest.raises(RffmError) as caught:
        launch.record_launch("mine", REPO / "workflow", store, ["base"])
    assert fix_of(caught) == (
        "put (or link) the profile where `snakemake --profile mine` finds it: a directory mine/ here or in Snakemake's user "
        "profile directory (`rffm install_profiles` links the shipped ones there); or drop the key."
    )
    (tmp_path / "mine").symlink_to(source.parent)  # a directory mine/ here
    assert launch.record_launch("mine", REPO / "workflow", store, ["base"])["name"] == "mine"
    assert launch.record_launch(None, REPO / "workflow", store, ["base"]) is None  # or no key: nothing to record


def test_a_changed_launch_profile_is_fixed_by_each_way_its_line_names(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Snakemake finds the profile `slurm` here
    source = profile(tmp_path, "slurm", "executor: slurm\n")
    store = PosixStore(tmp_path / "results")
    launched = launch.record_launch("slurm", REPO / "workflow", store, ["base"])

    def changed() -> str:
        source.write_text("executor: slurm\njobs: 3\n")
        with pytest.raises(launch.LaunchProfileChanged) as caught:
            launch.record_launch("slurm", REPO / "workflow", store, ["base"])
        return fix_of(caught)

    fix = changed()
    assert fix.startswith("restore the profile file (compare the two files), or launch these changes as a new run id (rename the run")
    source.write_text("executor: slurm\n")  # restored
    assert launch.record_launch("slurm", REPO / "workflow", store, ["base"]) == launched
    changed()
    with pytest.raises(launch.LaunchProfileChanged):  # a copy under a new name: the launch still records it for `base`
        launch.record_launch("slurm", REPO / "workflow", store, ["base", "base-2"])
    assert launch.record_launch("slurm", REPO / "workflow", store, ["base-2"])["sha256"] != launched["sha256"]  # renamed
    fix = changed()
    folder = re.search(r"or delete (\S+) to record the new profile\.$", fix).group(1)
    run_fix(f"rm -r {folder}", tmp_path)  # deleted
    assert launch.record_launch("slurm", REPO / "workflow", store, ["base"])["sha256"] != launched["sha256"]


def test_profiles_of_a_folder_that_is_no_checkout_are_fixed_by_running_install_profiles_from_a_checkout(tmp_path: Path):
    profiles = tmp_path / "xdg" / "snakemake"  # Snakemake's user profile directory under XDG_CONFIG_HOME
    linked, [refused] = install_profiles(tmp_path / "not-a-checkout", profiles, names=("gcp-batch",))
    assert linked == [] and not (profiles / "gcp-batch").exists()
    command = re.fullmatch(r"run `([^`]+)` from an rffm checkout \(it links its profiles/\)\.", fix_of(refused)).group(1)
    run_fix(command, REPO, {"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert (profiles / "gcp-batch").resolve() == REPO / "profiles" / "gcp-batch"
    assert install_profiles(REPO, profiles, names=("gcp-batch",)) == (
        [f"{profiles / 'gcp-batch'} -> {REPO / 'profiles/gcp-batch'}: already linked"],
        [],
    )


def test_a_snakefile_that_is_not_there_is_fixed_by_setting_rffm_snakefile_to_the_checkouts(
    tmp_path: Path, finished_workdir: Path, monkeypatch
):
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    monkeypatch.setenv("RFFM_SNAKEFILE", str(tmp_path / "moved" / "workflow" / "Snakefile"))  # a checkout that moved
    with pytest.raises(ConfigError) as caught:
        posttrain.posttrain([workdir / "config.yaml"], tmp_path / "cache", directory=workdir)
    assert fix_of(caught) == "pass --snakefile, or set RFFM_SNAKEFILE to the checkout's workflow/Snakefile"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIP_", "RFFM_"))}
    env.update({"RFFM_SNAKEFILE": str(SNAKEFILE), "RFFM_PLAIN_PROGRESS": "1"})
    command = [
        str(BIN / "rffm"),
        "posttrain",
        "--config",
        str(workdir / "config.yaml"),
        "--hidden-state-cache-directory",
        str(tmp_path / "cache"),
    ]
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


class NoProc(type(Path())):
    """A host without /proc, where rffm unlock cannot tell whether a run is alive."""

    def is_dir(self) -> bool:
        return False if str(self) == "/proc" else super().is_dir()


def test_a_lock_rffm_unlock_leaves_alone_is_fixed_by_snakemake_unlock(tmp_path: Path, monkeypatch):
    """Taken on another host (or on a host without /proc): `snakemake --unlock` where runs start, a checkout."""
    checkout = tmp_path / "checkout"
    (checkout / "config").mkdir(parents=True)
    (checkout / "workflow").symlink_to(REPO / "workflow")
    (checkout / "config" / "config.yaml").write_text(tiny_text())
    (checkout / ".snakemake" / "locks").mkdir(parents=True)
    (checkout / ".snakemake" / "locks" / "0.input.lock").write_text("x\n")
    (checkout / ".snakemake" / locks.OWNER_FILE).write_text("another-host\n")
    status, elsewhere = locks.unlock(checkout)
    assert status == locks.LEFT_ALONE and fix_of(elsewhere) == "if nothing runs there, `snakemake --unlock`", elsewhere
    with monkeypatch.context() as no_proc:
        no_proc.setattr(locks, "Path", NoProc)
        status, unknown = locks.unlock(checkout)
    assert status == locks.LEFT_ALONE and fix_of(unknown) == "if nothing runs, `snakemake --unlock`", unknown
    command = re.search(r"`([^`]+)`", fix_of(unknown)).group(1)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    if command == "snakemake --unlock" and WARM.serves(env):  # as printed, forked from the warm snakemake (conftest.snakemake)
        done = WARM.run([str(BIN / "snakemake"), "--unlock"], checkout, env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    else:
        run_fix(command, checkout)
    assert locks.unlock(checkout) == (locks.NOT_LOCKED, f"{checkout}: not locked")
