from pathlib import Path

import pytest

from rffm.errors import ExposureError
from rffm.records import ledger


def test_ledger_recalls_refuses_and_counts(tmp_path: Path):
    with ledger.locked(tmp_path) as path:
        assert ledger.recorded(path, "split", "run-a", "art-1") is None
        ledger.record(path, "split", "run-a", "art-1", {"accuracy": 0.5})
        assert ledger.recorded(path, "split", "run-a", "art-1")["metrics"] == {"accuracy": 0.5}
        with pytest.raises(ExposureError, match="already spent its test exposure"):
            ledger.recorded(path, "split", "run-a", "art-2")
        assert ledger.recorded(path, "split", "run-b", "art-2") is None
        ledger.record(path, "split", "run-b", "art-2", {"accuracy": 0.6})
        ledger.record(path, "split", "run-c", "art-2", {"accuracy": 0.6})
        assert ledger.exposure_count(path, "split") == 2
        assert ledger.exposure_count(path, "another-split") == 0
