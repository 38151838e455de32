"""Issue 34, acceptance 2: the integrity refusals whose Fix reruns part of the workflow — a damaged sentinel or
provenance record, a step folder without its sentinel, a file changed after its step wrote it, a summary without
phases, a selection that recorded no head, damage in the results store. Each is provoked on a copy of the session's
finished tiny tree (by the call that meets it, or by the snakemake run whose job meets it), its printed Fix is done as
written (a command run as printed; `rffm verify results` and the Fix of each BROKEN line, round after round, until it
prints none), and then the same call works, `rffm verify results` is clean and the qualified run's result keeps its
bytes (every step is deterministic: nothing is qualified again)."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import copy_workdir, snakemake
from fixes import fix_of, run_fix
from rffm.cli import main
from rffm.errors import DataError, IntegrityError
from rffm.records import provenance
from rffm.records.files import sha256_bytes
from rffm.records.launch import RECORD_NAME
from rffm.records.rebuild import rebuild_command
from rffm.records.seal import SELF_DIGEST, seal
from rffm.records.sentinel import read_sentinel, require_intact
from rffm.records.store import PosixStore, set_immutable
from rffm.steps import plot_cache_lifecycle, summarize_profiling
from rffm.training.artifact import load_head

pytestmark = pytest.mark.workflow
RUN = Path("results/runs/base")
RESULT = RUN / "qualification/metrics.json"
VERIFY = "rffm verify results, and run the Fix of each BROKEN line it prints until it prints none."


def broken(workdir: Path) -> list[str]:
    """The BROKEN lines of `rffm verify results` (the Fix's first words, as argv of the console script's main, in-process)."""
    assert Path.cwd() == workdir
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(shlex.split(VERIFY.split(",")[0])[1:])
    lines = [line for line in out.getvalue().splitlines() if line.startswith("BROKEN ")]
    assert code == (1 if lines else 0) and not err.getvalue(), out.getvalue() + err.getvalue()
    return lines


def follow_verify(workdir: Path, fix: str) -> int:
    """Do the Fix of a record a step met damaged: verify, the Fix of each BROKEN line as printed, until none; the rounds."""
    assert fix == VERIFY
    for rounds in range(4):
        lines = broken(workdir)
        if not lines:
            return rounds
        for command in dict.fromkeys(line.split(" Fix: ", 1)[1] for line in lines):
            run_fix(command, workdir)
    raise AssertionError(f"still broken after {rounds + 1} rounds: {lines}")


def writable(path: Path) -> Path:
    path.chmod(0o644)
    return path


def resealed(path: Path, edit: Callable[[dict], None]) -> None:
    """What a careful editor does: change the body of a sealed record and seal it again (its own sha256 matches)."""
    body = json.loads(path.read_text())
    body.pop(SELF_DIGEST)
    edit(body)
    writable(path).write_bytes(seal(body))


def error_lines(workdir: Path) -> list[str]:
    """The refusals the jobs of the last snakemake run wrote to their logs (`rffm <rule>: error: …`)."""
    return [
        line for log in sorted((workdir / "results/logs").rglob("*.log")) for line in log.read_text().splitlines() if ": error: " in line
    ]


@pytest.fixture
def tree(finished_workdir: Path, tmp_path: Path, monkeypatch) -> Path:
    """A private copy of the finished tiny tree, the working directory of the calls (their paths are relative)."""
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    monkeypatch.chdir(workdir)
    return workdir


def test_a_truncated_sentinel_met_by_a_workflow_run_is_fixed_by_verify_and_each_broken_lines_fix(tree: Path):
    """The damage itself is what reruns its consumer (its input changed), and the refusing job removed its own sentinel:
    deleting the record and rerunning snakemake would leave both missing, and plan nothing. verify names both."""
    qualified = RESULT.read_bytes()
    path = writable(RUN / "epochs/3/sentinel.json")
    path.write_bytes(path.read_bytes()[:50])
    assert snakemake(tree, check=False).returncode != 0
    refusals = error_lines(tree)
    assert [line.split(": error: ")[0] for line in refusals] == ["rffm select_checkpoint"], refusals
    assert f": error: {path}: sentinel is not valid JSON (damaged or truncated). Fix: " in refusals[0]
    assert fix_of(refusals[0]) == VERIFY and not (RUN / "selection/sentinel.json").exists()
    assert follow_verify(tree, VERIFY) == 1
    again = snakemake(tree)  # the same command: the workflow is finished
    assert "Nothing to be done" in again.stdout + again.stderr
    assert read_sentinel(path)["stage"] == "train_epoch" and RESULT.read_bytes() == qualified


def forged_selection() -> dict:
    """The selection sentinel resealed to record a file that is no head, stored under its own sha256 (as it names it)."""
    data = b"not a head artifact"
    artifact = {"bytes": len(data), "key": f"artifacts/sha256-{sha256_bytes(data)}.pt", "sha256": sha256_bytes(data)}
    (Path("results") / artifact["key"]).write_bytes(data)
    resealed(RUN / "selection/sentinel.json", lambda b: b.update(artifact=artifact))
    return artifact


def empty_phases() -> Path:
    """The profiling summary as summarize_profiling writes it when no phase was recorded (vouched for by its sentinel)."""
    summary = summarize_profiling.summarize
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(summarize_profiling, "summarize", lambda *args: {**summary(*args), "phases": {}})
        summarize_profiling.run(
            "base", Path("results/caches/tiny__mini"), [RUN / "epochs/1", RUN / "epochs/2"], RUN / "profiling", store="results"
        )
    return RUN / "profiling/cache_lifecycle_summary.json"


def unsealed(path: Path) -> None:
    body = json.loads(path.read_text())
    body.pop(SELF_DIGEST)
    writable(path).write_text(json.dumps(body))


def command_of(fix: str) -> str:
    """The command of a printed Fix ("restore the file, or rebuild it with <rule>: <command>": the command)."""
    return fix.split(": ", 1)[1] if fix.startswith("restore the file, or rebuild it with ") else fix


def reading(path: Path) -> Callable[[], dict]:
    """The call that reads a sealed record as a step does (a provenance record: with the sentinel beside it)."""
    if path.name == "provenance.json":
        return lambda: provenance.read(path, path.parent / "sentinel.json")
    return lambda: read_sentinel(path)


def test_damaged_or_missing_records_a_step_reads_are_fixed_by_the_printed_fix(tree: Path, tmp_path: Path):
    """Twelve refusals, each met by the call that reads the record. Those of a folder's own record (its sentinel
    missing, a checkpoint changed after its epoch, the provenance of another epoch or none, a summary without phases,
    a selection that recorded a file that is no head) print the command that runs its step again; a damaged sealed
    record met while a step runs, `rffm verify` and each BROKEN line's fix (rebuilding a record alone would leave the
    step that met it, which removed its own sentinel, unbuilt). Then a profiling summary rebuilt after the epochs it
    reads holds other timings than the one its chart consumed: that line's Fix rebuilds the chart."""
    qualified = RESULT.read_bytes()
    epoch, selection, summary = RUN / "epochs/2", RUN / "selection/sentinel.json", empty_phases()
    checkpoint = writable(epoch / "checkpoint.pt")
    checkpoint.write_bytes(checkpoint.read_bytes()[:-1] + bytes([checkpoint.read_bytes()[-1] ^ 1]))
    shutil.copy(RUN / "epochs/1/provenance.json", writable(epoch / "provenance.json"))
    (RUN / "epochs/3/sentinel.json").unlink()
    artifact = forged_selection()
    (RUN / "selection/provenance.json").unlink()
    resealed(RUN / "report/validation/sentinel.json", lambda body: body.pop("stage"))
    unsealed(RUN / "report/validation/provenance.json")
    resealed(RUN / "report/qualification/sentinel.json", lambda body: body.update(schema_version=1))
    edited = RUN / "report/qualification/provenance.json"
    writable(edited).write_text(json.dumps({**json.loads(edited.read_text()), "rule": "edited"}))
    resealed(RUN / "report/profiling/sentinel.json", lambda body: body["outputs"].update(x=[]))
    resealed(RUN / "qualification/sentinel.json", lambda body: body["inputs"].update(selection=[]))
    store = PosixStore(Path("results"))
    rebuilt = {  # the call that meets each damage and what it says; its Fix runs that record's step again
        "sha256": lambda: require_intact(epoch / "sentinel.json", ["checkpoint.pt"], "train_epoch"),
        "provenance of another run of the step": reading(epoch / "provenance.json"),
        "sentinel is missing": reading(RUN / "epochs/3/sentinel.json"),
        "field 'phases'": lambda: plot_cache_lifecycle.run("base", summary, tmp_path / "chart"),
        "not an rffm head artifact": lambda: load_head(store, read_sentinel(selection)["artifact"], "qualify", selection),
        "provenance is missing": reading(RUN / "selection/provenance.json"),
    }
    verified = {  # a damaged sealed record: its Fix, `rffm verify` and the BROKEN lines' fixes
        "sentinel field 'stage' is missing": reading(RUN / "report/validation/sentinel.json"),
        "provenance has no self_sha256": reading(RUN / "report/validation/provenance.json"),
        "sentinel schema_version 1, expected 2": reading(RUN / "report/qualification/sentinel.json"),
        "provenance does not match its own sha256": reading(edited),
        "record of output 'x' is malformed": reading(RUN / "report/profiling/sentinel.json"),
        "link to upstream 'selection' is malformed": reading(RUN / "qualification/sentinel.json"),
    }
    fixes = []
    for said, call in {**rebuilt, **verified}.items():
        with pytest.raises((IntegrityError, DataError)) as caught:
            call()
        assert said in str(caught.value), caught.value
        fixes.append(command_of(fix_of(caught)))
    assert fixes[len(rebuilt) :] == [VERIFY] * len(verified)
    assert fixes[0] == fixes[1] and fixes[4] == fixes[5]  # one folder, one rebuild
    for command in dict.fromkeys(fixes[: len(rebuilt)]):
        assert command.startswith(("snakemake ", "rm -f ")), command
        run_fix(command, tree)
    assert follow_verify(tree, VERIFY) == 1
    for call in [*rebuilt.values(), *verified.values()]:
        call()
    assert read_sentinel(selection)["artifact"] != artifact and RESULT.read_bytes() == qualified
    # the summary rebuilt after an epoch it reads was (its timings differ): the chart that consumed the old one is rebuilt
    first = RUN / "epochs/1/provenance.json"
    timed = {**json.loads(first.read_text()), "duration_s": 99.0}
    timed.pop(SELF_DIGEST)
    provenance.write(
        writable(first), {k: v for k, v in timed.items() if k != "sentinel_sha256"}, (RUN / "epochs/1/sentinel.json").read_bytes()
    )
    summarize_profiling.run("base", Path("results/caches/tiny__mini"), [RUN / "epochs/1", epoch], RUN / "profiling", store="results")
    chart = RUN / "report/profiling/sentinel.json"
    line = (
        f"BROKEN {chart}: its upstream profiling_summary sentinel {tree / RUN}/profiling/sentinel.json changed since this step consumed it"
    )
    assert [fix_of(found) for found in broken(tree) if found.startswith(line)] == [rebuild_command(chart, remove=True)]
    assert follow_verify(tree, VERIFY) == 1


def test_a_manifest_edited_where_its_sentinel_does_not_look_is_fixed_by_deleting_the_qualification_sentinel(tree: Path):
    """summarize_manifest checks the manifest's provenance part against the provenance file's full sha256; its Fix:
    "restore it, or delete <the qualification sentinel> and rerun snakemake" (the second)."""
    qualified = RESULT.read_bytes()
    manifest = writable(RUN / "qualification/run_manifest.json")
    body = json.loads(manifest.read_text())
    body["provenance"]["host"] = "elsewhere"
    manifest.write_text(json.dumps(body, indent=1))
    assert snakemake(tree, "--forcerun", "summarize_manifest", check=False).returncode != 0
    refusal = next(line for line in error_lines(tree) if line.startswith("rffm summarize_manifest: error: "))
    sentinel = RUN / "qualification/sentinel.json"
    assert f"{manifest}: its provenance differ" in refusal and fix_of(refusal) == f"restore it, or delete {sentinel} and rerun snakemake."
    sentinel.unlink()
    snakemake(tree)
    assert not broken(tree) and RESULT.read_bytes() == qualified


def test_damage_in_the_results_store_is_fixed_by_each_broken_lines_fix(tree: Path):
    """A ledger entry deleted (its Fix: restore it from a backup; until then the workflow plans nothing), then the
    selected artifact changed, an unreadable launch record and a step folder without its sentinel: verify's Fix of
    each, done as printed, leaves it clean."""
    qualified = RESULT.read_bytes()
    entry = next(Path("results/ledger").rglob("*.json"))
    backup = shutil.copy(entry, tree.parent / "ledger-backup.json")
    set_immutable(entry, False)
    entry.unlink()
    stored = (tree / entry).resolve()  # as the sentinel that records it names it
    assert [fix_of(line) for line in broken(tree) if line.startswith(f"BROKEN {stored}: ")] == [f"restore {stored} from a backup"]
    shutil.copy(backup, entry)
    assert not broken(tree)
    artifact = next(Path("results/artifacts").iterdir())
    writable(artifact).write_bytes(artifact.read_bytes()[:-1])
    launch = RUN / "launch/default"
    launch.mkdir()
    (launch / RECORD_NAME).write_text("{not json")
    (RUN / "report/validation/sentinel.json").unlink()
    lines = broken(tree)
    assert [any(line.startswith(f"BROKEN {path}") for line in lines) for path in (artifact, launch / RECORD_NAME)] == [True, True], lines
    assert any(line.startswith(f"BROKEN {RUN / 'report/validation/sentinel.json'}: missing") for line in lines), lines
    assert follow_verify(tree, VERIFY) == 1
    assert RESULT.read_bytes() == qualified
