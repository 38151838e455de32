"""`rffm compare` as evidence (issue 37): the exposure flag under the table, the tuning budget columns and each row's
paired difference to the floor and the end-to-end reference, from the per-example correctness qualification records.

The flag is tested on a copy of the finished tiny tree with two more qualifications claimed in its ledger; the budget
and the paired differences on the session's tree of one qualified run of every kind (conftest `matrix_tree`, read only).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import copy_workdir
from rffm.cli import main
from rffm.model.metrics import CORRECT_KEY, VAL_CORRECT_KEY, unpack_correct
from rffm.ops import compare, pairing, status
from rffm.records import ledger
from rffm.records.store import PosixStore

pytestmark = pytest.mark.workflow

FLAG = "test split of tiny: this split was used for 3 qualifications, 1 shown: figures on it are optimistic (not shown: second, third)"


def test_a_split_used_by_more_qualifications_than_shown_is_flagged_is_fixed_by_counting_the_ledger(
    finished_workdir: Path, tmp_path: Path, capsys
):
    """Acceptance 2: three qualifications on the tiny test split, the table showing one: one line under the table says
    so; once the other two are in the table too, no line."""
    results = copy_workdir(finished_workdir, tmp_path / "work") / "results"
    split = json.loads((results / "runs/base/qualification/run_manifest.json").read_text())["dataset"]["splits"]["test.h5"]
    for run, artifact in (("second", "b" * 64), ("third", "c" * 64)):  # two more looks at the same test data
        entry = {"schema_version": 1, "split_digest": split, "dataset": "tiny", "run": run, "artifact_sha256": artifact}
        ledger.claim(PosixStore(results), {**entry, "metrics": {}, "selection_source": {}})

    assert main(["compare", str(results)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[3] for line in lines[1:2]] == ["base"] and lines[2] == FLAG
    assert compare.collect(results)[0]["split_qualifications"] == ["base", "second", "third"]  # the JSON rows' key

    for run in ("second", "third"):  # their qualifications in the tree: shown (runs no plan speaks for are)
        shutil.copytree(results / "runs/base/qualification", results / f"runs/{run}/qualification")
    assert main(["compare", str(results)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[3] for line in lines[1:4]] == ["base", "second", "third"]
    assert lines[4].startswith("step time:") and not any("figures on it are optimistic" in line for line in lines)


def test_the_paired_se_of_a_difference_is_mcnemars():
    """sqrt((b + c) - (b - c)^2 / n) / n with b, c the discordant counts: here b = 2, c = 1, n = 5."""
    mine, theirs = np.array([1, 1, 0, 0, 1], bool), np.array([1, 0, 1, 0, 0], bool)
    paired = compare.paired_se(mine, theirs)
    assert paired["discordant"] == [2, 1] and paired["n"] == 5 and paired["difference"] == pytest.approx(0.2)
    assert paired["se"] == pytest.approx(math.sqrt(3 - 1 / 5) / 5)
    assert compare.difference_text({**paired, "run": "x"}) == "+0.200 ± 0.335"


def test_an_unequal_comparison_is_visible_in_the_table_is_fixed_by_budget_and_paired_columns(matrix_tree: Path):
    """Every kind of run qualified on the tiny split: members tried on val and optimizer steps per row, and each row's
    difference to the floor and to the CNN with its paired SE, from the per-example correctness each qualification records."""
    results = matrix_tree / "results"
    rows = {r["run"]: r for r in compare.collect(results)}
    # tiny: 64 train rows at batch 16 = 4 steps an epoch; base 3 epochs, the other heads 1, the CNN 2; scarce: 2 per
    # (class, SNR) = 16 rows
    budget = {run: (r["members"], r["optimizer_steps"], r["optimizer_steps_computed"]) for run, r in rows.items()}
    assert budget["base"] == (1, 12, False) and budget["floor"] == (1, 4, False) and budget["sweep"] == (2, 4, False)
    assert budget["scarce"] == (1, 1, False) and budget["cnn"] == (1, 8, True)

    for run, r in rows.items():  # the record: one bit per test example, as many right as the accuracy says
        metrics = json.loads((results / f"runs/{run}/qualification/metrics.json").read_text())
        assert unpack_correct(metrics[CORRECT_KEY], metrics["count"]).mean() == pytest.approx(r["accuracy"]), run
    assert rows["floor"]["vs_floor"] is None and rows["cnn"]["vs_end_to_end"] is None and rows["scarce"]["vs_floor"] is None
    for run in ("base", "sweep", "waves", "cnn"):
        paired = rows[run]["vs_floor"]
        assert paired["run"] == "floor" and paired["n"] == 32
        assert paired["difference"] == pytest.approx(rows[run]["accuracy"] - rows["floor"]["accuracy"])
        b, c = paired["discordant"]
        assert paired["se"] == pytest.approx(math.sqrt((b + c) - (b - c) ** 2 / 32) / 32)
    assert rows["base"]["vs_end_to_end"]["run"] == "cnn" and rows["base"]["vs_end_to_end"]["se"] is not None

    text = compare.render(list(rows.values()), compare.seed_groups(list(rows.values()), results))
    header = text.splitlines()[0]
    for column in ("vs floor ± paired SE", "vs strongest reference ± paired SE", "val members", "optimizer steps (* computed)"):
        assert column in header
    cnn = next(line for line in text.splitlines() if line.split()[1:3] == ["end-to-end", "cnn*"])
    assert " 8* " in cnn and compare.difference_text(rows["cnn"]["vs_floor"]) in cnn
    assert "figures on it are optimistic" not in text  # every qualification on the split is shown


def test_a_design_compared_on_val_carries_its_paired_se_in_status_and_compare(matrix_tree: Path):
    """Issue 48 (design on val): each selected result's per-example val correctness is recorded (as many right as its
    selected val accuracy says); `rffm status` gives every selected row its paired val difference to the val leader
    of its data set, and `rffm compare` each group its val difference to the strongest reference, both with McNemar's
    SE from those records."""
    results = matrix_tree / "results"
    rows = {r["run"]: r for r in status.collect(results)}
    selected = {run: r for run, r in rows.items() if r.get("selected_epoch") is not None}
    correct = {run: pairing.val_correctness(results / "runs" / run) for run in selected}
    assert {"base", "floor", "sweep", "cnn"} <= set(selected)
    for run, vector in correct.items():
        assert vector is not None and vector.mean() == pytest.approx(
            compare.chosen_val_accuracy(
                results / "runs" / run, json.loads((results / f"runs/{run}/qualification/run_manifest.json").read_text())
            )
        ), run
    by_size: dict[int, list[str]] = {}
    for run, vector in correct.items():
        by_size.setdefault(len(vector), []).append(run)
    for runs in by_size.values():
        leader = max(runs, key=lambda run: correct[run].mean())  # ties: either may lead, both then differ by 0
        assert sum(bool(selected[run]["val_leader"]) for run in runs) == 1
        for run in runs:
            pair = selected[run]["val_vs_leader"]
            if selected[run]["val_leader"]:
                assert pair is None and correct[run].mean() == correct[leader].mean()
                continue
            b, c = pair["discordant"]
            n = len(correct[run])
            assert pair["difference"] == pytest.approx(correct[run].mean() - correct[pair["run"]].mean())
            assert pair["se"] == pytest.approx(math.sqrt((b + c) - (b - c) ** 2 / n) / n) and pair["difference"] <= 0
    assert "val vs leader ± paired SE" in status.render(list(rows.values())).splitlines()[0]
    # the record grows with the val split: in the epoch's metrics.json (vouched for by digest), not its sentinel
    epoch = results / "runs/base/epochs/1"
    assert VAL_CORRECT_KEY in json.loads((epoch / "metrics.json").read_text())
    assert VAL_CORRECT_KEY not in json.loads((epoch / "sentinel.json").read_text())["metrics"]

    compared = compare.collect(results)
    groups = {g["group"]: g for g in compare.seed_groups(compared, results)}
    val = groups["base"]["val_vs_end_to_end"]
    assert val["group"] == "cnn" and val["se"] is not None and val["n"] == len(correct["base"])
    assert val["difference"] == pytest.approx(correct["base"].mean() - correct["cnn"].mean())
    assert groups["cnn"]["val_vs_end_to_end"] is None  # the strongest reference itself
    assert "val: vs strongest ± paired SE" in compare.render(compared, list(groups.values())).splitlines()[0]
