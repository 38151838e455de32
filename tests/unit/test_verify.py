import json
from pathlib import Path

from rffm.records.step import Step
from rffm.records.verify import verify_tree


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
    assert verify_tree(tmp_path) == (2, [])
    (tmp_path / "runs/r/selection/y.bin").write_bytes(b"z")
    checked, problems = verify_tree(tmp_path)
    assert checked == 2 and len(problems) == 1 and "y.bin" in problems[0]


def test_verify_reports_an_upstream_sentinel_that_changed(tmp_path: Path):
    make_chain(tmp_path)
    path = tmp_path / "datasets/d/sentinel.json"
    body = json.loads(path.read_text())
    body["params_sha256"] = "0" * 64
    path.write_text(json.dumps(body))
    _, problems = verify_tree(tmp_path)
    assert any("upstream dataset sentinel" in p and "changed" in p for p in problems)
