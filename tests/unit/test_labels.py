"""The label-scarce subset (rffm.training.labels): nested in k, k per (class, SNR) cell, deterministic, seeded apart from train.seed."""

from __future__ import annotations

import numpy as np

from rffm.training.labels import labelled_rows, options_rows, subset_facts


def split(per_cell: int = 12, classes: int = 3, snrs: tuple[float, ...] = (-10.0, 0.0, 10.0)):
    """Shuffled labels and SNRs of a split with `per_cell` rows in every (class, SNR) cell but one short cell."""
    labels = np.repeat(np.arange(classes), per_cell * len(snrs))
    snr = np.tile(np.repeat(np.asarray(snrs), per_cell), classes)
    keep = ~((labels == 0) & (snr == 10.0)) | (np.arange(len(labels)) % per_cell < 2)  # cell (0, 10 dB) has 2 rows
    order = np.random.default_rng(7).permutation(int(keep.sum()))
    return labels[keep][order], snr[keep][order]


def cells(labels, snr, rows) -> dict[tuple[int, float], int]:
    found: dict[tuple[int, float], int] = {}
    for row in rows:
        found[(int(labels[row]), float(snr[row]))] = found.get((int(labels[row]), float(snr[row])), 0) + 1
    return found


def test_k_rows_per_cell_and_all_of_a_short_cell():
    labels, snr = split()
    rows = labelled_rows(labels, snr, 5, 0)
    counts = cells(labels, snr, rows)
    assert counts.pop((0, 10.0)) == 2
    assert set(counts.values()) == {5} and len(counts) == 8
    assert np.all(np.diff(rows) > 0)


def test_nested_in_k_and_deterministic():
    labels, snr = split()
    small, large = labelled_rows(labels, snr, 3, 4), labelled_rows(labels, snr, 8, 4)
    assert set(small) <= set(large)
    assert np.array_equal(small, labelled_rows(labels, snr, 3, 4))
    assert not np.array_equal(small, labelled_rows(labels, snr, 3, 5))  # labels_seed chooses other rows


def test_none_is_every_row_and_rows_without_snr_are_cells_per_class():
    labels, snr = split()
    assert np.array_equal(labelled_rows(labels, snr, None, 0), np.arange(len(labels)))
    rows = labelled_rows(labels, np.full(len(labels), np.nan), 4, 0)
    assert sorted(np.bincount(labels[rows])) == [4, 4, 4]


def test_the_train_block_chooses_by_k_and_labels_seed_never_by_seed():
    labels, snr = split()
    head = {"seed": 0, "lr": 0.01, "batch_size": 16, "labels_per_class_snr": 5, "labels_seed": 0}
    cnn = {"seed": 9, "lr": 0.003, "batch_size": 256, "weight_decay": 0.01, "labels_per_class_snr": 5, "labels_seed": 0}
    rows = options_rows(head, labels, snr)
    assert np.array_equal(rows, options_rows(cnn, labels, snr))
    assert len(options_rows({"seed": 0}, labels, snr)) == len(labels)
    assert subset_facts(head, rows, len(labels)) == {
        "labels_per_class_snr": 5,
        "labels_seed": 0,
        "labelled_rows": 42,
        "train_rows": len(labels),
    }
