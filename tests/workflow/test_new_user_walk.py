"""Issue 50: every everyday command on the tree of every kind of run (base, floor, user backbones, sweep, label-scarce,
end-to-end reference): no traceback, `--json` prints JSON only, and `rffm mlflow` logs every kind."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, copy_workdir

pytestmark = pytest.mark.workflow


@pytest.fixture(scope="module")
def tree(matrix_tree: Path, tmp_path_factory) -> Path:
    """A private copy of the qualified tree of every kind of run (the commands may write beside it)."""
    return copy_workdir(matrix_tree, tmp_path_factory.mktemp("walk") / "work")


def rffm(tree: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"}
    return subprocess.run([str(BIN / "rffm"), *args], cwd=tree, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "args",
    [
        ["status", "results"],
        ["status", "results", "--full"],
        ["compare", "results"],
        ["verify", "results"],
        ["prune", "results"],
        ["tensorboard", "results", "--log-dir", "tb"],
    ],
    ids=lambda args: " ".join(args[:1] + args[2:]),
)
def test_no_everyday_command_ends_in_a_traceback(tree: Path, args: list[str]):
    done = rffm(tree, *args)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize("verb", ["status", "compare"])
def test_json_flag_prints_json_only_on_stdout(tree: Path, verb: str):
    done = rffm(tree, verb, "results", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout)["rows"]  # the whole of stdout, as `rffm status --json | jq` reads it
    assert {row["run"] for row in rows} >= {"base", "floor", "sweep", "scarce", "cnn"}
    assert rffm(tree, verb, "results").stdout.strip() in done.stderr  # the table, for the reader, on stderr


def test_mlflow_logs_every_kind_of_run_once(tree: Path, tmp_path: Path):
    """The reference's manifest has no training.epochs (it was a KeyError that stopped every run after it)."""
    import mlflow

    store = (tmp_path / "mlruns").as_uri()
    first = rffm(tree, "mlflow", "results", "--tracking-uri", store)
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr[-3000:]
    qualified = sorted(p.parent.parent.name for p in (tree / "results/runs").glob("*/qualification/run_manifest.json"))
    assert {"base", "floor", "sweep", "scarce", "cnn"} <= set(qualified)
    logged = dict(line.split(": ", 1) for line in first.stdout.splitlines())
    assert sorted(logged) == qualified and all(v.startswith("logged ") for v in logged.values()), first.stdout
    again = rffm(tree, "mlflow", "results", "--tracking-uri", store)
    assert again.stdout.count("already logged") == len(qualified), again.stdout

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # this process reads the file store too
    client = mlflow.MlflowClient(tracking_uri=store)
    run = client.get_run(logged["cnn"].split()[-1])
    history = json.loads((tree / "results/runs/cnn/selection/history.json").read_text())["epochs"]
    recorded = client.get_metric_history(run.info.run_id, "val_accuracy")
    assert [(m.step, m.value) for m in recorded] == [(e["epoch"], e["val_accuracy"]) for e in history]
    assert run.data.params["kind"] == "end_to_end" and run.data.params["model.width"] == "8"
    sweep = client.get_run(logged["sweep"].split()[-1])
    assert sweep.data.params["selection.member"].startswith("lr")
