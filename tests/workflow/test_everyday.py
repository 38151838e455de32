"""Everyday use on a finished run: experimenting destroys nothing; stale is not broken (issue 15)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, planned_jobs, snakemake, tiny_config, write_config
from rffm.records.files import read_json, sha256_file

pytestmark = pytest.mark.workflow
RUN = Path("results/runs/base")


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def rffm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rffm"), *args], cwd=cwd, capture_output=True, text=True)


def test_changing_a_qualified_run_is_refused_before_anything_runs_or_is_deleted(workdir: Path):
    before = tree_bytes(workdir / "results")
    config = tiny_config()
    config["runs"]["base"]["train"]["lr"] = 0.02
    write_config(workdir, config)
    result = snakemake(workdir, check=False)
    assert result.returncode != 0
    refusal = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("rffm: runs.base was qualified")]
    assert len(refusal) == 1 and "runs.base.train.lr" in refusal[0] and "Fix: give the changed run a new id" in refusal[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert tree_bytes(workdir / "results") == before  # nothing ran, nothing was deleted
    dry = snakemake(workdir, "-n", check=False)
    assert dry.returncode != 0 and "rffm: runs.base was qualified" in dry.stdout + dry.stderr

    # experimenting on the run without qualifying is allowed; every artifact ever selected stays in the store
    first = read_json(workdir / RUN / "selection/selection.json")["artifact_path"]
    snakemake(workdir, "validation_selection")
    second = read_json(workdir / RUN / "selection/selection.json")["artifact_path"]
    assert second != first and (workdir / "results" / first).exists() and (workdir / "results" / second).exists()
    for artifact in (first, second):
        assert sha256_file(workdir / "results" / artifact) == Path(artifact).name.removeprefix("sha256-").removesuffix(".pt")

    # putting the settings back brings the qualified run back: its result is recalled, byte for byte
    write_config(workdir, tiny_config())
    snakemake(workdir)
    after = tree_bytes(workdir / "results")
    for name in ("qualification/metrics.json", "qualification/accuracy_vs_snr.png"):
        assert after[str(RUN.relative_to("results") / name)] == before[str(RUN.relative_to("results") / name)], name
    # the manifest too, but for its provenance, which now names the epochs restored from the memo (issue 23)
    manifests = [json.loads(tree[str(RUN.relative_to("results") / "qualification/run_manifest.json")]) for tree in (before, after)]
    assert [{k: v for k, v in m.items() if k != "provenance"} for m in manifests][0] == {
        k: v for k, v in manifests[1].items() if k != "provenance"
    }
    assert [e["epoch"] for e in manifests[1]["provenance"]["restored_epochs"]] == [1, 2, 3]
    assert rffm("verify", "results", "--config", "config.yaml", cwd=workdir).returncode == 0


def test_stale_is_not_broken_and_prune_removes_exactly_it(workdir: Path):
    config = tiny_config()
    config["runs"]["base"]["train"]["epochs"] = 5  # more epochs, as an experiment, then put back
    write_config(workdir, config)
    snakemake(workdir, "validation_selection")
    config = tiny_config()
    config["runs"]["extra"] = {**config["runs"]["base"], "train": {**config["runs"]["base"]["train"], "seed": 1}}
    config["runs"]["extra"].pop("profiling")
    write_config(workdir, config)  # epochs back to 3, and another run, qualified
    snakemake(workdir)
    write_config(workdir, tiny_config())  # the other run removed again
    assert planned_jobs(workdir) == []

    # the tree's records still say a config planned `extra` (removed since without running the workflow):
    # judged by config.yaml only when told so
    JUDGED = ("results", "--config", "config.yaml", "--by-config")
    verify = rffm("verify", *JUDGED, cwd=workdir)
    assert verify.returncode == 0, verify.stdout
    stale = sorted(line.split()[1] for line in verify.stdout.splitlines() if line.startswith("STALE"))
    expected = ["results/runs/base/epochs/4", "results/runs/base/epochs/5"]
    expected += [f"results/runs/extra/{folder}" for folder in ("epochs/1", "epochs/2", "epochs/3", "qualification")]
    expected += [f"results/runs/extra/{folder}" for folder in ("report/qualification", "report/validation", "selection")]
    assert stale == sorted(expected)
    status = rffm("status", *JUDGED, cwd=workdir)
    assert status.returncode == 0 and "base  qualified  3/3" in status.stdout and "stale: runs/extra" in status.stdout

    listed = rffm("prune", *JUDGED, cwd=workdir)
    assert sorted(line.split()[1] for line in listed.stdout.splitlines() if line.startswith("stale ")) == sorted(expected)
    assert all((workdir / folder).exists() for folder in expected)  # a dry run first
    kept = {p for p in (workdir / "results").rglob("*") if p.is_file() and p.parts[-1] != "sentinel.json"}
    rffm("prune", *JUDGED, "--delete", "--delete-qualified", "extra", cwd=workdir)  # extra is qualified: named
    assert not any((workdir / folder).exists() for folder in expected)
    assert len(list((workdir / "results/ledger").rglob("*.json"))) == 2  # the ledger keeps both qualifications
    assert (workdir / "results/runs/extra/launch").exists() or not (workdir / "results/runs/extra").exists()
    remaining = {p for p in kept if p.exists()}
    assert all(not any(str(p).startswith(str(workdir / f)) for f in expected) for p in remaining)
    assert rffm("verify", *JUDGED, cwd=workdir).returncode == 0
    assert planned_jobs(workdir) == []
