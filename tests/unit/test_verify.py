import json
import subprocess
from pathlib import Path

from rffm.ops.verify import verify_tree
from rffm.records import ledger
from rffm.records.step import Step
from rffm.records.store import PosixStore


def make_chain(root: Path) -> None:
    up = root / "datasets/d"
    with Step("stage_dataset", up, key={}, params={}) as step:
        (up / "x.bin").write_bytes(b"x")
        step.output("x.bin")
    down = root / "runs/r/selection"
    with Step("select_checkpoint", down, key={}, params={}) as step:
        step.consume("dataset", up / "sentinel.json", ["x.bin"])
        (down / "y.bin").write_bytes(b"y")
        step.output("y.bin")


def test_verify_passes_a_clean_tree_and_names_each_broken_file(tmp_path: Path):
    make_chain(tmp_path)
    report = verify_tree(tmp_path)
    assert (report.checked, report.broken, report.stale) == (2, [], [])
    (tmp_path / "runs/r/selection/y.bin").write_bytes(b"z")
    report = verify_tree(tmp_path)
    assert report.checked == 2 and len(report.broken) == 1 and "y.bin" in report.broken[0]


def test_verify_reports_an_upstream_sentinel_that_changed(tmp_path: Path):
    make_chain(tmp_path)
    with Step("stage_dataset", tmp_path / "datasets/d", key={}, params={"seed": 2}) as step:  # it ran again, differently
        (tmp_path / "datasets/d/x.bin").write_bytes(b"x2")
        step.output("x.bin")
    problems = verify_tree(tmp_path).broken
    assert any("upstream dataset sentinel" in p and "changed since" in p for p in problems)


def test_verify_never_crashes_on_a_malformed_sentinel(tmp_path: Path):
    make_chain(tmp_path)
    path = tmp_path / "runs/r/selection/sentinel.json"
    body = json.loads(path.read_text())
    body["outputs"] = {"y.bin": {"sha": "renamed key"}}
    path.write_text(json.dumps(body))
    problems = verify_tree(tmp_path).broken
    assert problems and all(str(path) in p or "selection" in p for p in problems)


def run_fixes(problems: list[str], cwd: Path) -> None:
    """Each problem's Fix, run literally as a shell command, in the order printed (each distinct one once)."""
    for command in dict.fromkeys(problem.split(" Fix: ", 1)[1] for problem in problems):
        subprocess.run(["bash", "-c", command], cwd=cwd, check=True, capture_output=True)


def test_damage_outside_the_step_folders_is_named_with_a_fix_that_works(tmp_path: Path):
    """Issue 34: every BROKEN line names its fix. A ledger entry moved to another run's key, a copy of one, a launch
    record whose profile copy was edited, an artifact no selection records: each fix, run as printed, leaves verify clean."""
    split = "xxh3_128_of_parts:" + "ab" * 16
    store = PosixStore(tmp_path)

    def entry(run: str) -> dict:
        return {"split_digest": split, "run": run, "artifact_sha256": "a" * 64, "metrics": {"accuracy": 0.5}}

    ledger.claim(store, entry("run-a"))
    (tmp_path / ledger.entry_key(split, "run-c")).write_bytes(ledger.encode(entry("run-b")))  # moved: its place is free
    (tmp_path / ledger.entry_key(split, "run-d")).write_bytes(ledger.encode(entry("run-a")))  # a copy: its place is taken
    launch = tmp_path / "runs/r/launch/slurm"
    launch.mkdir(parents=True)
    (launch / "config.yaml").write_text("executor: slurm\n")
    (launch / "launch.json").write_text(json.dumps({"file": "launch/slurm/config.yaml", "sha256": "0" * 64}))
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / f"sha256-{'0' * 64}.pt").write_bytes(b"not those bytes")
    broken = verify_tree(tmp_path).broken
    assert len(broken) == 4 and all(" Fix: " in problem for problem in broken), broken
    run_fixes(broken, tmp_path)
    assert verify_tree(tmp_path).broken == []
    assert ledger.read(store, ledger.entry_key(split, "run-b"))["run"] == "run-b"  # moved back where it belongs
