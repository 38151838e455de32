"""The label-scarce subset: which train rows a head or a reference CNN may read labels of (train.labels_per_class_snr).

For each (class, SNR) cell of the train split (per class where rows have no SNR) the cell's rows are
ranked by one permutation of all rows seeded by train.labels_seed, and the first k are kept. The choice
depends on the split's labels and SNRs, k and the seed only (never on the model or train.seed), so a
frozen run and a reference with the same k and labels_seed train on the same rows, and the k = 5 subset
lies inside the k = 20 one. A cell with fewer than k rows gives all of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def labelled_rows(labels: np.ndarray, snr_db: np.ndarray, per_cell: int | None, seed: int) -> np.ndarray:
    """Sorted row indices of the labelled subset: the first `per_cell` of each cell in a seeded ranking (all rows when None)."""
    count = len(labels)
    if per_cell is None:
        return np.arange(count)
    rank = np.empty(count, np.int64)
    rank[np.random.default_rng(seed).permutation(count)] = np.arange(count)
    snr = np.asarray(snr_db, np.float64)
    snr = np.where(np.isnan(snr), np.inf, snr)  # rows of unknown SNR: one cell per class
    order = np.lexsort((rank, snr, np.asarray(labels)))  # by class, then SNR, then rank
    cell_labels, cell_snr = np.asarray(labels)[order], snr[order]
    starts = np.flatnonzero(np.r_[True, (cell_labels[1:] != cell_labels[:-1]) | (cell_snr[1:] != cell_snr[:-1])])
    position = np.arange(count) - np.repeat(starts, np.diff(np.r_[starts, count]))
    return np.sort(order[position < per_cell])


def options_rows(options: dict[str, Any], labels: np.ndarray, snr_db: np.ndarray) -> np.ndarray:
    """The labelled rows a train block asks for (labels_per_class_snr absent: every row)."""
    per_cell = options.get("labels_per_class_snr")
    return labelled_rows(labels, snr_db, per_cell, int(options["labels_seed"]) if per_cell is not None else 0)


def subset_facts(options: dict[str, Any], rows: np.ndarray, train_count: int) -> dict[str, Any]:
    """What provenance records of the subset: k (None: all), its seed and how many labelled rows were used."""
    return {
        "labels_per_class_snr": options.get("labels_per_class_snr"),
        "labels_seed": options.get("labels_seed"),
        "labelled_rows": int(len(rows)),
        "train_rows": int(train_count),
    }
