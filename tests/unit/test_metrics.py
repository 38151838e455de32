import numpy as np
import pytest

from rffm.model.metrics import confusion_matrix, macro_f1, summarize


def test_confusion_and_macro_f1():
    labels = np.array([0, 0, 1, 1, 2, 2])
    predictions = np.array([0, 1, 1, 1, 2, 0])
    confusion = confusion_matrix(labels, predictions, 3)
    assert confusion.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    f1 = [2 * 1 / (2 + 2), 2 * 2 / (3 + 2), 2 * 1 / (1 + 2)]
    assert macro_f1(confusion) == pytest.approx(np.mean(f1))


def test_summary_per_class_and_snr():
    labels = np.array([0, 0, 1, 1])
    summary = summarize(labels, np.array([0, 1, 1, 1]), np.array([-10.0, 10.0, -10.0, 10.0]), ["a", "b"])
    assert summary["accuracy"] == 0.75
    assert summary["accuracy_by_class"] == {"a": 0.5, "b": 1.0}
    assert summary["accuracy_by_snr"] == {"-10": 1.0, "10": 0.5}
    assert summary["accuracy_high_snr"] == {"min_snr_db": 10.0, "accuracy": 0.5}
    assert summary["accuracy_by_class_and_snr"]["a"] == {"-10": 1.0, "10": 0.0}
