"""records/layout: the results tree a step folder lies in."""

from __future__ import annotations

from pathlib import Path

from conftest import tiny_config
from rffm.config import check
from rffm.records import layout


def test_every_planned_step_folder_lies_in_its_results_tree(tmp_path: Path):
    config = tiny_config()
    train = {"epochs": 2, "lr": 0.01, "batch_size": 16, "seed": 0}
    config["references"] = {"cnn": {"dataset": "tiny", "model": {"width": 8, "blocks": 2}, "train": train}}
    check(config)
    results = tmp_path / "runs" / "results"  # a `runs` folder above the tree is not its runs/
    folders = layout.planned_steps(config)
    assert {layout.COMPARISON_FOLDER, layout.report_folder("base", "validation")} <= folders
    assert {folder: layout.results_root(results / folder) for folder in folders} == dict.fromkeys(folders, results)
    assert layout.results_root(tmp_path / "elsewhere") is None
