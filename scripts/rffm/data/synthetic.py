"""Seeded RadioML-style synthetic IQ generator (numpy only).

Each example is an independent burst: random symbols or a random band-limited message,
modulated at `sps` samples/symbol, then passed through a channel in RadioML's order:
sample-rate offset and fractional timing -> carrier frequency and phase offset -> static
Rician multipath -> AWGN at a per-sample SNR (signal power over the full band, so the in-band
SNR of the linear modulations is ~7 dB higher) -> unit RMS. See config/README.md, "Synthetic data".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# RadioML 2016's classes, then those of RadioML 2018's "normal" subset it lacks (appended: a class's index
# seeds its examples, so the 2016 classes' examples never change).
RML2016_CLASSES = ["BPSK", "QPSK", "8PSK", "16QAM", "64QAM", "PAM4", "GFSK", "CPFSK", "AM-DSB", "AM-SSB", "WBFM"]
CLASSES = [*RML2016_CLASSES, "OOK", "4ASK", "OQPSK", "GMSK", "AM-DSB-SC", "AM-SSB-SC", "FM"]
LINEAR = {"BPSK", "QPSK", "8PSK", "16QAM", "64QAM", "PAM4", "OOK", "4ASK", "OQPSK"}


@dataclass(frozen=True)
class Impairments:
    """Channel impairment ranges; every draw is uniform in [-max, max] unless noted."""

    cfo_max: float = 5e-4  # cycles/sample
    sro_max: float = 2.5e-4  # relative sample-rate offset
    fading: bool = True
    rician_k: float = 4.0
    phase_noise_std: float = 2e-3  # rad/sample, Wiener process
    iq_gain_db_max: float = 0.5
    iq_phase_deg_max: float = 3.0


@dataclass(frozen=True)
class SyntheticSpec:
    """What to generate: classes x SNR grid x examples per (class, SNR)."""

    classes: list[str] = field(default_factory=lambda: list(RML2016_CLASSES))
    snr_db: list[float] = field(default_factory=lambda: list(range(-20, 20, 2)))
    examples_per_class_snr: int = 100
    length: int = 128
    sps: int | tuple[int, ...] = 8  # a tuple: each example's samples/symbol drawn from it (2018-like bandwidth diversity)
    impairments: Impairments = field(default_factory=Impairments)


def rrc_kernel(beta: float, sps: int, span: int) -> np.ndarray:
    """Unit-energy root-raised-cosine filter kernel."""
    t = np.arange(-span * sps // 2, span * sps // 2 + 1) / sps
    kernel = np.empty_like(t)
    for i, ti in enumerate(t):
        if abs(ti) < 1e-12:
            kernel[i] = 1 - beta + 4 * beta / np.pi
        elif abs(abs(4 * beta * ti) - 1) < 1e-9:
            kernel[i] = beta / np.sqrt(2) * ((1 + 2 / np.pi) * np.sin(np.pi / (4 * beta)) + (1 - 2 / np.pi) * np.cos(np.pi / (4 * beta)))
        else:
            kernel[i] = (np.sin(np.pi * ti * (1 - beta)) + 4 * beta * ti * np.cos(np.pi * ti * (1 + beta))) / (
                np.pi * ti * (1 - (4 * beta * ti) ** 2)
            )
    return kernel / np.sqrt(np.sum(kernel**2))


def gaussian_kernel(bt: float, sps: int, span: int = 4) -> np.ndarray:
    """Gaussian frequency-pulse filter for GFSK, normalised to unit DC gain."""
    t = np.arange(-span * sps // 2, span * sps // 2 + 1) / sps
    a = np.sqrt(np.log(2) / 2) / bt
    kernel = np.sqrt(np.pi) / a * np.exp(-((np.pi * t / a) ** 2))
    return kernel / kernel.sum()


def constellation(name: str) -> np.ndarray:
    """Unit-average-power constellation points of a linear modulation."""
    if name == "BPSK":
        points = np.array([1, -1], complex)
    elif name in ("QPSK", "OQPSK"):
        points = np.exp(1j * (np.pi / 4 + np.pi / 2 * np.arange(4)))
    elif name == "8PSK":
        points = np.exp(1j * 2 * np.pi * np.arange(8) / 8)
    elif name in ("PAM4", "4ASK"):
        points = np.array([-3, -1, 1, 3], complex)
    elif name == "OOK":
        points = np.array([0, 1], complex)
    else:
        side = {"16QAM": 4, "64QAM": 8}[name]
        levels = np.arange(-(side - 1), side, 2)
        points = (levels[:, None] + 1j * levels[None, :]).ravel()
    return points / np.sqrt(np.mean(np.abs(points) ** 2))


def message(n: int, rng: np.random.Generator) -> np.ndarray:
    """Band-limited audio-like message in [-1, 1] with occasional silences."""
    bandwidth = rng.uniform(0.005, 0.03)
    freqs = np.fft.rfftfreq(n)
    spectrum = (rng.standard_normal(freqs.size) + 1j * rng.standard_normal(freqs.size)) * (freqs < bandwidth)
    m = np.fft.irfft(spectrum, n)
    for _ in range(rng.integers(0, 3)):
        m += rng.uniform(0.2, 1) * np.std(m) * np.sin(2 * np.pi * rng.uniform(0.001, bandwidth) * np.arange(n) + rng.uniform(0, 2 * np.pi))
    if rng.random() < 0.2:
        start = rng.integers(0, n)
        m[start : start + rng.integers(n // 8, n // 2)] = 0.0
    return m / (np.max(np.abs(m)) + 1e-12)


def modulate(name: str, n: int, sps: int, rng: np.random.Generator) -> np.ndarray:
    """n complex baseband samples of one modulation at sps samples/symbol."""
    if name in LINEAR:
        kernel = rrc_kernel(rng.uniform(0.2, 0.5), sps, 8)
        symbols = n // sps + 16
        upsampled = np.zeros(symbols * sps, complex)
        upsampled[::sps] = rng.choice(constellation(name), symbols)
        if name == "OQPSK":  # the quadrature rail half a symbol late
            upsampled = upsampled.real + 1j * np.roll(upsampled.imag, sps // 2)
        offset = rng.integers(4 * sps, 5 * sps)
        return np.convolve(upsampled, kernel, mode="same")[offset : offset + n]
    if name in ("GFSK", "CPFSK", "GMSK"):
        symbols = n // sps + 8
        freq = np.repeat(rng.choice([-1.0, 1.0], symbols), sps)
        if name == "GFSK":
            freq = np.convolve(freq, gaussian_kernel(0.35, sps), mode="same")
            index = rng.uniform(0.2, 0.35)
        elif name == "GMSK":  # minimum shift: index 0.5, BT 0.3
            freq = np.convolve(freq, gaussian_kernel(0.3, sps), mode="same")
            index = 0.5
        else:
            index = rng.uniform(0.4, 0.6)
        phase = np.pi * index / sps * np.cumsum(freq)
        offset = rng.integers(2 * sps, 3 * sps)
        return np.exp(1j * phase)[offset : offset + n]
    m = message(n, rng)
    if name == "AM-DSB":
        return (1 + rng.uniform(0.3, 0.9) * m).astype(complex)
    if name == "AM-DSB-SC":
        return m.astype(complex)
    if name in ("AM-SSB", "AM-SSB-SC"):
        spectrum = np.fft.fft(m)
        spectrum[1 : n // 2] *= 2
        spectrum[n // 2 + 1 :] = 0
        return np.fft.ifft(spectrum) + (rng.uniform(0, 0.5) if name == "AM-SSB" else 0)
    if name in ("WBFM", "FM"):
        return np.exp(1j * 2 * np.pi * rng.uniform(0.05, 0.3) * np.cumsum(m))
    raise ValueError(f"unknown synthetic class {name!r}; known: {', '.join(CLASSES)}")


def channel(x: np.ndarray, snr_db: float, imp: Impairments, rng: np.random.Generator) -> np.ndarray:
    """Apply timing/rate offset, CFO and phase, multipath, phase noise, IQ imbalance and AWGN."""
    n = x.size
    grid = np.arange(n)
    t = np.clip(grid * (1 + rng.uniform(-imp.sro_max, imp.sro_max)) + rng.uniform(0, 1), 0, n - 1)
    x = np.interp(t, grid, x.real) + 1j * np.interp(t, grid, x.imag)
    phase = 2 * np.pi * rng.uniform(-imp.cfo_max, imp.cfo_max) * grid + rng.uniform(0, 2 * np.pi)
    phase += np.cumsum(rng.standard_normal(n) * imp.phase_noise_std)
    x = x * np.exp(1j * phase)
    if imp.fading:
        delays, mags, ntap = np.array([0.0, 0.9, 1.7]), np.array([1.0, 0.8, 0.3]), 8
        gains = (rng.standard_normal(3) + 1j * rng.standard_normal(3)) / np.sqrt(2)
        k = imp.rician_k
        gains[0] = np.sqrt(k / (k + 1)) * np.exp(1j * rng.uniform(0, 2 * np.pi)) + np.sqrt(1 / (k + 1)) * gains[0]
        lags = np.arange(ntap) - ntap // 2 + 1
        kernel = sum(g * m * np.sinc(lags - d) for g, m, d in zip(gains, mags, delays, strict=True))
        x = np.convolve(x, kernel / np.sqrt(np.sum(np.abs(kernel) ** 2)), mode="same")
    gain = 10 ** (rng.uniform(-imp.iq_gain_db_max, imp.iq_gain_db_max) / 20)
    skew = np.deg2rad(rng.uniform(-imp.iq_phase_deg_max, imp.iq_phase_deg_max))
    x = x.real + 1j * gain * (x.imag * np.cos(skew) + x.real * np.sin(skew))
    noise_power = np.mean(np.abs(x) ** 2) / 10 ** (snr_db / 10)
    x = x + np.sqrt(noise_power / 2) * (rng.standard_normal(n) + 1j * rng.standard_normal(n))
    return x / np.sqrt(np.mean(np.abs(x) ** 2))


def stratum(spec: SyntheticSpec, seed: int, name: str, snr: float) -> np.ndarray:
    """The examples of one (class, SNR) pair, IQ float32 [examples_per_class_snr, 2, L].

    Each pair has its own random stream, so changing the class list or the SNR grid leaves the
    other pairs' examples unchanged.
    """
    if name not in CLASSES:
        raise ValueError(f"unknown synthetic classes {[name]}; known: {', '.join(CLASSES)}")
    rng = np.random.default_rng([seed, CLASSES.index(name), int(round(snr * 100)) + 100_000])
    iq = np.empty((spec.examples_per_class_snr, 2, spec.length), np.float32)
    for row in range(len(iq)):
        sps = spec.sps if isinstance(spec.sps, int) else int(rng.choice(spec.sps))
        x = channel(modulate(name, spec.length, sps, rng), float(snr), spec.impairments, rng)
        iq[row, 0], iq[row, 1] = x.real, x.imag
    return iq


def generate(spec: SyntheticSpec, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All examples, class-major then SNR: IQ float32 [N, 2, L], labels int64 [N], SNR float32 [N]."""
    unknown = sorted(set(spec.classes) - set(CLASSES))
    if unknown:
        raise ValueError(f"unknown synthetic classes {unknown}; known: {', '.join(CLASSES)}")
    pairs = [(label, name, snr) for label, name in enumerate(spec.classes) for snr in spec.snr_db]
    per = spec.examples_per_class_snr
    iq = np.concatenate([stratum(spec, seed, name, snr) for _, name, snr in pairs]) if pairs else np.empty((0, 2, spec.length), np.float32)
    labels = np.repeat(np.array([label for label, _, _ in pairs], np.int64), per)
    snrs = np.repeat(np.array([snr for _, _, snr in pairs], np.float32), per)
    return iq, labels, snrs
