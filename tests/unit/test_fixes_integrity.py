"""Issue 34, acceptance 2: an integrity refusal whose Fix needs no workflow run — an input file that ends before the
data it declares (cut short while it was read: a copy still in progress). It is provoked, its Fix is done as written
(the file copied again) and the same read then returns the rows. The refusals whose Fix reruns part of the workflow
are followed in tests/workflow/test_fixes_integrity_workflow.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from fixes import fix_of
from rfdata import write_canonical_hdf5
from rffm.data.sources import RowReader
from rffm.errors import DataError


def test_a_source_cut_short_while_it_is_read_is_fixed_by_copying_it_again(tmp_path: Path):
    iq = np.arange(64 * 2 * 32, dtype=np.float32).reshape(64, 2, 32)
    original = write_canonical_hdf5(tmp_path / "original.h5", iq, np.zeros(64, np.int64), ["a"])
    copy = shutil.copyfile(original, tmp_path / "copy.h5")
    rows = np.arange(48, 64)
    with h5py.File(copy, "r") as handle:
        reader = RowReader(Path(copy), handle["iq"])
        assert reader.fd is not None  # contiguous float32: read with pread, where a short file shows
        os.truncate(copy, reader.base + 40 * reader.row_bytes)  # the copy is cut short while it is read
        with pytest.raises(DataError) as caught:
            reader.read(rows)
        assert str(caught.value).startswith(f"{copy}: file ends at byte ")
        os.close(reader.fd)
    assert fix_of(caught) == "the file is truncated; copy it again."
    shutil.copyfile(original, copy)
    with h5py.File(copy, "r") as handle:  # the same read, of the file copied again
        reader = RowReader(Path(copy), handle["iq"])
        assert np.array_equal(reader.read(rows), iq[rows])
        os.close(reader.fd)
