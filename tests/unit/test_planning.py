"""rffm.plan.planning: the co-location note's GPUs, read from a command line and a profile as a cluster run books them
(issue 36; the notes of a real dry run: tests/executors/test_colocation.py)."""

from __future__ import annotations

from types import SimpleNamespace

import immutables
import pytest
import yaml
from snakemake.settings.types import GroupSettings

from conftest import REPO, grid_config
from rffm import config as rffm_config
from rffm.plan import planning

HEAD = "note: plan: cache tiny__mini: "


def filled(config: dict) -> dict:
    """A config with the schema's defaults, as the workflow sees it."""
    schema = rffm_config.load_schema()
    rffm_config.fill_defaults(config, schema, schema)
    return config


def study(runs: int, runs_per_group: int | None = None, colocate: str = "per-cache") -> dict:
    """The grid's `base` run copied `runs` times (r1 .. rN) on its one cache, 2 epochs each."""
    config = grid_config(colocate)
    base = config["runs"]["base"]
    config["runs"] = {f"r{i}": {**base, "train": {**base["train"], "epochs": 2, "seed": i}} for i in range(1, runs + 1)}
    if runs_per_group:
        config["cache"]["runs_per_group"] = runs_per_group
    return filled(config)


def test_a_cache_of_five_runs_two_per_group_is_three_group_jobs_the_first_with_its_build():
    """Issue 47: no group grows with the study; a cache R runs read is built by ceil(R / runs_per_group) group jobs."""
    placed = planning.colocation(study(5, runs_per_group=2))
    assert placed.builds == {("tiny", "mini"): "cache_tiny__mini"}
    assert placed.epochs == {
        "r1": "cache_tiny__mini", "r2": "cache_tiny__mini",
        "r3": "cache_tiny__mini__part2", "r4": "cache_tiny__mini__part2",
        "r5": "cache_tiny__mini__part3",
    }  # fmt: skip
    assert planning.colocation_lines(study(5, runs_per_group=2)) == [
        HEAD + "3 cache builds, 5 runs x 2 epochs in 3 group jobs of at most 2 runs (cache.runs_per_group: 2; "
        "cache_tiny__mini builds the cache, each other group job builds its own copy on its VM or node once that one ends; "
        "cache.colocate: per-cache)"
    ]


@pytest.mark.parametrize("runs", [1, 8, 9, 1000])
def test_every_group_holds_at_most_runs_per_group_runs_and_per_run_one(runs: int):
    """The default bound (8) at any study size; per-run: each run its own group, the build its own job."""
    placed = planning.colocation(study(runs))
    sizes: dict[str, int] = {}
    for group in placed.epochs.values():
        sizes[group] = sizes.get(group, 0) + 1
    assert len(sizes) == -(-runs // 8) and max(sizes.values()) == min(runs, 8)
    per_run = planning.colocation(study(runs, colocate="per-run"))
    assert sorted(per_run.epochs.values()) == sorted(f"train_r{i}" for i in range(1, runs + 1))
    assert per_run.builds[("tiny", "mini")] == ("train_r1" if runs == 1 else "cache_tiny__mini")


def booking_of(monkeypatch: pytest.MonkeyPatch, profile: str, *argv: str) -> planning.GpuBooking | None:
    """gpu_booking for `snakemake --profile profiles/<profile> <argv>`: the profile's set-resources as Snakemake hands
    them to the workflow, the command line as Snakemake parsed it."""
    from snakemake import cli

    profile, _, machine = profile.partition("+")
    settings = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
    for rule in ("build_cache", "train_epoch") if machine else ():  # a VM of N GPUs: the machine type alone (profiles/README.md)
        settings["set-resources"][rule] = {"googlebatch_machine_type": machine}
    args = cli.get_argument_parser().parse_args(["--executor", settings["executor"], *argv])
    resources = SimpleNamespace(overwrite_resources=settings["set-resources"])
    workflow = SimpleNamespace(main_snakefile="workflow/Snakefile", resource_settings=resources)
    monkeypatch.setattr(planning, "command_line", lambda *_, **__: args)
    return planning.gpu_booking(workflow, {"epoch_threads": 1})


@pytest.mark.parametrize(
    ("profile", "argv", "colocate", "line"),
    [
        (
            "slurm",
            (),
            "per-cache",
            "1 cache build, 3 runs, 7 epochs in one group job holding 3 GPUs (cache_tiny__mini: one VM or node; cache.colocate: per-cache)",
        ),
        (
            "slurm",
            ("--cores", "2"),
            "per-cache",
            "1 cache build, 3 runs, 7 epochs in one group job holding 2 GPUs, 2 epochs at once "
            "(cache_tiny__mini: one VM or node; cache.colocate: per-cache)",
        ),
        (
            "slurm",
            ("--resources", "gpu=1"),
            "per-cache",
            "1 cache build, 3 runs, 7 epochs in one group job holding 1 GPU, 1 epoch at "
            "once (cache_tiny__mini: one VM or node; cache.colocate: per-cache)",
        ),
        (
            "slurm",
            (),
            "per-run",
            "4 cache builds (its own job and one on each run's node), 3 runs, 7 epochs in 3 group jobs, each "
            "holding 1 GPU (cache.colocate: per-run)",
        ),
        (
            "gcp-batch",
            (),
            "per-cache",
            "1 cache build, 3 runs, 7 epochs in one group job holding 1 GPU (nvidia_gpu: one nvidia-l4 per "
            "VM) (cache_tiny__mini: one VM or node; cache.colocate: per-cache)",
        ),
        (
            "gcp-batch+g2-standard-48",
            (),
            "per-cache",
            "1 cache build, 3 runs, 7 epochs in one group job holding 4 GPUs (g2-standard-48: 4 per VM) "
            "(cache_tiny__mini: one VM or node; cache.colocate: per-cache)",
        ),
    ],
)
def test_the_colocation_note_says_the_gpus_each_group_job_holds(monkeypatch, profile: str, argv: tuple[str, ...], colocate: str, line: str):
    """Snakemake books a group job its widest layer (every run's epoch k at once, as --cores and --resources allow) on
    SLURM; on Google Batch nvidia_gpu names one accelerator per VM (a string resource is never summed)."""
    assert planning.colocation_lines(filled(grid_config(colocate)), booking_of(monkeypatch, profile, *argv)) == [HEAD + line]


@pytest.mark.parametrize(
    ("resources", "executor", "booked"),
    [
        ({"gpu": 2}, "slurm", (2, "")),
        ({"gres": "gpu:a100:1"}, "slurm", (None, "")),  # booked, but not as a count the plan reads
        ({"mem_mb": 4000}, "slurm", (0, "")),
        ({"nvidia_gpu": "nvidia-l4"}, "rffm-googlebatch", (1, "nvidia_gpu: one nvidia-l4 per VM")),
        ({"nvidia_gpu": 4}, "rffm-googlebatch", (4, "")),  # a count: summed over the group's layer, as on SLURM
        ({"googlebatch_machine_type": "g2-standard-48"}, "rffm-googlebatch", (4, "g2-standard-48: 4 per VM")),  # its own L4s
        ({"googlebatch_machine_type": "a2-highgpu-2g"}, "rffm-googlebatch", (2, "a2-highgpu-2g: 2 per VM")),
        ({"googlebatch_machine_type": "n1-standard-8"}, "rffm-googlebatch", (None, "")),  # GPUs of its own: not known here
        ({"googlebatch_machine_type": "e2-standard-4"}, "rffm-googlebatch", (None, "")),
        ({}, "rffm-googlebatch", (0, "")),
        ({"gpu": 1}, None, (None, "")),
    ],
)
def test_what_one_job_books(resources: dict, executor: str | None, booked: tuple):
    assert planning.booked_count(resources, executor) == booked


def test_a_gpu_count_the_plan_cannot_read_says_nothing_of_gpus():
    unknown = planning.GpuBooking(build=None, epoch=1)
    assert planning.colocation_lines(filled(grid_config("per-cache")), unknown) == [
        HEAD + "1 cache build, 3 runs, 7 epochs in one group job (cache_tiny__mini: one VM or node; cache.colocate: per-cache)"
    ]


def test_each_part_without_the_build_is_kept_one_group_job_of_its_runs():
    """Issue 47: a later part's runs share no job (their epochs chains are unconnected components), which Snakemake
    would submit one job each; the part's group gets as many components as it has runs (--group-components), the user's
    own setting kept; a part of one run and per-run groups need none."""
    placed = planning.colocation(study(5, runs_per_group=2))
    assert planning.part_groups(placed) == {"cache_tiny__mini__part2": 2}
    assert planning.part_groups(planning.colocation(study(5, colocate="per-run"))) == {}

    class Workflow:
        group_settings = GroupSettings(group_components=immutables.Map({"mine": 3, "cache_tiny__mini__part2": 4}))

    planning.keep_parts_whole(Workflow, planning.part_groups(placed))
    assert dict(Workflow.group_settings.group_components) == {"cache_tiny__mini__part2": 4, "mine": 3}  # the user's wins
    Workflow.group_settings = GroupSettings()  # Snakemake's own, from the command line: set once more
    planning.keep_parts_whole(Workflow, planning.part_groups(placed))
    assert dict(Workflow.group_settings.group_components) == {"cache_tiny__mini__part2": 2}
