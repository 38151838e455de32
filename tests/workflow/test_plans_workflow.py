"""The tree knows which configs planned it (issue 25): status, verify, compare and prune judge it by the plan
records the workflow wrote when it started, and every printed Fix works when followed literally."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO, snakemake, tiny_config, write_config

pytestmark = pytest.mark.workflow
RUN = Path("results/runs/base")


def rffm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rffm"), *args], cwd=cwd, capture_output=True, text=True)


def rows(status: str) -> dict[str, list[str]]:
    """The status table's rows by run (cells split on runs of 2+ spaces)."""
    lines = status.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    width = len(re.split(r"\s{2,}", lines[header]))
    table = [re.split(r"\s{2,}", line) for line in lines[header + 1 :]]
    return {cells[0]: cells for cells in table if len(cells) == width}


def with_default_config(workdir: Path) -> Path:
    """The checkout's config/config.yaml beside the tree, as after the tiny recipe in a checkout (its `results` is this tree)."""
    (workdir / "config").mkdir(exist_ok=True)
    shutil.copy(REPO / "config/config.yaml", workdir / "config/config.yaml")
    return workdir


def test_the_workflow_records_what_planned_each_run_once_per_change(selected_workdir: Path):
    workdir = selected_workdir  # not qualified: its epochs may change
    record = json.loads((workdir / RUN / "launch/plan-1.json").read_text())
    assert record["run"] == "base" and record["plan"]["runs"]["base"]["train"]["epochs"] == 3
    assert [f["path"] for f in record["files"]] == ["config.yaml"]  # as read in the workflow's directory
    assert set(record["plan"]["datasets"]) == {"tiny"} and set(record["plan"]["backbones"]) == {"mini"}
    snakemake(workdir, "validation_selection")  # the same plan again: no new record
    assert sorted(p.name for p in (workdir / RUN / "launch").glob("plan-*.json")) == ["plan-1.json"]
    config = tiny_config()
    config["runs"]["base"]["train"]["epochs"] = 4
    write_config(workdir, config)
    snakemake(workdir, "validation_selection")
    second = json.loads((workdir / RUN / "launch/plan-2.json").read_text())
    assert second["plan"]["runs"]["base"]["train"]["epochs"] == 4
    assert json.loads((workdir / RUN / "launch/plan-1.json").read_text()) == record  # create-only: the first is kept


def test_bare_commands_judge_the_tree_by_its_records_not_config_yaml(workdir: Path):
    """Acceptance 1: after the tiny recipe in a checkout whose config/config.yaml plans `baseline`, the bare
    commands report the tiny run as qualified, clean and not stale, and prune deletes nothing."""
    with_default_config(workdir)
    status = rffm("status", cwd=workdir)
    assert status.returncode == 0, status.stderr
    table = rows(status.stdout)
    assert set(table) == {"base"} and table["base"][1:3] == ["qualified", "3/3"], status.stdout
    assert "stale" not in status.stdout and "BROKEN" not in status.stdout
    verify = rffm("verify", "results", cwd=workdir)
    assert verify.returncode == 0 and "STALE" not in verify.stdout and "0 problem(s), 0 stale" in verify.stdout, verify.stdout
    compare = rffm("compare", "results", cwd=workdir)
    assert compare.returncode == 0 and re.search(r"^all\s+frozen backbone\s+base\s", compare.stdout, re.M), compare.stdout
    before = sorted(p.relative_to(workdir) for p in (workdir / "results").rglob("*"))
    prune = rffm("prune", "results", "--delete", cwd=workdir)
    assert prune.returncode == 0 and "nothing stale" in prune.stdout, prune.stdout
    assert sorted(p.relative_to(workdir) for p in (workdir / "results").rglob("*")) == before


def test_a_given_config_that_contradicts_the_record_is_named_in_one_line(workdir: Path):
    with_default_config(workdir)
    status = rffm("status", "results", "--config", "config/config.yaml", cwd=workdir)
    notes = [line for line in status.stdout.splitlines() if line.startswith("note: plan:")]
    assert len(notes) == 1 and "runs base" in notes[0] and "--by-config" in notes[0], status.stdout
    table = rows(status.stdout)
    assert table["base"][1] == "qualified" and table["baseline"][1] == "pending"  # base judged by its record
    by_config = rffm("status", "results", "--config", "config/config.yaml", "--by-config", cwd=workdir)
    assert "stale: runs/base" in by_config.stdout and "note: plan:" not in by_config.stdout


def test_prune_deletes_a_qualified_run_only_when_it_is_named(workdir: Path):
    config = tiny_config()
    config["runs"]["extra"] = {**config["runs"]["base"], "train": {**config["runs"]["base"]["train"], "seed": 1}}
    config["runs"]["extra"].pop("profiling")
    write_config(workdir, config)
    snakemake(workdir)
    write_config(workdir, tiny_config())  # extra removed from the config
    judged = ("results", "--config", "config.yaml", "--by-config")
    listed = rffm("prune", *judged, cwd=workdir)
    assert "stale results/runs/extra/qualification" in listed.stdout
    fix = next(line for line in listed.stdout.splitlines() if line.startswith("kept runs/extra: qualified"))
    removed = rffm("prune", *judged, "--delete", cwd=workdir)
    assert (workdir / "results/runs/extra/qualification/sentinel.json").exists(), removed.stdout
    assert "kept runs/extra" in removed.stdout
    command = fix.split("Fix: ", 1)[1]
    assert command == "rffm prune results --config config.yaml --by-config --delete --delete-qualified extra"
    subprocess.run(["bash", "-c", command], cwd=workdir, env=env(), check=True, capture_output=True)
    assert not (workdir / "results/runs/extra/qualification").exists()
    assert rffm("verify", *judged, cwd=workdir).returncode == 0


def env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RFFM_PLAIN_PROGRESS": "1"}


def fix_of(line: str) -> str:
    return line.split("Fix: ", 1)[1].removesuffix(".")


def test_the_fix_for_a_missing_sentinel_works_as_printed(workdir: Path):
    """Acceptance 2: verify names the command that rebuilds a deleted sentinel; following it literally, from the
    workflow's directory and from elsewhere, leaves verify clean."""
    (workdir / RUN / "epochs/2/sentinel.json").unlink()
    verify = rffm("verify", "results", cwd=workdir)
    missing = [line for line in verify.stdout.splitlines() if "epochs/2/sentinel.json: missing" in line]
    assert verify.returncode == 1 and len(missing) == 1, verify.stdout
    command = fix_of(missing[0])
    target = "results/runs/base/epochs/2/sentinel.json"
    assert command == f"snakemake -s {REPO}/workflow/Snakefile {target} --cores all --configfile config.yaml", command
    done = subprocess.run(["bash", "-c", command], cwd=workdir, env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert rffm("verify", "results", cwd=workdir).returncode == 0

    (workdir / RUN / "selection/sentinel.json").unlink()  # now from another directory: the command starts with cd
    elsewhere = workdir.parent
    verify = rffm("verify", str(workdir / "results"), cwd=elsewhere)
    command = fix_of(next(line for line in verify.stdout.splitlines() if "selection/sentinel.json: missing" in line))
    assert command.startswith(f"cd {workdir} && snakemake -s {REPO}/workflow/Snakefile results/runs/base/selection/sentinel.json")
    assert subprocess.run(["bash", "-c", command], cwd=elsewhere, env=env(), capture_output=True).returncode == 0
    assert rffm("verify", "results", cwd=workdir).returncode == 0


def test_the_fix_for_a_damaged_file_works_as_printed(workdir: Path):
    """A damaged output: verify's line ends with the command that replaces it; followed literally, verify is clean."""
    metrics = workdir / RUN / "epochs/1/metrics.json"
    metrics.write_text(metrics.read_text().replace('"epoch"', '"epoch" ', 1))
    verify = rffm("verify", "results", cwd=workdir)
    damaged = [line for line in verify.stdout.splitlines() if line.startswith(f"BROKEN {metrics.relative_to(workdir)}")]
    assert verify.returncode == 1 and len(damaged) == 1, verify.stdout
    command = fix_of(damaged[0])
    target = "results/runs/base/epochs/1/sentinel.json"
    assert command.startswith(f"rm -f {target} && snakemake -s {REPO}/workflow/Snakefile {target}"), command
    done = subprocess.run(["bash", "-c", command], cwd=workdir, env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    after = rffm("verify", "results", cwd=workdir)
    assert after.returncode == 0, after.stdout


def test_status_full_and_verify_agree_on_a_damaged_backbone_and_a_missing_artifact(workdir: Path):
    """Acceptance 3."""
    backbone = workdir / "results/backbones/mini/backbone.pt"
    data = bytearray(backbone.read_bytes())
    data[len(data) // 2] ^= 0xFF
    backbone.chmod(0o644)
    backbone.write_bytes(bytes(data))
    selection = json.loads((workdir / RUN / "selection/selection.json").read_text())
    artifact = workdir / "results" / selection["artifact_path"]
    artifact.unlink()
    verify = rffm("verify", "results", cwd=workdir)
    status = rffm("status", "results", "--full", cwd=workdir)
    assert rows(status.stdout)["base"][-1].startswith("BROKEN"), status.stdout
    for output in (verify.stdout, status.stdout):
        broken = [line.removeprefix("BROKEN ").split(": ")[0] for line in output.splitlines() if line.startswith("BROKEN")]
        assert any(Path(workdir / p).resolve() == backbone.resolve() for p in broken), output
        assert any(Path(workdir / p).resolve() == artifact.resolve() for p in broken), output


def test_after_a_floor_run_the_bare_compare_prints_all_three_rows(workdir: Path):
    """Acceptance 1, the `make floor` half: a random-backbone floor and an end-to-end reference beside the run."""
    config = tiny_config()
    config["backbones"]["random-init"] = {**config["backbones"]["mini"], "source": "random", "pretrain": {"seed": 0}}
    config["runs"]["floor"] = {**config["runs"]["base"], "backbone": "random-init"}
    config["runs"]["floor"].pop("profiling")
    train = {"epochs": 2, "lr": 0.01, "batch_size": 16, "seed": 0}
    config["references"] = {"cnn": {"dataset": "tiny", "model": {"width": 8, "blocks": 2}, "train": train}}
    write_config(workdir, config)
    snakemake(workdir)
    with_default_config(workdir)  # config/config.yaml plans `baseline` only: the records decide
    compare = rffm("compare", "results", cwd=workdir)
    rows = [line.split()[1:4] for line in compare.stdout.splitlines()[1:4]]  # after the labels column (all)
    assert rows == [["floor", "floor", "1"], ["frozen", "backbone", "base"], ["end-to-end", "cnn*", "1"]], compare.stdout  # 1 seed each


def tree_bytes(results: Path, leaving_out: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Every file of a results tree but the logs and provenance records (where and when, not what), by path."""
    files = {p.relative_to(results).as_posix(): p for p in sorted(results.rglob("*")) if p.is_file()}
    return {
        name: path.read_bytes()
        for name, path in files.items()
        if not name.startswith(("logs/", *leaving_out)) and path.name != "provenance.json"
    }


def replace_with_epoch_1(epoch_dir: Path) -> None:
    """Epoch 2's folder holding epoch 1's files, as after copying the wrong folder back."""
    for name in ("checkpoint.pt", "metrics.json", "provenance.json", "sentinel.json"):
        (epoch_dir / name).chmod(0o644)
        shutil.copyfile(epoch_dir.parent / "1" / name, epoch_dir / name)


def test_an_epoch_replaced_by_another_is_rebuilt_by_the_printed_fix(selected_workdir: Path, selected_tree: Path):
    """Issue 34 item 5: epoch 3 refuses to resume from a foreign epoch 2 in one line whose Fix rebuilds epoch 2 (rerunning
    alone would retry epoch 3 and fail the same way); followed literally, the workflow finishes, verify is clean and
    every result is the uninterrupted run's, byte for byte."""
    workdir = selected_workdir
    replace_with_epoch_1(workdir / RUN / "epochs/2")
    failed = snakemake(workdir, "validation_selection", check=False)
    log = (workdir / "results/logs/train_epoch/base/3.log").read_text()
    refusals = [line for line in log.splitlines() if "epoch 3 must resume from epoch 2 of the same run" in line]
    assert failed.returncode != 0 and len(refusals) == 1 and "Traceback" not in log, log
    target = "results/runs/base/epochs/2/sentinel.json"
    command = fix_of(refusals[0])
    assert command == f"rm -f {target} && snakemake -s {REPO}/workflow/Snakefile {target} --cores all --configfile config.yaml"
    done = subprocess.run(["bash", "-c", command], cwd=workdir, env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    snakemake(workdir, "validation_selection")  # then the workflow again, as the message says
    assert rffm("verify", "results", cwd=workdir).returncode == 0
    assert tree_bytes(workdir / "results") == tree_bytes(selected_tree / "results")


def test_every_broken_line_names_a_fix_and_each_kind_works_as_printed(workdir: Path, finished_workdir: Path):
    """Issue 34: every BROKEN line of verify and status ends with its fix. One tree with a damage of each kind whose fix
    is not the damaged step's own rebuild (test_the_fix_for_a_damaged_file_works_as_printed): an upstream step deleted
    whole, an upstream replaced by another step's files, a damaged artifact, memo entry and hidden-state cache. Each
    distinct fix, run as printed in verify's order, leaves verify clean and every result as it was."""
    results = workdir / "results"
    shutil.rmtree(results / "backbones/mini")
    replace_with_epoch_1(results / "runs/base/epochs/2")
    artifact = results / json.loads((workdir / RUN / "selection/selection.json").read_text())["artifact_path"]
    memo = next(s.parent for s in (results / "memo/train_epoch").glob("*/sentinel.json") if json.loads(s.read_text())["key"]["epoch"] == 1)
    cache = workdir / "scratch/tiny__mini/meta.json"
    for damaged in (artifact, memo / "metrics.json", cache):
        damaged.chmod(0o644)
        damaged.write_bytes(damaged.read_bytes() + b" ")
    verify = rffm("verify", "results", cwd=workdir)
    status = rffm("status", "results", "--full", cwd=workdir)
    broken = [line for line in verify.stdout.splitlines() if line.startswith("BROKEN")]
    shown = [line for line in status.stdout.splitlines() if line.startswith("BROKEN")]
    assert verify.returncode == 1 and len(broken) >= 9 and shown, verify.stdout + status.stdout
    assert [line for line in broken + shown if " Fix: " not in line] == []
    for command in dict.fromkeys(fix_of(line) for line in broken):
        done = subprocess.run(["bash", "-c", command], cwd=workdir, env=env(), capture_output=True, text=True)
        assert done.returncode == 0, (command, done.stderr[-3000:])
    after = rffm("verify", "results", cwd=workdir)
    assert after.returncode == 0 and "BROKEN" not in after.stdout, after.stdout
    assert "BROKEN" not in rffm("status", "results", "--full", cwd=workdir).stdout
    entry = memo.relative_to(results).as_posix()  # removed by its fix: a damaged entry is never restored
    assert tree_bytes(results) == tree_bytes(finished_workdir / "results", leaving_out=(entry,))


def test_the_fix_for_a_deleted_ledger_entry_is_its_backup(workdir: Path, finished_workdir: Path):
    """The ledger is write-once: nothing writes a deleted entry again (that would reset the exposure), so the fix
    verify names is the backup; restored, verify is clean."""
    entry = next((workdir / "results/ledger").rglob("*.json"))
    entry.unlink()
    verify = rffm("verify", "results", cwd=workdir)
    lines = [line for line in verify.stdout.splitlines() if line.startswith("BROKEN") and str(entry) in line]
    assert verify.returncode == 1 and len(lines) == 1 and fix_of(lines[0]) == f"restore {entry} from a backup", verify.stdout
    shutil.copyfile(finished_workdir / entry.relative_to(workdir), entry)  # the backup: the undamaged tree
    assert rffm("verify", "results", cwd=workdir).returncode == 0


def test_a_run_removed_from_its_config_is_stale_for_the_bare_commands_and_pruned_whole(workdir: Path):
    """Issue 34 item 10: a run deleted from the config that planned it is stale for plain `rffm status|prune` (no
    --config or --by-config); the `--delete` prune prints removes it whole, so status never shows it pending again."""
    config = tiny_config()
    config["runs"]["extra"] = {**config["runs"]["base"], "train": {**config["runs"]["base"]["train"], "epochs": 1, "seed": 1}}
    config["runs"]["extra"].pop("profiling")
    write_config(workdir, config)
    snakemake(workdir, "results/runs/extra/epochs/1/sentinel.json")  # one epoch; the workflow records extra's plan
    write_config(workdir, tiny_config())  # extra deleted from config.yaml again
    status = rffm("status", cwd=workdir)
    notes = [line for line in status.stdout.splitlines() if line.startswith("note: plan:")]
    assert len(notes) == 1 and "runs extra are no longer in the config files that planned them (extra (config.yaml" in notes[0]
    assert set(rows(status.stdout)) == {"base"} and "stale: runs/extra" in status.stdout, status.stdout
    listed = rffm("prune", "results", cwd=workdir)
    assert [line for line in listed.stdout.splitlines() if line.startswith("stale ")] == ["stale results/runs/extra/epochs/1"]
    command = re.search(r"`(rffm prune [^`]*)` removes them", listed.stdout).group(1)
    assert command == "rffm prune results --delete", listed.stdout
    subprocess.run(["bash", "-c", command], cwd=workdir, env=env(), check=True, capture_output=True)
    assert not (workdir / "results/runs/extra").exists()  # its launch and plan records with it
    status = rffm("status", cwd=workdir)
    assert set(rows(status.stdout)) == {"base"} and "extra" not in status.stdout, status.stdout
    verify = rffm("verify", "results", cwd=workdir)
    assert verify.returncode == 0 and "0 problem(s), 0 stale" in verify.stdout, verify.stdout
