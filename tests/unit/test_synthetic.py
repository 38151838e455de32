import numpy as np
import pytest

from rffm.data import synthetic


def small(**overrides) -> synthetic.SyntheticSpec:
    return synthetic.SyntheticSpec(**{"snr_db": [0.0, 10.0], "examples_per_class_snr": 3, "length": 64, **overrides})


def test_generation_is_deterministic_and_unit_power():
    iq, labels, snr = synthetic.generate(small(), seed=3)
    again, _, _ = synthetic.generate(small(), seed=3)
    assert iq.shape == (11 * 2 * 3, 2, 64) and iq.dtype == np.float32
    assert np.array_equal(iq, again)
    power = (iq**2).sum(axis=1).mean(axis=1)
    assert np.allclose(power, 1.0, atol=1e-4)
    assert np.bincount(labels).tolist() == [6] * 11
    assert sorted(set(snr.tolist())) == [0.0, 10.0]


def test_a_class_subset_keeps_the_other_strata_unchanged():
    full, labels, _ = synthetic.generate(small(), seed=1)
    subset, _, _ = synthetic.generate(small(classes=["QPSK", "WBFM"]), seed=1)
    qpsk = synthetic.CLASSES.index("QPSK")
    assert np.array_equal(subset[:6], full[labels == qpsk])


def test_constellations_have_unit_power_and_the_right_size():
    for name, size in {"BPSK": 2, "QPSK": 4, "8PSK": 8, "16QAM": 16, "64QAM": 64, "PAM4": 4}.items():
        points = synthetic.constellation(name)
        assert len(points) == size
        assert np.isclose(np.mean(np.abs(points) ** 2), 1.0)


def test_rrc_kernel_has_unit_energy():
    kernel = synthetic.rrc_kernel(0.35, 8, 8)
    assert np.isclose(np.sum(kernel**2), 1.0)


def test_low_snr_is_noisier_than_high_snr():
    spec = small(classes=["BPSK"], snr_db=[-20.0, 18.0], examples_per_class_snr=20)
    iq, _, snr = synthetic.generate(spec, seed=0)
    z = iq[:, 0] + 1j * iq[:, 1]
    # BPSK at high SNR is nearly constant-envelope-free of noise: check the squared signal's coherence
    coherence = np.abs(np.mean(z**2, axis=1))
    assert coherence[snr == 18].mean() > 3 * coherence[snr == -20].mean()


def test_unknown_class_is_refused():
    with pytest.raises(ValueError, match="unknown synthetic classes"):
        synthetic.generate(small(classes=["BPSK", "OFDM"]), seed=0)


def test_the_2018_classes_extend_the_generator_without_changing_the_2016_ones():
    spec = small(classes=synthetic.CLASSES)
    iq, labels, _ = synthetic.generate(spec, seed=5)
    old, old_labels, _ = synthetic.generate(small(), seed=5)
    assert np.array_equal(iq[labels < 11], old) and np.array_equal(labels[labels < 11], old_labels)
    assert np.allclose((iq**2).sum(axis=1).mean(axis=1), 1.0, atol=1e-4)
    assert synthetic.CLASSES[:11] == synthetic.RML2016_CLASSES
    clean = synthetic.Impairments(cfo_max=0, sro_max=0, fading=False, phase_noise_std=0, iq_gain_db_max=0, iq_phase_deg_max=0)
    rng = np.random.default_rng(0)
    ook = synthetic.modulate("OOK", 256, 8, rng)
    assert np.ptp(np.abs(ook)) > 0.5 and np.allclose(ook.imag, 0)  # on/off keying of a real pulse train
    gmsk = synthetic.modulate("GMSK", 256, 8, rng)
    assert np.allclose(np.abs(gmsk), 1.0)  # constant envelope
    ssb = synthetic.channel(synthetic.modulate("AM-SSB-SC", 1024, 8, rng), 30.0, clean, rng)
    assert abs(np.mean(ssb)) < 0.2  # no carrier


def test_a_list_of_samples_per_symbol_draws_each_examples_bandwidth():
    def bandwidth(sps) -> float:  # mean fraction of the band holding 90 % of the power, BPSK at 30 dB
        iq, _, _ = synthetic.generate(small(classes=["BPSK"], snr_db=[30.0], length=1024, examples_per_class_snr=8, sps=sps), seed=0)
        power = np.abs(np.fft.fft(iq[:, 0] + 1j * iq[:, 1], axis=1)) ** 2
        ordered = np.sort(power, axis=1)[:, ::-1].cumsum(axis=1) / power.sum(axis=1, keepdims=True)
        return float((ordered < 0.9).sum(axis=1).mean() / 1024)

    wide, narrow = bandwidth((4,)), bandwidth((16,))
    assert 2.5 < wide / narrow < 6  # a quarter of the symbol period: about four times the band
    assert narrow < bandwidth((4, 16)) < wide  # a mix of both
