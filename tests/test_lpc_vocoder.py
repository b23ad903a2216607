"""host/data/lpc_vocoder.py: LPC analysis and resynthesis (voice conversion for experiments)."""

import numpy as np

from host.data.lpc_vocoder import convert, random_convert


def _vowelish(seconds=0.6, f0=120.0):
    """A pulse train at f0 through two resonances: a stand-in for a voiced vowel."""
    from scipy.signal import lfilter

    sr = 16000
    n = int(seconds * sr)
    exc = np.zeros(n)
    exc[:: int(sr / f0)] = 1.0
    y = exc
    for f, bw in ((700.0, 80.0), (1200.0, 90.0)):
        r = np.exp(-np.pi * bw / sr)
        y = lfilter([1.0], [1.0, -2 * r * np.cos(2 * np.pi * f / sr), r * r], y)
    return (y / np.abs(y).max() * 8000).astype(np.float32)


def _peak_hz(x):
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return np.argmax(spec) * 16000 / len(x)


def test_resynthesis_from_the_residual_with_no_warp_gives_the_input_back():
    x = _vowelish()
    y = convert(x, formant_scale=1.0, buzz=False)
    assert y.shape == x.shape and y.dtype == np.float32
    assert np.corrcoef(x, y)[0, 1] > 0.999


def test_formant_warp_moves_the_spectral_peak_and_buzz_keeps_length_and_peak():
    x = _vowelish()
    up = convert(x, formant_scale=1.15, buzz=False)
    assert _peak_hz(up) > _peak_hz(x) * 1.05
    y = convert(x, f0_scale=1.3, formant_scale=0.9, buzz=True, rng=np.random.default_rng(0))
    assert y.shape == x.shape and np.isfinite(y).all()
    assert abs(float(np.abs(y).max()) - float(np.abs(x).max())) < 1.0
    z = random_convert(np.random.default_rng(1), x)
    assert z.shape == x.shape and np.isfinite(z).all()
    assert convert(x[:100]).shape == (100,)          # shorter than a frame: returned as it is
    assert np.abs(convert(np.zeros(4000, np.float32))).max() == 0.0   # silence stays silent
