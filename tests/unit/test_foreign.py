"""import_backbone for user backbones (source python / export): what it keeps, what it refuses in one line with nothing written."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from byo import backbones, user_models
from rffm.config import entry_defaults
from rffm.errors import ConfigError, IntegrityError
from rffm.model import foreign
from rffm.records.files import sha256_file
from rffm.steps import import_backbone


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> tuple[Path, dict]:
    """The example model code and small weights, imported from a directory of their own (relative paths, like a checkout)."""
    root = tmp_path_factory.mktemp("byo")
    return root, backbones(user_models(root))


def imported(root: Path, name: str, spec: dict, monkeypatch) -> Path:
    monkeypatch.chdir(root)
    return import_backbone.run(entry_defaults("backbones", {"name": name, **spec}), root / "out" / name)


def nothing_written(out: Path) -> None:
    assert not (out / "sentinel.json").exists() and not (out / "backbone.pt").exists()


def test_pth_and_safetensors_of_the_same_weights_have_one_fingerprint(workdir, monkeypatch, tmp_path):
    root, specs = workdir
    from safetensors.torch import save_file

    state = torch.load(root / "weights/wavesfm_like.pth", weights_only=True)["model"]
    save_file(state, str(tmp_path / "w.safetensors"))
    as_pth = imported(root, "a", specs["waves"], monkeypatch)
    other = {**specs["waves"], "path": str(tmp_path / "w.safetensors"), "sha256": sha256_file(tmp_path / "w.safetensors")}
    other["python"] = {k: v for k, v in other["python"].items() if k != "key"}
    as_safetensors = imported(root, "b", other, monkeypatch)
    one, two = (json.loads(p.read_text())["backbone"] for p in (as_pth, as_safetensors))
    assert one["fingerprint"] == two["fingerprint"]
    assert one["parameters"] == sum(t.numel() for t in state.values()) and one["user_source"]["package"] == "wavesfm_like"
    model, print_ = foreign.load(one, as_pth.parent / "backbone.pt", "backbones.a")
    assert print_ == one["fingerprint"] and not any(p.requires_grad for p in model.parameters())


def test_an_exported_program_is_kept_as_is(workdir, monkeypatch):
    root, specs = workdir
    sentinel = imported(root, "e", specs["exported"], monkeypatch)
    record = json.loads(sentinel.read_text())["backbone"]
    assert record["fingerprint"] == specs["exported"]["sha256"] == sha256_file(sentinel.parent / "backbone.pt")


def one_line(error, *words: str) -> str:
    message = str(error.value)
    assert "\n" not in message and "Fix:" in message and "Traceback" not in message, message
    for word in words:
        assert word in message, message
    return message


def test_a_missing_entry_point_is_one_line(workdir, monkeypatch):
    root, specs = workdir
    spec = {**specs["waves"], "python": {**specs["waves"]["python"], "entry_point": "no_such_module:build"}}
    with pytest.raises(ConfigError) as error:
        foreign.user_source(spec["python"]["entry_point"], "models", "backbones.w")  # what the plan computes first
    one_line(error, "no_such_module", "not found in models")
    spec["python"]["entry_point"] = "wavesfm_like:no_such_factory"
    with pytest.raises(ConfigError) as error:
        imported(root, "m", spec, monkeypatch)
    one_line(error, "no callable 'no_such_factory'")
    nothing_written(root / "out/m")


def test_a_factory_that_raises_is_one_line(workdir, monkeypatch):
    root, specs = workdir
    spec = {**specs["waves"], "python": {**specs["waves"]["python"], "kwargs": {**specs["waves"]["python"]["kwargs"], "segment": 7}}}
    with pytest.raises(ConfigError) as error:
        imported(root, "f", spec, monkeypatch)
    one_line(error, "raised ValueError", "not a multiple of the segment 7")
    nothing_written(root / "out/f")


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_with_code_in_it_is_refused_and_never_run(workdir, monkeypatch, tmp_path):
    root, specs = workdir
    marker, path = tmp_path / "ran", tmp_path / "hostile.pth"
    buffer = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(1)}, "args": Payload(marker)}, buffer)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(IntegrityError) as error:
        imported(root, "h", {**specs["waves"], "path": str(path), "sha256": sha256_file(path)}, monkeypatch)
    one_line(error, str(path), "never loaded")
    assert not marker.exists() and "weights_only=False" not in str(error.value)
    nothing_written(root / "out/h")


def test_missing_and_unexpected_keys_in_strict_mode_are_named(workdir, monkeypatch, tmp_path):
    root, specs = workdir
    state = torch.load(root / "weights/wavesfm_like.pth", weights_only=True)["model"]
    state["decoder.weight"] = state.pop("norm.weight")  # an MAE decoder's key, and the final norm's weight missing
    path = tmp_path / "renamed.pth"
    torch.save({"model": state}, path)
    spec = {**specs["waves"], "path": str(path), "sha256": sha256_file(path)}
    with pytest.raises(ConfigError) as error:
        imported(root, "k", spec, monkeypatch)
    one_line(error, "missing keys [norm.weight]", "unexpected keys [decoder.weight]", "python.strict: false")
    nothing_written(root / "out/k")
    loose = {**spec, "python": {**spec["python"], "strict": False}}
    record = json.loads(imported(root, "k2", loose, monkeypatch).read_text())["backbone"]
    assert record["keys_not_loaded"] == {"missing": ["norm.weight"], "unexpected": ["decoder.weight"]}


def test_a_nested_key_that_is_not_there_is_one_line(workdir, monkeypatch):
    root, specs = workdir
    spec = {**specs["waves"], "python": {**specs["waves"]["python"], "key": "state_dict"}}
    with pytest.raises(ConfigError) as error:
        imported(root, "n", spec, monkeypatch)
    one_line(error, "no key 'state_dict'", "'model'")
    nothing_written(root / "out/n")


def test_weights_that_do_not_fit_the_kwargs_are_one_line_and_its_fix_imports_them(workdir, monkeypatch):
    """Issue 34: torch ends its size-mismatch line with a period; the message keeps one before Fix, not two."""
    root, specs = workdir
    python = specs["waves"]["python"]
    spec = {**specs["waves"], "python": {**python, "kwargs": {**python["kwargs"], "dim": 16}}}
    with pytest.raises(ConfigError) as error:
        imported(root, "s", spec, monkeypatch)
    message = one_line(error, "does not fit the model: size mismatch for ", "Fix: check python.kwargs (widths, depth) against")
    assert ".." not in message and "]). Fix:" in message, message
    nothing_written(root / "out/s")
    # the Fix: python.kwargs as the checkpoint was written (tests/byo.py WAVES)
    assert imported(root, "s", specs["waves"], monkeypatch).exists()


def test_a_module_python_cannot_find_names_python_import_path_and_its_fix_imports_it(workdir, monkeypatch, tmp_path):
    """Issue 34: the step imports the entry point (before it reads its source); a ModuleNotFoundError's Fix names
    python.import_path, and setting it as the Fix says imports the backbone."""
    root, specs = workdir
    code = tmp_path / "code"
    code.mkdir()
    shutil.copyfile(root / "models/wavesfm_like.py", code / "waves_elsewhere.py")
    python = {k: v for k, v in specs["waves"]["python"].items() if k != "import_path"}
    python["entry_point"] = "waves_elsewhere:build"
    with pytest.raises(ConfigError) as error:
        imported(root, "i", {**specs["waves"], "python": python}, monkeypatch)
    one_line(
        error,
        "importing waves_elsewhere failed: ModuleNotFoundError: No module named 'waves_elsewhere'",
        "Fix: set backbones.i.python.import_path to the folder that holds waves_elsewhere/ or waves_elsewhere.py",
    )
    nothing_written(root / "out/i")
    # the Fix, literally: python.import_path set to the folder that holds waves_elsewhere.py
    assert imported(root, "i", {**specs["waves"], "python": {**python, "import_path": str(code)}}, monkeypatch).exists()
