"""A second data generator, independent of rffm's own (rffm.data.synthetic): RadioML 2018-layout files whose
digital modulations, pulse shapes and fading come from scikit-commpy, under a channel model of its own kind.

No figure should rest only on the generator whose assumptions the backbone's stem was designed with, so this one
shares none of its code or choices: commpy's modems (PSKModem, QAMModem, Modem over ASK and OOK constellations),
commpy's root-raised-cosine and Gaussian pulses (rrcosfilter, gaussianfilter), commpy's flat-fading channel
(SISOFlatChannel: a Rician gain, K drawn per example, then complex AWGN at the labelled SNR over the received
signal's power), a two-path echo (a second ray 1 to 3 symbols late, 3 to 15 dB down), commpy's carrier offset
(add_frequency_offset) and a fractional timing offset; symbol periods of 3, 5, 6, 10 and 12 samples (never rffm's
4, 8 and 16) and roll-offs 0.2 to 0.5. The analog classes (AM-DSB-SC, AM-SSB-SC, FM) modulate a message of random
tones. Labels are the 11 RML2018 'normal' classes; the file is X float32 [N, L, 2], Y one-hot [N, 24] over RadioML
2018.01A's class order, Z SNR dB [N, 1], modulation-major: stage it with `source: radioml2018` and `select: {classes: rml2018-normal}`.

Deterministic: every example's draws come from a numpy Generator seeded by (seed, class, SNR, index); commpy's
channel draws from numpy's global state, which is seeded from the same Generator just before each draw.
"""

from __future__ import annotations

import functools
from pathlib import Path

import h5py
import numpy as np

from rffm.data.radioml import RML2018_CLASSES
from rffm.data.sources import PRESETS

CLASSES = tuple(PRESETS["rml2018-normal"])  # RadioML 2018's 11 'normal' classes
SNRS = tuple(range(-20, 31, 2))  # 26 SNRs, as RadioML 2018.01A
SYMBOL_PERIODS = (3, 5, 6, 10, 12)
ROLL_OFFS = (0.2, 0.3, 0.4, 0.5)
SPAN = 8  # pulse length in symbols


@functools.cache
def modem(name: str):
    """The commpy modem of a digital class (OOK and 4ASK as constellations of their own)."""
    from commpy import modulation

    if name in ("BPSK", "QPSK", "8PSK", "OQPSK", "GMSK"):
        return modulation.PSKModem({"BPSK": 2, "8PSK": 8}.get(name, 4) if name != "GMSK" else 2)
    if name == "16QAM":
        return modulation.QAMModem(16)
    levels = [0.0, 1.0] if name == "OOK" else [-3.0, -1.0, 1.0, 3.0]
    return modulation.Modem(np.array(levels, dtype=complex))


@functools.cache
def rrc(period: int, roll_off: float) -> np.ndarray:
    """commpy's root-raised-cosine taps at `period` samples per symbol, unit energy."""
    from commpy.filters import rrcosfilter

    _, taps = rrcosfilter(SPAN * period + 1, roll_off, 1.0, float(period))
    return taps / np.sqrt(np.sum(taps**2))


@functools.cache
def gaussian(period: int, bt: float = 0.3) -> np.ndarray:
    """commpy's Gaussian frequency pulse for GMSK (BT 0.3), unit area over one symbol's samples."""
    from commpy.filters import gaussianfilter

    sigma = np.sqrt(np.log(2)) / (2 * np.pi * bt)  # in symbols
    _, taps = gaussianfilter(4 * period + 1, np.pi * sigma * np.sqrt(2), 1.0, float(period))
    return taps / taps.sum()


def symbols(name: str, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` random symbols of a digital class at unit mean energy."""
    mapper = modem(name)
    bits = rng.integers(0, 2, count * mapper.num_bits_symbol)
    values = np.asarray(mapper.modulate(bits), dtype=complex)
    return values / np.sqrt(np.mean(np.abs(mapper.constellation) ** 2))


def shaped(values: np.ndarray, taps: np.ndarray, period: int) -> np.ndarray:
    """Symbols upsampled to `period` samples each and filtered with `taps`."""
    train = np.zeros(len(values) * period, dtype=complex)
    train[::period] = values
    return np.convolve(train, taps)


def digital(name: str, samples: int, period: int, roll_off: float, rng: np.random.Generator) -> np.ndarray:
    """A digital class's baseband: pulse-shaped symbols (OQPSK: Q half a symbol late; GMSK: phase of Gaussian-filtered NRZ)."""
    count = samples // period + 2 * SPAN + 2
    if name == "GMSK":
        nrz = np.repeat(symbols("GMSK", count, rng).real, period)
        frequency = np.convolve(nrz, gaussian(period))
        return np.exp(1j * np.pi / 2 * np.cumsum(frequency) / period)
    taps = rrc(period, roll_off)
    if name == "OQPSK":
        values = symbols("QPSK", count, rng)
        i, q = shaped(values.real, taps, period), shaped(values.imag, taps, period)
        return i + 1j * np.concatenate([np.zeros(period // 2), q[: len(q) - period // 2]])
    return shaped(symbols(name, count, rng), taps, period)


def message(samples: int, rng: np.random.Generator) -> np.ndarray:
    """A real message of 3 to 6 random tones below 0.03 cycles per sample, unit power."""
    t = np.arange(samples)
    tones = rng.integers(3, 7)
    signal = sum(rng.uniform(0.3, 1.0) * np.cos(2 * np.pi * rng.uniform(0.002, 0.03) * t + rng.uniform(0, 2 * np.pi)) for _ in range(tones))
    return signal / np.sqrt(np.mean(signal**2))


def analog(name: str, samples: int, rng: np.random.Generator) -> np.ndarray:
    """An analog class's baseband from a random message: double or upper single sideband, or FM."""
    m = message(samples, rng)
    if name == "AM-DSB-SC":
        return m.astype(complex)
    if name == "AM-SSB-SC":
        from scipy.signal import hilbert

        return hilbert(m)
    deviation = rng.uniform(0.02, 0.08)  # peak frequency deviation, cycles per sample
    return np.exp(2j * np.pi * deviation * np.cumsum(m) / np.max(np.abs(m)))


def channel(signal: np.ndarray, snr_db: float, period: int, rng: np.random.Generator) -> np.ndarray:
    """A Rician gain, a delayed echo, carrier offset and complex AWGN at `snr_db` (commpy's SISOFlatChannel)."""
    from commpy.channels import SISOFlatChannel
    from commpy.impairments import add_frequency_offset

    k = 10 ** (rng.uniform(-10, 15) / 10)  # Rician K factor, -10 to 15 dB
    los = round(np.sqrt(k / (k + 1)) * 1024) / 1024  # dyadic: commpy checks los^2 + nlos == 1 exactly
    flat = SISOFlatChannel(fading_param=(complex(los, 0.0), 1 - los * los))
    np.random.seed(int(rng.integers(2**32)))  # commpy draws from numpy's global state
    flat.noise_std = 0.0
    gain = flat.propagate(np.ones(1, dtype=complex))[0] * np.exp(2j * np.pi * rng.uniform())  # one gain per example
    delay = int(rng.integers(period, 3 * period + 1))
    echo = 10 ** (-rng.uniform(3, 15) / 20) * np.exp(2j * np.pi * rng.uniform())
    faded = gain * (signal + echo * np.concatenate([np.zeros(delay, dtype=complex), signal[:-delay]]))
    faded = add_frequency_offset(faded, 1.0, rng.uniform(-0.01, 0.01))
    power = np.mean(np.abs(faded) ** 2)
    flat.set_SNR_dB(snr_db, Es=power)
    np.random.seed(int(rng.integers(2**32)))
    flat.generate_noises(faded.shape)
    return faded + flat.noises


def example(name: str, snr_db: float, length: int, rng: np.random.Generator) -> np.ndarray:
    """One example: complex baseband of `length` samples, unit mean power before noise, a random start and timing offset."""
    period, roll_off = int(rng.choice(SYMBOL_PERIODS)), float(rng.choice(ROLL_OFFS))
    margin = 4 * SPAN * max(SYMBOL_PERIODS)
    if name in ("AM-DSB-SC", "AM-SSB-SC", "FM"):
        signal = analog(name, length + margin, rng)
    else:
        signal = digital(name, length + margin, period, roll_off, rng)
        fraction = rng.uniform()  # a fractional sample of timing offset: linear interpolation between neighbours
        signal = (1 - fraction) * signal[:-1] + fraction * signal[1:]
    signal = signal / np.sqrt(np.mean(np.abs(signal) ** 2))
    received = channel(signal, snr_db, period, rng)
    start = int(rng.integers(margin // 4, margin // 2))
    return received[start : start + length]


def generate(path: str | Path, per_class_snr: int, length: int = 1024, seed: int = 0, classes: tuple[str, ...] = CLASSES) -> int:
    """Write the file (modulation-major, as RadioML 2018.01A); the number of examples."""
    count = len(classes) * len(SNRS) * per_class_snr
    with h5py.File(path, "w") as handle:
        x = handle.create_dataset("X", shape=(count, length, 2), dtype=np.float32)
        y = np.zeros((count, len(RML2018_CLASSES)), dtype=np.int64)
        z = np.zeros((count, 1), dtype=np.int64)
        row = 0
        for c, name in enumerate(classes):
            column = RML2018_CLASSES.index(name)
            for s, snr in enumerate(SNRS):
                block = np.empty((per_class_snr, length, 2), dtype=np.float32)
                for i in range(per_class_snr):
                    rng = np.random.default_rng([seed, c, s, i])
                    signal = example(name, float(snr), length, rng)
                    block[i, :, 0], block[i, :, 1] = signal.real, signal.imag
                x[row : row + per_class_snr] = block
                y[row : row + per_class_snr, column] = 1
                z[row : row + per_class_snr, 0] = snr
                row += per_class_snr
        handle["Y"], handle["Z"] = y, z
        handle.attrs["generator"] = "rffm.data.independent (scikit-commpy)"
    return count
