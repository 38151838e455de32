"""The literal commands: `snakemake --profile gcp-batch|slurm` find this checkout's profiles by name
(after `rffm install_profiles`, which `make setup` runs), and the tiny-config recipe plans only the tiny run.

Every command runs in a temporary HOME (Snakemake looks profile names up in the current directory, then
in $XDG_CONFIG_HOME/snakemake, default ~/.config/snakemake, then the site config directory); the Google
Cloud profile reads its bucket from a local GCS emulator.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from batch_support import create_bucket, gcs_emulator, make_checkout, profile_env

from conftest import BIN, JOB_HEADER, REPO, WARM, plan_of
from fixes import run_fix

TINY_JOBS = sorted(
    ["stage_dataset[dataset=tiny]", "pretrain_backbone[backbone=mini]", "build_cache[dataset=tiny, backbone=mini]"]
    + [f"train_epoch[run=base, epoch={e}]" for e in (1, 2, 3)]
    + ["select_checkpoint[run=base]", "qualify[run=base]", "plot_training[run=base]", "summarize_manifest[run=base]"]
    + ["summarize_profiling[run=base]", "plot_cache_lifecycle[run=base]", "export[run=base]"]
)
RECIPE = ("--configfile", "config/examples/tiny.yaml", "--replace-workflow-config", "-n")
GPU_RULES = ("pretrain_backbone", "build_cache", "train_epoch", "qualify")


@pytest.fixture(scope="module")
def emulator():
    with gcs_emulator() as url:
        yield url


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment with a fresh HOME (no XDG_CONFIG_HOME, nothing of rffm's or Snakemake's set)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("RFFM_", "SNAKEMAKE_", "XDG_", "STORAGE_EMULATOR"))}
    return {**environ, "HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **extra}


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A command as typed (PATH starts with the venv's bin); `snakemake` is forked warm (conftest.WARM)."""
    if command[0] == "snakemake":
        return WARM.run_any([str(BIN / "snakemake"), *command[1:]], cwd, env, timeout=900)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def gcp_env(home: Path, emulator: str, bucket: str) -> dict[str, str]:
    """What the Google Cloud setup in profiles/README.md leaves: the profile's variables, credentials (here: the emulator), a bucket."""
    create_bucket(emulator, bucket)
    return user_env(home, STORAGE_EMULATOR_HOST=emulator, **profile_env(bucket))


def test_install_profiles_links_is_idempotent_and_refuses_to_replace(tmp_path: Path):
    from rffm.cloud.profiles import install_profiles

    target = tmp_path / "config" / "snakemake"
    first, refused = install_profiles(REPO, target)
    assert first == [f"{target / n} -> {REPO / 'profiles' / n}: linked" for n in ("gcp-batch", "slurm")] and refused == []
    assert (target / "gcp-batch" / "config.yaml").read_bytes() == (REPO / "profiles/gcp-batch/config.yaml").read_bytes()
    assert install_profiles(REPO, target) == ([line.replace(": linked", ": already linked") for line in first], [])

    other = tmp_path / "other"
    (target / "gcp-batch").unlink()
    (target / "gcp-batch").mkdir()  # a site's own profile of that name
    (target / "slurm").unlink()
    done, [line] = install_profiles(REPO, target)
    assert line.count("Fix:") == 1 and "\n" not in line
    assert f"{target / 'gcp-batch'} is a directory" in line
    assert done == [f"{target / 'slurm'} -> {REPO / 'profiles/slurm'}: linked"], "the name that is free is linked all the same"
    (target / "gcp-batch").rmdir()
    (target / "gcp-batch").symlink_to(other)
    done, [line] = install_profiles(REPO, target)
    assert f"is a link to {other}" in line and done == [f"{target / 'slurm'} -> {REPO / 'profiles/slurm'}: already linked"]
    assert Path(os.readlink(target / "gcp-batch")) == other, "a link elsewhere is left as it is"


def test_install_profiles_refuses_each_name_on_its_own_line_and_its_fix_works(tmp_path: Path):
    """Issue 34: two refused names were joined on one line. Each is its own error line with its Fix, executed here."""
    home = tmp_path / "home"
    links = home / ".config" / "snakemake"
    for name in ("gcp-batch", "slurm"):
        (links / name).mkdir(parents=True)  # a site's own profiles of these names
    refused = run(["rffm", "install_profiles"], REPO, user_env(home))
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    lines = refused.stderr.splitlines()
    assert [line.partition(", not this checkout's profile")[0] for line in lines] == [
        f"rffm install_profiles: error: {links / name} is a directory" for name in ("gcp-batch", "slurm")
    ]
    for name, line in zip(("gcp-batch", "slurm"), lines, strict=True):
        fix = f"Fix: move it away (mv {links / name} {links / name}.old) and run `rffm install_profiles` again"
        assert line.count("Fix:") == 1 and fix in line, line
        subprocess.run(["mv", str(links / name), f"{links / name}.old"], check=True)  # the Fix, literally
    installed = run(["rffm", "install_profiles"], REPO, user_env(home))
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.splitlines() == [f"{links / n} -> {REPO / 'profiles' / n}: linked" for n in ("gcp-batch", "slurm")]


def test_install_profiles_links_the_free_name_when_the_other_is_taken_and_its_fix_links_that_too(tmp_path: Path):
    """Issue 50: one name held by a directory of the user's linked nothing. Now the free name is linked, the taken one
    is left with its contents, named on its own error line (exit 2); its Fix, run as printed, then lets it link."""
    home = tmp_path / "home"
    links = home / ".config" / "snakemake"
    (links / "slurm").mkdir(parents=True)
    (links / "slurm" / "config.yaml").write_text("executor: slurm  # the site's own profile\n")
    refused = run(["rffm", "install_profiles"], REPO, user_env(home))
    assert refused.returncode == 2, refused.stderr
    assert refused.stdout.splitlines() == [f"{links / 'gcp-batch'} -> {REPO / 'profiles/gcp-batch'}: linked"]
    assert (links / "gcp-batch").resolve() == REPO / "profiles" / "gcp-batch"
    assert not (links / "slurm").is_symlink() and [p.name for p in (links / "slurm").iterdir()] == ["config.yaml"]
    assert (links / "slurm" / "config.yaml").read_text() == "executor: slurm  # the site's own profile\n", "left as it was"
    [line] = refused.stderr.splitlines()
    assert line.startswith(f"rffm install_profiles: error: {links / 'slurm'} is a directory, not this checkout's profile "), line
    command = re.search(r" Fix: move it away \((mv \S+ \S+)\) and run `rffm install_profiles` again", line).group(1)
    assert command == f"mv {links / 'slurm'} {links / 'slurm'}.old"
    run_fix(command, REPO, user_env(home))  # the Fix, literally

    again = run(["rffm", "install_profiles"], REPO, user_env(home))
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert again.stdout.splitlines() == [
        f"{links / 'gcp-batch'} -> {REPO / 'profiles/gcp-batch'}: already linked",
        f"{links / 'slurm'} -> {REPO / 'profiles/slurm'}: linked",
    ]
    assert (links / "slurm.old" / "config.yaml").read_text() == "executor: slurm  # the site's own profile\n"


def test_the_literal_commands_plan_the_workflow_after_setup(tmp_path: Path, emulator: str):
    """Acceptance: `snakemake --profile gcp-batch -n` and `snakemake --profile slurm -n` from the checkout root."""
    home = tmp_path / "home"
    home.mkdir()
    before = run(["snakemake", "--profile", "slurm", "-n"], REPO, user_env(home))
    assert before.returncode != 0 and "no profile.yaml (or config.yaml) found" in before.stderr, "the name resolved before setup"

    installed = run(["rffm", "install_profiles"], REPO, user_env(home))
    assert installed.returncode == 0, installed.stderr
    links = home / ".config" / "snakemake"
    assert installed.stdout.splitlines() == [f"{links / n} -> {REPO / 'profiles' / n}: linked" for n in ("gcp-batch", "slurm")]

    slurm = run(["snakemake", "--profile", "slurm", "-n"], REPO, user_env(home))
    assert slurm.returncode == 0, slurm.stderr[-3000:]
    assert "Using profiles slurm and workflow specific profile profiles/default" in slurm.stdout + slurm.stderr
    assert "Job stats" in slurm.stdout or "Nothing to be done" in slurm.stdout + slurm.stderr

    gcp = run(["snakemake", "--profile", "gcp-batch", "-n"], REPO, gcp_env(home, emulator, "rffm-literal"))
    assert gcp.returncode == 0, gcp.stderr[-3000:]
    assert "Using profiles gcp-batch and workflow specific profile profiles/default" in gcp.stdout + gcp.stderr
    assert plan_of(gcp.stdout), "an empty bucket: the whole default workflow is planned"
    assert "gs://rffm-literal/rffm/results/runs/baseline/qualification/run_manifest.json" in gcp.stdout


@pytest.fixture(scope="module")
def default_checkout(tmp_path_factory) -> Path:
    """A user's checkout with the shipped config/config.yaml (the default workflow) and config/examples/tiny.yaml."""
    return make_checkout(tmp_path_factory.mktemp("checkout"), yaml.safe_load((REPO / "config/config.yaml").read_text()))


@pytest.mark.parametrize("profile", [None, "slurm", "gcp-batch"])
def test_the_tiny_recipe_plans_only_the_tiny_run(profile: str | None, default_checkout: Path, tmp_path: Path, emulator: str):
    """`snakemake [--profile P] --configfile config/examples/tiny.yaml --replace-workflow-config -n` from the checkout root."""
    home = tmp_path / "home"
    installed = run(["rffm", "install_profiles", "--checkout", str(default_checkout)], default_checkout, user_env(home))
    assert installed.returncode == 0, installed.stderr
    env = gcp_env(home, emulator, "rffm-tiny-recipe") if profile == "gcp-batch" else user_env(home)
    profile_args = ["--profile", profile] if profile else []

    recipe = run(["snakemake", *profile_args, *RECIPE], default_checkout, env)
    assert recipe.returncode == 0, recipe.stderr[-3000:]
    assert plan_of(recipe.stdout) == TINY_JOBS
    if profile == "slurm":  # issue 34: GPU rules compute on the GPU they book; the other rules take no device
        computed = computed_on(recipe.stdout)
        assert {rule: computed.pop(rule) for rule in GPU_RULES} == {rule: {("cuda", "1")} for rule in GPU_RULES}
        assert set().union(*computed.values()) == {("-", "-")}, computed
    assert "Config file config/config.yaml is replaced" in recipe.stdout + recipe.stderr

    merged = run(["snakemake", *profile_args, *RECIPE[:2], "-n"], default_checkout, env)  # without --replace-workflow-config
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert "select_checkpoint[run=baseline]" in plan_of(merged.stdout), "the flag is what keeps the default runs out"


def computed_on(plan: str) -> dict[str, set[tuple[str, str]]]:
    """rule -> {(the --device of its command, the GPUs its job books)} over a dry run's jobs; '-' where none."""
    found: dict[str, set[tuple[str, str]]] = {}
    rule, gpus = "", "-"
    for line in plan.splitlines():
        if header := JOB_HEADER.match(line):
            rule, gpus = header.group(1), "-"
        elif line.strip().startswith("resources: "):
            gpus = booked.group(1) if (booked := re.search(r"\bgpu=(\d+)", line)) else "-"
        elif line.startswith("Shell command: "):
            device = re.search(r" --device (\S+)", line)
            found.setdefault(rule, set()).add((device.group(1) if device else "-", gpus))
    return found


def test_a_slurm_gpu_rule_that_books_no_gpu_is_refused_while_planning(default_checkout: Path, tmp_path: Path):
    """Issue 34: with `device: cuda`, a GPU rule whose job books no GPU would wait in the queue only to fail on its
    node; the plan is refused in one line (the submitting host's own lack of a GPU is no reason); its Fix plans."""
    profile = tmp_path / "slurm"
    shutil.copytree(default_checkout / "profiles" / "slurm", profile)
    shipped = (profile / "config.yaml").read_text()
    unbooked = shipped.replace("train_epoch: {slurm_partition: gpu, gpu: 1, ", "train_epoch: {slurm_partition: gpu, ")
    assert unbooked != shipped
    (profile / "config.yaml").write_text(unbooked)
    env = user_env(tmp_path / "home")
    refused = run(["snakemake", "--profile", str(profile), *RECIPE], default_checkout, env)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr and not plan_of(refused.stdout)
    [line] = [line for line in refused.stderr.splitlines() if "book no GPU" in line]
    assert line == (
        "rffm: train_epoch (device cuda): their SLURM jobs book no GPU (no gpu, gpu_model or gres resource), so they would "
        "run on nodes without one. Fix: book one GPU each in the profile's set-resources (train_epoch: {gpu: 1}), as "
        "profiles/slurm/config.yaml does, or compute on the CPU: `device: cpu` under the profile's config:"
    )
    # the Fix's second way, literally (the first is the shipped profile, which plans: test_the_tiny_recipe_plans_only_the_tiny_run)
    (profile / "config.yaml").write_text(unbooked.replace("\n  device: cuda #", "\n  device: cpu #"))
    fixed = run(["snakemake", "--profile", str(profile), *RECIPE], default_checkout, env)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert plan_of(fixed.stdout) == TINY_JOBS and computed_on(fixed.stdout)["train_epoch"] == {("cpu", "-")}


@pytest.mark.parametrize(
    ("resources", "books"),
    [
        ({"gpu": 1}, True),
        ({"gpu": 0}, False),
        ({"gpu_model": "a100"}, True),
        ({"gres": "gpu:a100:1"}, True),
        ({"gres": "tmpdisk:100"}, False),
        ({"slurm_extra": "'--gpus=2 --qos=high'"}, True),
        ({"slurm_extra": "--gres=gpu:1"}, True),
        ({"slurm_extra": "-G 1"}, True),
        ({"slurm_extra": "--qos=high", "slurm_partition": "gpu"}, False),  # a partition's name books nothing
        ({}, False),
    ],
)
def test_what_books_a_gpu_on_slurm(resources: dict, books: bool):
    """The ways snakemake-executor-plugin-slurm (and sbatch itself, through slurm_extra) book a GPU for a job."""
    from rffm.plan.planning import books_gpu

    assert books_gpu(resources) is books
