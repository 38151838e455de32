"""The second, independent data generator (rffm.data.independent, scikit-commpy): RadioML 2018's layout, seeded,
its classes told apart by what defines them, and staged by the radioml2018 source like the real file."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import stage
from rffm.data import independent
from rffm.data.radioml import RML2018_CLASSES
from rffm.records.files import read_json


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("independent") / "commpy.hdf5"
    assert independent.generate(path, per_class_snr=3, length=1024, seed=3) == 11 * 26 * 3
    return path


def test_the_file_has_radioml2018s_layout_and_the_same_seed_gives_the_same_bytes(generated: Path, tmp_path: Path):
    with h5py.File(generated, "r") as handle:
        x, y, z = handle["X"][:], handle["Y"][:], handle["Z"][:]
    assert x.shape == (858, 1024, 2) and x.dtype == np.float32 and np.isfinite(x).all()
    assert y.shape == (858, len(RML2018_CLASSES)) and (y.sum(axis=1) == 1).all()
    names = [RML2018_CLASSES[i] for i in y.argmax(axis=1)]
    assert names[::78] == list(independent.CLASSES)  # modulation-major, 26 SNRs x 3 each
    assert sorted(set(z[:, 0].tolist())) == list(range(-20, 31, 2))
    again = tmp_path / "again.hdf5"
    independent.generate(again, per_class_snr=3, length=1024, seed=3)
    with h5py.File(again, "r") as handle:
        assert np.array_equal(handle["X"][:], x)
    independent.generate(again, per_class_snr=3, length=1024, seed=4)
    with h5py.File(again, "r") as handle:
        assert not np.array_equal(handle["X"][:], x)


def test_each_class_shows_what_defines_it_at_high_snr(generated: Path):
    """Constant-envelope classes (FM, GMSK) vary least in amplitude; OOK, the on-off class, most; 4ASK and 16QAM between."""
    with h5py.File(generated, "r") as handle:
        x, y, z = handle["X"][:], handle["Y"][:], handle["Z"][:, 0]
    envelope = np.hypot(x[..., 0], x[..., 1])
    spread = envelope.std(axis=1) / envelope.mean(axis=1)
    names = np.array([RML2018_CLASSES[i] for i in y.argmax(axis=1)])

    def median(name: str) -> float:
        return float(np.median(spread[(names == name) & (z >= 20)]))

    assert max(median("FM"), median("GMSK")) < min(median("16QAM"), median("4ASK"), median("AM-DSB-SC")) < median("OOK")


def test_the_file_stages_as_radioml2018_with_the_normal_classes(generated: Path, tmp_path: Path):
    spec = {"name": "commpy", "source": "radioml2018", "seed": 0, "radioml2018": {"path": str(generated)}}
    spec["splits"] = {"train": 0.34, "val": 0.33, "test": 0.33}  # 3 per (class, SNR): one of each
    out = stage({**spec, "select": {"classes": "rml2018-normal"}}, tmp_path / "staged")
    facts = read_json(out)["dataset"]  # the staged sentinel
    assert facts["classes"] == list(independent.CLASSES) and sum(facts["counts"].values()) == 858
