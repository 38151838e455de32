"""Restored epochs are recorded (issue 23): an epoch restored from the memo instead of trained says so in its
provenance (the entry, and where it was trained), in `rffm status` (column `restored from memo`), in the run manifest
(provenance.restored_epochs) and its HTML summary; `rffm verify` checks its bytes against the memo entry it came from.
(On Google Batch, after a spot preemption: tests/executors/test_googlebatch_guarantees.py.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, SNAKEFILE, snakemake
from rffm.ops import status, verify
from rffm.records import provenance
from rffm.records.files import read_json

pytestmark = pytest.mark.workflow
RUN = "results/runs/base"


@pytest.fixture
def restored(workdir: Path) -> Path:
    """The finished tiny run with epochs 1 and 2 gone (a lost node) and its qualification forced to run again: epochs 1-2
    are made again, epoch 3 after them (its input was updated), all three restored from the memo."""
    for epoch in (1, 2):
        shutil.rmtree(workdir / f"{RUN}/epochs/{epoch}")
    snakemake(workdir, "--forcerun", "qualify")
    for epoch in (1, 2, 3):
        assert "restored from" in (workdir / f"results/logs/train_epoch/base/{epoch}.log").read_text()
    return workdir


def test_a_restored_epoch_names_its_memo_entry_and_where_it_was_trained(restored: Path, finished_workdir: Path):
    for epoch in (1, 2, 3):
        record = provenance.read(restored / f"{RUN}/epochs/{epoch}/provenance.json")
        assert record["restored_from"].startswith("results/memo/train_epoch/"), record  # the store as the rule names it
        original = provenance.read(finished_workdir / f"{RUN}/epochs/{epoch}/provenance.json")
        assert record["computed_by"]["host"] == original["host"] and record["computed_by"]["pid"] == original["pid"]
        assert record["pid"] != original["pid"], "restored by another process than the one that trained it"


def test_status_and_the_manifest_list_the_restored_epochs(restored: Path):
    [row] = [r for r in status.collect(restored / "results") if r["run"] == "base"]
    assert (row["restored_epochs"], row["restored_members"]) == ([1, 2, 3], [])  # a plain run: no sweep members
    shown = subprocess.run([str(BIN / "rffm"), "status", "results"], cwd=restored, capture_output=True, text=True, check=True).stdout
    header, line = shown.splitlines()[:2]
    # issue 50: the epochs, named as epochs (a bare "2" read as a count)
    assert re.split(r"\s{2,}", line[header.index("restored from memo") :])[0] == "epochs 1-3", shown
    manifest = read_json(restored / f"{RUN}/qualification/run_manifest.json")
    listed = manifest["provenance"]["restored_epochs"]
    assert [item["epoch"] for item in listed] == [1, 2, 3]
    assert all(item["memo_entry"].startswith("results/memo/train_epoch/") for item in listed)
    assert all(item["trained_by"]["executor"] == "local" and item["trained_by"]["host"] for item in listed)
    report = (restored / f"{RUN}/report/qualification/manifest_summary.html").read_text()
    host = listed[0]["trained_by"]["host"]
    assert f"epochs restored from the memo (not trained by this run)</td><td>1 (trained on {host}, entry results/memo/" in report


def test_verify_checks_a_restored_epoch_against_its_memo_entry(restored: Path):
    assert verify.verify_tree(restored / "results").broken == []
    recorded = provenance.read(restored / f"{RUN}/epochs/1/provenance.json")["restored_from"]
    shutil.rmtree(restored / recorded)
    [line] = verify.verify_tree(restored / "results").broken
    problem, fix = line.split(" Fix: ")
    assert problem == f"{restored}/{RUN}/epochs/1/provenance.json: restored from the memo entry {recorded}, which is missing (deleted?)."
    target = "results/runs/base/epochs/1/sentinel.json"  # from anywhere: the fix changes to the workflow's directory first
    assert fix == f"cd {restored} && rm -f {target} && snakemake -s {SNAKEFILE} {target} --cores all --configfile config.yaml", fix
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", fix], cwd=restored, env=env, check=True, capture_output=True)  # the fix, as printed
    assert verify.verify_tree(restored / "results").broken == []


def test_the_ledger_entry_the_qualify_job_wrote_cannot_be_deleted_or_overwritten_by_a_job(finished_workdir: Path):
    """Issue 23, acceptance 3 on POSIX: a job (any process of the workflow's user) that tries to delete, rewrite or
    replace the entry fails where the filesystem allows immutable files; `rffm verify` reports every entry's protection."""
    [entry] = (finished_workdir / "results/ledger").rglob("*.json")
    shown = subprocess.run([str(BIN / "rffm"), "verify", "results"], cwd=finished_workdir, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stdout
    lines = [line for line in shown.stdout.splitlines() if line.startswith("ledger ")]
    assert len(lines) == 1 and lines[0].startswith(f"ledger results/ledger/{entry.parent.name}/base.json: "), shown.stdout
    if "immutable (chattr +i)" not in lines[0]:
        assert "read-only (mode 0444) but not immutable" in lines[0]
        pytest.skip("this machine does not let the workflow make files immutable: the entry is read-only only")
    before = entry.read_bytes()
    hostile = (
        "import os, sys\n"
        "path = sys.argv[1]\n"
        "for name, attempt in [('delete', lambda: os.unlink(path)), ('overwrite', lambda: open(path, 'r+b').write(b'{}')),\n"
        "                      ('replace', lambda: (open(path + '.x', 'w').close(), os.replace(path + '.x', path))),\n"
        "                      ('chmod', lambda: os.chmod(path, 0o644))]:\n"
        "    try:\n"
        "        attempt()\n"
        "        print(name, 'succeeded')\n"
        "    except PermissionError:\n"
        "        print(name, 'refused')\n"
    )
    import sys

    tried = subprocess.run([sys.executable, "-c", hostile, str(entry)], capture_output=True, text=True, check=True)
    assert tried.stdout.split("\n")[:4] == ["delete refused", "overwrite refused", "replace refused", "chmod refused"], tried.stdout
    assert entry.read_bytes() == before
    for leftover in entry.parent.glob("*.x"):
        leftover.unlink()
