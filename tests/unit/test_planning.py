"""rffm.plan.planning: the co-location note's GPUs, read from a command line and a profile as a cluster run books them
(issue 36; the notes of a real dry run: tests/executors/test_colocation.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from conftest import REPO, grid_config
from rffm.plan import planning

HEAD = "note: plan: cache tiny__mini: "


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
    assert planning.colocation_lines(grid_config(colocate), booking_of(monkeypatch, profile, *argv)) == [HEAD + line]


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
    assert planning.colocation_lines(grid_config("per-cache"), unknown) == [
        HEAD + "1 cache build, 3 runs, 7 epochs in one group job (cache_tiny__mini: one VM or node; cache.colocate: per-cache)"
    ]
