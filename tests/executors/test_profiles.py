"""The literal commands: `snakemake --profile gcp-batch|slurm` find this checkout's profiles by name
(after `rffm install_profiles`, which `make setup` runs), and the tiny-config recipe plans only the tiny run.

Every command runs in a temporary HOME (Snakemake looks profile names up in the current directory, then
in $XDG_CONFIG_HOME/snakemake, default ~/.config/snakemake, then the site config directory); the Google
Cloud profile reads its bucket from a local GCS emulator.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from batch_support import create_bucket, gcs_emulator, make_checkout, profile_env

from conftest import BIN, REPO, plan_of

TINY_JOBS = sorted(
    ["stage_dataset[dataset=tiny]", "pretrain_backbone[backbone=mini]", "build_cache[dataset=tiny, backbone=mini]"]
    + [f"train_epoch[run=base, epoch={e}]" for e in (1, 2, 3)]
    + ["select_checkpoint[run=base]", "qualify[run=base]", "plot_training[run=base]", "summarize_manifest[run=base]"]
    + ["summarize_profiling[run=base]", "plot_cache_lifecycle[run=base]", "export[run=base]"]
)
RECIPE = ("--configfile", "config/examples/tiny.yaml", "--replace-workflow-config", "-n")


@pytest.fixture(scope="module")
def emulator():
    with gcs_emulator() as url:
        yield url


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment with a fresh HOME (no XDG_CONFIG_HOME, nothing of rffm's or Snakemake's set)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("RFFM_", "SNAKEMAKE_", "XDG_", "STORAGE_EMULATOR"))}
    return {**environ, "HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **extra}


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def gcp_env(home: Path, emulator: str, bucket: str) -> dict[str, str]:
    """What the Google Cloud setup in profiles/README.md leaves: the profile's variables, credentials (here: the emulator), a bucket."""
    create_bucket(emulator, bucket)
    return user_env(home, STORAGE_EMULATOR_HOST=emulator, **profile_env(bucket))


def test_install_profiles_links_is_idempotent_and_refuses_to_replace(tmp_path: Path):
    from rffm.errors import RffmError
    from rffm.ops.profiles import install_profiles

    target = tmp_path / "config" / "snakemake"
    first = install_profiles(REPO, target)
    assert first == [f"{target / n} -> {REPO / 'profiles' / n}: linked" for n in ("gcp-batch", "slurm")]
    assert (target / "gcp-batch" / "config.yaml").read_bytes() == (REPO / "profiles/gcp-batch/config.yaml").read_bytes()
    assert install_profiles(REPO, target) == [line.replace(": linked", ": already linked") for line in first]

    other = tmp_path / "other"
    (target / "gcp-batch").unlink()
    (target / "gcp-batch").mkdir()  # a site's own profile of that name
    (target / "slurm").unlink()
    with pytest.raises(RffmError) as refused:
        install_profiles(REPO, target)
    assert str(refused.value).count("Fix:") == 1 and "\n" not in str(refused.value)
    assert f"{target / 'gcp-batch'} is a directory" in str(refused.value)
    assert not (target / "slurm").exists(), "nothing is linked when any name is refused"
    (target / "gcp-batch").rmdir()
    (target / "gcp-batch").symlink_to(other)
    with pytest.raises(RffmError, match=f"is a link to {other}"):
        install_profiles(REPO, target)


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
    assert "Config file config/config.yaml is replaced" in recipe.stdout + recipe.stderr

    merged = run(["snakemake", *profile_args, *RECIPE[:2], "-n"], default_checkout, env)  # without --replace-workflow-config
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert "select_checkpoint[run=baseline]" in plan_of(merged.stdout), "the flag is what keeps the default runs out"
