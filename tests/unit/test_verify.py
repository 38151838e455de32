import json
from pathlib import Path

from rffm.ops.verify import verify_tree
from rffm.records.step import Step


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
