import shutil
from pathlib import Path

from rffm.records import code


def test_code_digest_follows_rffm_imports(tmp_path: Path, monkeypatch):
    closure = code.code_closure("steps.train_epoch")
    expected = {"rffm.steps.train_epoch", "rffm.data.cache_reader", "rffm.data.cache_local", "rffm.model.head", "rffm.records.step"}
    expected.add("rffm.records.files")
    assert expected <= set(closure)
    assert "rffm.cli" not in closure and "rffm.steps.qualify" not in closure
    # editing an imported module changes the digest of every step that imports it
    package = tmp_path / "rffm"
    shutil.copytree(code.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(code, "PACKAGE_DIR", package)
    before = {step: code.code_digest(f"steps.{step}") for step in ("train_epoch", "stage_dataset")}
    (package / "model/head.py").write_text((package / "model/head.py").read_text() + "\n# edited\n")
    assert code.code_digest("steps.train_epoch") != before["train_epoch"]
    assert code.code_digest("steps.stage_dataset") == before["stage_dataset"]
