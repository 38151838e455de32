"""The damage battery (issue 14, acceptance 1): a hostile operator's damage to every file kind of the tiny run.

One finished tiny run is shared; an older version of every file comes from the same pipeline run
in-process with other seeds (what "putting back an older copy" restores). Each seeded case copies
the tree, damages one file (flip a byte, truncate, delete, edit a key, put back an older copy), then:

- `rffm verify results` (plain: no config, no --scratch) names the damaged file, every line with its fix;
- the rule that consumes the file, forced (its exact `rffm <rule> ...` command, run in-process, and
  real `snakemake --forcerun` for a sample), either refuses with one line naming the damaged file or
  writes exactly the bytes of the undamaged run (the damaged part is never read);
- nothing prints a traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shlex
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import h5py
import pytest

from conftest import BIN, copy_workdir, snakemake
from rffm import cli
from rffm.records import ledger
from rffm.records.sentinel import json_record

pytestmark = pytest.mark.workflow
SEED = 14
KINDS = ("flip", "truncate", "delete", "edit", "older")
RUN = "results/runs/base"
CACHE_MEMO = "scratch/tiny__mini"


@dataclass
class Outcome:
    code: int | None
    out: str
    err: str
    traceback: str | None = None


def rffm(workdir: Path, argv: list[str]) -> Outcome:
    """`rffm <argv>` in-process in workdir (the console script's main), capturing its output."""
    out, err = io.StringIO(), io.StringIO()
    previous = Path.cwd()
    os.chdir(workdir)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
        return Outcome(code, out.getvalue(), err.getvalue())
    except BaseException as error:  # what a user would see as a traceback
        return Outcome(None, out.getvalue(), err.getvalue(), f"{type(error).__name__}: {error}")
    finally:
        os.chdir(previous)


def rule_commands(workdir: Path) -> dict[str, list[str]]:
    """Each job's `rffm` argv as the workflow runs it, keyed 'rule' or 'rule/<epoch>' (from a forced dry run)."""
    output = snakemake(workdir, "-n", "-p", "--forceall").stdout
    commands = {}
    for line in output.splitlines():
        if not line.startswith("Shell command: rffm "):
            continue
        argv = shlex.split(line.removeprefix("Shell command: rffm ").split(" > ")[0])
        name = argv[0] + (f"/{argv[argv.index('--epoch') + 1]}" if "--epoch" in argv else "")
        commands[name] = argv
    return commands


def older_tree(commands: dict[str, list[str]], workdir: Path) -> None:
    """The same pipeline with other seeds (staging, pretraining, training) into workdir, in-process."""

    def reseeded(argv: list[str]) -> list[str]:
        argv = list(argv)
        if "--spec" in argv:
            spec = json.loads(argv[argv.index("--spec") + 1])
            for section, seed in (("synthetic", None), ("pretrain", 1), ("train", 5)):
                if section == "synthetic" and "synthetic" in spec:
                    spec["seed"] = 12
                elif section in spec and seed is not None:
                    spec[section]["seed"] = seed
            argv[argv.index("--spec") + 1] = json.dumps(spec)
        return argv

    order = ["stage_dataset", "pretrain_backbone", "build_cache", "train_epoch/1", "train_epoch/2", "train_epoch/3"]
    order += ["select_checkpoint", "summarize_profiling", "qualify", "plot_training", "plot_cache_lifecycle", "summarize_manifest"]
    for name in order:
        outcome = rffm(workdir, reseeded(commands[name]))
        assert outcome.code == 0 and outcome.traceback is None, f"older {name}: {outcome.traceback or outcome.err[-2000:]}"


def consumer_of(relative: str, tree: Path) -> str | None:
    """The rule (command key) that reads a file of the tiny run, None for terminal reports."""
    name = Path(relative).name
    if relative.startswith("results/datasets/"):
        return "qualify" if name in ("test.h5", "provenance.json") else "build_cache"
    if relative.startswith("results/backbones/"):
        return "qualify" if name == "provenance.json" else "build_cache"
    if relative.startswith("results/caches/"):
        return "summarize_profiling" if name == "provenance.json" else "train_epoch/1"
    if relative.startswith(CACHE_MEMO):
        return "train_epoch/1"
    if relative.startswith(f"{RUN}/epochs/"):
        epoch = int(relative.split("/")[4])
        if name == "provenance.json":
            return "qualify"
        return f"train_epoch/{epoch + 1}" if epoch < 3 and name != "metrics.json" else "select_checkpoint"
    if relative.startswith("results/memo/"):
        body = json.loads((tree / Path(relative).parent / "sentinel.json").read_text())
        return f"train_epoch/{body['key']['epoch']}"
    if relative.startswith(("results/artifacts/", "results/ledger/", f"{RUN}/selection/")):
        return "qualify"
    if relative.startswith(f"{RUN}/qualification/"):
        return "summarize_manifest"
    if relative.startswith(f"{RUN}/profiling/"):
        return "plot_cache_lifecycle"
    return None  # reports: terminal, checked by verify only


def out_dir(argv: list[str]) -> str:
    return argv[argv.index("--profile-dir" if "--profile-dir" in argv else "--out-dir") + 1]


def battery_files(tree: Path) -> list[str]:
    """Every file of the finished tiny run that a step writes and something checks (logs and locks excluded)."""
    files = [p.relative_to(tree).as_posix() for p in sorted((tree / "results").rglob("*")) if p.is_file()]
    files = [f for f in files if not f.startswith("results/logs/")]
    files = [f for f in files if "/launch/plan-" not in f]  # plan records: their own damage cases (tests/unit/test_plans.py)
    files += [p.relative_to(tree).as_posix() for p in sorted((tree / CACHE_MEMO).iterdir())]
    return files


def older_counterpart(relative: str, tree: Path, older: Path) -> Path | None:
    """The same file in the older tree (content-addressed ones: the older artifact, ledger entry, memo entry)."""
    if (older / relative).exists():
        return older / relative
    parts = relative.split("/")
    if parts[1] == "artifacts":
        return next((older / "results/artifacts").iterdir())
    if parts[1] == "ledger":
        return next((older / "results/ledger").rglob("*.json"))
    if parts[1] == "memo":
        epoch = json.loads((tree / Path(relative).parent / "sentinel.json").read_text())["key"]["epoch"]
        for sentinel in (older / "results/memo/train_epoch").glob("*/sentinel.json"):
            if json.loads(sentinel.read_text())["key"]["epoch"] == epoch:
                return sentinel.parent / parts[-1]
    return None


def edit_json(path: Path, rng: random.Random) -> str:
    """Change one value (or rename one key) of a JSON file; what was done."""
    body = json.loads(path.read_text())
    if not isinstance(body, dict):
        return ""
    keys = sorted(body)
    key = rng.choice(keys)
    if rng.random() < 0.3:
        body[key + "_renamed"] = body.pop(key)
        what = f"renamed {key!r}"
    else:
        node, where = body, key
        while isinstance(node[where], dict) and node[where]:
            node, where = node[where], rng.choice(sorted(node[where]))
        value = node[where]
        if isinstance(value, bool):
            node[where] = not value
        elif isinstance(value, int | float):
            node[where] = value + 1
        elif isinstance(value, str):
            node[where] = value + "x"
        elif isinstance(value, list):
            node[where] = value[::-1] + ["edited"]
        else:
            node[where] = "edited"
        what = f"edited {where!r}"
    path.write_text(json.dumps(body, indent=1, sort_keys=True))
    return what


def damage(path: Path, kind: str, rng: random.Random, older: Path | None) -> str:
    """Apply one damage; a description, or '' when it does not apply to this file."""
    data = path.read_bytes()
    path.chmod(0o644)
    if kind == "flip":
        at = rng.randrange(len(data))
        path.write_bytes(data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :])
        return f"flipped a bit of byte {at}"
    if kind == "truncate":
        size = rng.randrange(len(data))
        path.write_bytes(data[:size])
        return f"truncated to {size} bytes"
    if kind == "delete":
        path.unlink()
        return "deleted"
    if kind == "edit":
        if path.suffix == ".json":
            return edit_json(path, rng)
        if path.suffix == ".h5":
            with h5py.File(path, "r+") as handle:
                name = rng.choice(sorted(handle.attrs))
                value = handle.attrs[name]
                handle.attrs[name] = value[::-1] if hasattr(value, "__len__") and len(value) > 1 else str(value) + "x"
            return f"edited attribute {name!r}"
        return ""
    if older is None or older.read_bytes() == data:
        return ""
    shutil.copyfile(older, path)
    return f"put back {older}"


def names(text: str, relative: str) -> bool:
    """Whether a message names the file (by its path below the results tree or scratch)."""
    tail = relative.removeprefix("results/").removeprefix("scratch/")
    return tail in text


@pytest.fixture(scope="module")
def battery(finished_workdir: Path, tmp_path_factory) -> tuple[Path, Path, dict[str, list[str]]]:
    root = tmp_path_factory.mktemp("battery")
    tree = copy_workdir(finished_workdir, root / "tree")
    commands = rule_commands(tree)
    older = root / "older"
    older.mkdir()
    shutil.copy(tree / "config.yaml", older / "config.yaml")
    older_tree(commands, older)
    return tree, older, commands


def cases(tree: Path, older: Path) -> list[tuple[str, str]]:
    """Seeded (file, kind) pairs: one kind per file, a second (an edited key) per sentinel; every kind appears."""
    rng = random.Random(SEED)
    chosen = []
    for relative in battery_files(tree):
        kinds = [k for k in KINDS if k != "older" or older_counterpart(relative, tree, older) is not None]
        if not relative.endswith((".json", ".h5")):
            kinds.remove("edit")
        kind = rng.choice(kinds)
        chosen.append((relative, kind))
        if relative.endswith("sentinel.json") and kind != "edit":
            chosen.append((relative, "edit"))
    return chosen


def diagnostic(relative: str, kind: str) -> bool:
    """Damage verify need not name, since nothing ever reads it back into a result: Chrome traces (for a human
    with a trace viewer), and a memo entry without its sentinel (a half-written entry: never restored)."""
    return relative.endswith(".trace.json") or (
        relative.startswith("results/memo/") and relative.endswith("sentinel.json") and kind == "delete"
    )


def run_case(tree: Path, older: Path, commands, relative: str, kind: str, workdir: Path, seed: int) -> tuple[str, list[str]]:
    """One damage on a fresh copy; ('skipped'|'refused'|'unchanged', failures)."""
    rng = random.Random(seed)
    shutil.copytree(tree / "results", workdir / "results", symlinks=True)
    shutil.copytree(tree / "scratch", workdir / "scratch", symlinks=True)
    shutil.copy(tree / "config.yaml", workdir / "config.yaml")
    target = workdir / relative
    done = damage(target, kind, rng, older_counterpart(relative, tree, older) if kind == "older" else None)
    if not done:
        return "skipped", []
    case = f"{relative} ({kind}: {done})"
    failures = []
    verify = rffm(workdir, ["verify", "results"])
    broken = [line for line in verify.out.splitlines() if line.startswith("BROKEN")]
    if verify.traceback or "Traceback" in verify.out + verify.err:
        failures.append(f"{case}: verify crashed: {verify.traceback}")
    elif not diagnostic(relative, kind) and (verify.code != 1 or not any(names(line, relative) for line in broken)):
        failures.append(f"{case}: verify did not name it:\n{verify.out}")
    if any(" Fix: " not in line for line in broken):  # every BROKEN line names its fix (issue 34)
        failures.append(f"{case}: a BROKEN line names no fix:\n{verify.out}")
    consumer = consumer_of(relative, tree)
    if consumer is None:
        return "verified", failures
    if relative.startswith(CACHE_MEMO):
        shutil.rmtree(workdir / "results/memo")  # nothing kept: the epoch has to read the cache
    argv = commands[consumer]
    produced = Path(out_dir(argv))
    outcome = rffm(workdir, argv)
    errors = [line for line in outcome.err.splitlines() if line.startswith(f"rffm {argv[0]}: error:")]
    if outcome.traceback or "Traceback" in outcome.err:
        failures.append(f"{case}: {consumer} raised {outcome.traceback or outcome.err[-1500:]}")
        return "traceback", failures
    if outcome.code != 0:
        if not (len(errors) == 1 and names(errors[0], relative)):
            failures.append(f"{case}: {consumer} did not refuse in one line naming it:\n{outcome.err[-1500:]}")
        return "refused", failures
    # it ran: only if the damage was never read, so every deterministic output is the undamaged run's (a JSON output
    # whose sentinel record leaves out a key, the manifest's provenance of hosts and processes, compared without it)
    recorded = json.loads((tree / produced / "sentinel.json").read_text())["outputs"]
    for path in sorted((workdir / produced).iterdir()):
        if path.is_file() and path.name != "provenance.json":
            original = tree / produced / path.name
            excluding = recorded.get(path.name, {}).get("excluding")
            if excluding and original.exists():
                same = json_record(original, excluding) == json_record(path, excluding)
            else:
                same = original.exists() and original.read_bytes() == path.read_bytes()
            if not same:
                failures.append(f"{case}: {consumer} ran on it and wrote a different {produced / path.name}")
    return "unchanged", failures


def test_every_damage_is_named_by_verify_and_refused_by_its_consumer(battery, tmp_path: Path):
    tree, older, commands = battery
    chosen = cases(tree, older)
    counts, kinds, failures = Counter(), Counter(), []
    for index, (relative, kind) in enumerate(chosen):
        outcome, problems = run_case(tree, older, commands, relative, kind, tmp_path / f"case{index}", SEED * 1000 + index)
        counts[outcome] += 1
        if outcome != "skipped":
            kinds[kind] += 1
        failures += problems
        shutil.rmtree(tmp_path / f"case{index}", ignore_errors=True)
    applied = sum(kinds.values())
    print(f"\ndamage battery: {applied} damages over {len(battery_files(tree))} files: {dict(kinds)}; outcomes {dict(counts)}")
    assert applied >= 60 and set(kinds) == set(KINDS), (applied, kinds)
    assert not failures, f"{len(failures)} of {applied} damages:\n" + "\n".join(failures)


def reseal_edited_ledger_entry(path: Path) -> None:
    """What a careful forger does: edit the recorded accuracy and recompute the entry's own sha256."""
    entry = json.loads(path.read_text())["entry"]
    entry["metrics"]["accuracy"] = 0.999
    path.chmod(0o644)
    path.write_bytes(ledger.encode(entry))


@pytest.mark.parametrize("change", ["edited and resealed", "deleted"])
def test_an_edited_or_deleted_ledger_entry_is_named_by_verify_and_refused_by_requalification(battery, tmp_path: Path, change):
    tree, _, commands = battery
    shutil.copytree(tree / "results", tmp_path / "results", symlinks=True)
    shutil.copytree(tree / "scratch", tmp_path / "scratch", symlinks=True)
    entry = next((tmp_path / "results/ledger").rglob("*.json"))
    reseal_edited_ledger_entry(entry) if change == "edited and resealed" else entry.unlink()
    relative = entry.relative_to(tmp_path).as_posix()
    verify = rffm(tmp_path, ["verify", "results"])
    assert verify.code == 1 and any(line.startswith("BROKEN") and names(line, relative) for line in verify.out.splitlines()), verify.out
    outcome = rffm(tmp_path, commands["qualify"])
    assert outcome.code == 2 and outcome.traceback is None, outcome
    refusal = [line for line in outcome.err.splitlines() if line.startswith("rffm qualify: error:")]
    assert len(refusal) == 1 and names(refusal[0], relative) and "ledger entry of this run" in refusal[0], outcome.err
    assert not (tmp_path / RUN / "qualification/sentinel.json").exists()  # no result returned
    if change == "deleted":
        assert not entry.exists()  # nothing claimed again: the exposure is not reset


SAMPLE = {  # real `snakemake --forcerun <rule>` on a few damages: the refusal is the one line in the job's log
    "epoch sentinel put back": (f"{RUN}/epochs/3/sentinel.json", "older", "select_checkpoint", "select_checkpoint/base.log"),
    "ledger entry edited": ("results/ledger", "edit", "qualify", "qualify/base.log"),  # refused by the plan, before any job
    "ledger entry resealed": ("results/ledger", "reseal", "qualify", "qualify/base.log"),
    "ledger entry deleted": ("results/ledger", "delete", "qualify", "qualify/base.log"),
}


@pytest.mark.parametrize("case", sorted(SAMPLE))
def test_a_forced_rule_refuses_damage_in_one_line_under_snakemake(battery, finished_workdir: Path, tmp_path: Path, case: str):
    tree, older, _ = battery
    relative, kind, rule, log = SAMPLE[case]
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    if relative == "results/ledger":
        relative = next(p for p in (workdir / relative).rglob("*.json")).relative_to(workdir).as_posix()
    if kind == "reseal":
        reseal_edited_ledger_entry(workdir / relative)
    else:
        assert damage(workdir / relative, kind, random.Random(SEED), older_counterpart(relative, tree, older))
    result = snakemake(workdir, "--forcerun", rule, check=False)
    assert result.returncode != 0, result.stdout[-2000:]
    # the job's one line in its log, or (a damaged ledger) the plan's one line before any job
    logged = workdir / "results/logs" / log
    message = (logged.read_text() if logged.exists() else "") + result.stdout + result.stderr
    refusals = [line for line in message.splitlines() if re.match(rf"rffm( {rule})?: (error: )?", line) and names(line, relative)]
    # one line: the job's, which Snakemake also echoes from the log (show-failed-logs, profiles/default) on failure
    assert len(set(refusals)) == 1 and "Traceback" not in message, message


REPAIRED = {  # damages whose BROKEN lines' fixes are run as printed: one per kind, over the step folders a run makes
    "dataset split flipped": ("results/datasets/tiny/val.h5", "flip"),
    "cache record truncated": ("results/caches/tiny__mini/provenance.json", "truncate"),
    "epoch checkpoint deleted": (f"{RUN}/epochs/2/checkpoint.pt", "delete"),
    "selection record edited": (f"{RUN}/selection/selection.json", "edit"),
    "epoch sentinel put back": (f"{RUN}/epochs/3/sentinel.json", "older"),
}


@pytest.mark.parametrize("case", sorted(REPAIRED))
def test_the_fix_of_every_broken_line_run_as_printed_leaves_verify_clean(battery, finished_workdir: Path, tmp_path: Path, case: str):
    """Issue 34: each BROKEN line's Fix, run literally in the order printed, repairs the tree: verify is clean after it,
    and the qualified run's records are the ones it had (every step is deterministic; nothing is qualified again)."""
    tree, older, _ = battery
    relative, kind = REPAIRED[case]
    workdir = copy_workdir(finished_workdir, tmp_path / "work")
    qualified = (workdir / RUN / "qualification/metrics.json").read_bytes()
    assert damage(workdir / relative, kind, random.Random(SEED), older_counterpart(relative, tree, older))
    broken = [line for line in rffm(workdir, ["verify", "results"]).out.splitlines() if line.startswith("BROKEN")]
    assert broken and all(" Fix: " in line for line in broken), broken
    environment = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    for fix in dict.fromkeys(line.split(" Fix: ", 1)[1] for line in broken):
        done = subprocess.run(["bash", "-c", fix], cwd=workdir, env=environment, capture_output=True, text=True)
        assert done.returncode == 0, (fix, done.stdout[-2000:], done.stderr[-2000:])
    after = rffm(workdir, ["verify", "results"])
    assert after.code == 0, (broken, after.out)
    assert (workdir / RUN / "qualification/metrics.json").read_bytes() == qualified
