"""accuracy_vs_snr.png: every class curve is told apart (colour, then line style), and the PNG is deterministic."""

from __future__ import annotations

import itertools

import matplotlib.colors
import numpy as np
import pytest

from rffm.report import qualification
from rffm.report.png import plt

# the 11 classes of RadioML 2016.10a and the 24 of RadioML 2018.01A (names only matter as labels)
RML2016 = ["8PSK", "AM-DSB", "AM-SSB", "BPSK", "CPFSK", "GFSK", "PAM4", "QAM16", "QAM64", "QPSK", "WBFM"]
RML2018 = [f"class{i:02d}" for i in range(24)]


def metrics_for(classes: list[str]) -> tuple[dict, dict]:
    snrs = [str(s) for s in range(-20, 20, 2)]
    rng = np.random.default_rng(0)
    per_class = {name: {k: float(rng.uniform()) for k in snrs} for name in classes}
    overall = {k: float(np.mean([per_class[n][k] for n in classes])) for k in snrs}
    return {"classes": classes, "accuracy_by_snr": overall}, per_class


def class_lines(fig, classes: list[str]) -> list:
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    return [lines[name] for name in classes]


@pytest.mark.parametrize("classes", [RML2016[:4], RML2016, RML2018], ids=["4", "11", "24"])
def test_every_class_curve_differs_from_every_other(classes):
    metrics, per_class = metrics_for(classes)
    fig = qualification.accuracy_vs_snr_figure(metrics, "test", per_class)
    try:
        lines = class_lines(fig, classes)
        looks = [(matplotlib.colors.to_hex(line.get_color()), line.get_linestyle()) for line in lines]
        assert len(set(looks)) == len(classes), [pair for pair, n in itertools.groupby(sorted(looks)) if len(list(n)) > 1]
        if len(classes) <= 20:  # colour alone tells them apart
            assert len({color for color, _ in looks}) == len(classes), looks
        # nothing coloured like the overall curve (black) or the chance line (grey)
        assert not {"#000000", "#808080"} & {color for color, _ in looks}
    finally:
        plt.close(fig)


def test_up_to_ten_classes_keep_the_tab10_colours():
    assert [color for color, _ in qualification.class_styles(10)] == [tuple(c) for c in plt.get_cmap("tab10").colors]


def test_the_png_is_deterministic(tmp_path):
    metrics, per_class = metrics_for(RML2016)
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    qualification.accuracy_vs_snr(metrics, first, "test", per_class)
    qualification.accuracy_vs_snr(metrics, second, "test", per_class)
    assert first.read_bytes() == second.read_bytes() and first.read_bytes().startswith(b"\x89PNG")
