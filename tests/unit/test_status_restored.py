"""`rffm status`'s `restored from memo` column (issue 50): an epoch the memo restored reads as "epoch N", not as a count,
and a sweep epoch whose members the memo restored in part says how many of its members were restored."""

from __future__ import annotations

import re
from pathlib import Path

from cached_tiny import build_cache

from conftest import train_one_epoch
from rffm.ops import status
from rffm.training import sweep

PLAIN = {"run": "r", "dataset": "t", "backbone": "b", "train": {"lr": 0.01, "batch_size": 8, "seed": 0}}
SMALL = {**PLAIN, "sweep": [["train.lr", [0.003, 0.01]]]}
GROWN = {**PLAIN, "sweep": [["train.lr", [0.003, 0.01, 0.03]]]}


def column(shown: str, name: str) -> dict[str, str]:
    """The cells of one column of the printed table, by run (cells split on runs of 2+ spaces)."""
    lines = shown.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    cells = [re.split(r"\s{2,}", line) for line in lines[1:]]
    rows = [dict(zip(header, row, strict=True)) for row in cells if len(row) == len(header)]
    return {row["run"]: row[name] for row in rows}


def test_restored_epochs_and_sweep_members_are_named_not_counted(tmp_path: Path):
    record = build_cache(tmp_path)
    results, memo = tmp_path / "results", tmp_path / "memo"

    def first_epoch(spec: dict, run: str) -> None:
        train_one_epoch(spec, record, 1, None, results / f"runs/{run}/epochs/1", tmp_path / "scratch", memo_store=memo)

    first_epoch(SMALL, "small")  # trained: both members kept in the memo
    first_epoch(GROWN, "grown")  # a grown grid: its two old members restored, the new one trained
    first_epoch(sweep.member_spec(GROWN, sweep.members(GROWN)[2]), "plain")  # the new member as a plain run: restored whole
    rows = {row["run"]: row for row in status.collect(results)}
    assert (rows["small"]["restored_epochs"], rows["small"]["restored_members"]) == ([], [])
    assert rows["grown"]["restored_epochs"] == []
    assert rows["grown"]["restored_members"] == [{"epoch": 1, "members": ["lr=0.003", "lr=0.01"], "of": 3}]
    assert (rows["plain"]["restored_epochs"], rows["plain"]["restored_members"]) == ([1], [])
    shown = status.render(list(rows.values()))
    assert column(shown, "restored from memo") == {"small": "-", "grown": "epoch 1: 2 of 3 members", "plain": "epoch 1"}


def test_the_restored_cell_spans_consecutive_epochs():
    row = {"restored_epochs": [1, 2, 3, 5], "restored_members": [{"epoch": 6, "members": ["a"], "of": 2}]}
    assert status.restored_words(row) == "epochs 1-3,5; epoch 6: 1 of 2 members"
    assert status.restored_words({"restored_epochs": [2]}) == "epoch 2"
    assert status.restored_words({"restored_epochs": []}) == "-"
