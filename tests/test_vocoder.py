"""edge/adapt/vocoder.py: LPC analysis and resynthesis in numpy (voice conversion of the federated word
copies; host/data/lpc_vocoder.py re-exports it)."""

import numpy as np

from edge.adapt.vocoder import FRAME, ORDER, _frames, convert, levinson, random_convert


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


def test_levinson_solves_the_normal_equations_as_scipy_does_for_every_frame_at_once():
    from scipy.linalg import solve_toeplitz

    x = _vowelish() + np.random.default_rng(0).standard_normal(9600).astype(np.float32) * 50
    frames = _frames(x) * np.hanning(FRAME + 1)[:-1]
    r = np.fft.irfft(np.abs(np.fft.rfft(frames, 512, axis=1)) ** 2, 512, axis=1)[:, : ORDER + 1]
    r = np.vstack([r, np.zeros(ORDER + 1)])                     # and a silent frame
    a, err = levinson(r)
    for k in range(len(r) - 1):
        rk = r[k].copy()
        rk[0] *= 1.0 + 1e-6
        coef = solve_toeplitz(rk[:ORDER], rk[1:])
        assert np.allclose(a[k], np.r_[1.0, -coef], atol=1e-6 * max(1.0, np.abs(coef).max()))
        assert np.isclose(err[k], rk[0] - coef @ rk[1:], rtol=1e-6)
    assert a[-1].tolist() == [1.0] + [0.0] * ORDER and err[-1] == 0.0


def _median_f0(x):
    """The vocoder's own pitch estimate (its LPC residual's autocorrelation), median over voiced frames."""
    from edge.adapt.vocoder import _pitch

    frames = _frames(np.asarray(x, np.float64)) * np.hanning(FRAME + 1)[:-1]
    r = np.fft.irfft(np.abs(np.fft.rfft(frames, 512, axis=1)) ** 2, 512, axis=1)[:, : ORDER + 1]
    a, _ = levinson(r)
    res = np.fft.irfft(np.fft.rfft(frames, 1024, axis=1) * np.fft.rfft(a, 1024, axis=1), 1024, axis=1)[:, :FRAME]
    f0 = _pitch(res)
    return float(np.median(f0[f0 > 0]))


def test_buzz_moves_the_pitch_by_f0_scale():
    x = _vowelish(f0=120.0)
    assert abs(_median_f0(x) - 120.0) < 6.0
    for scale in (0.8, 1.5):
        y = convert(x, f0_scale=scale, formant_scale=1.0, buzz=True, rng=np.random.default_rng(0))
        assert abs(_median_f0(y) - 120.0 * scale) < 0.05 * 120.0 * scale


def test_the_vocoder_needs_no_scipy():
    import subprocess
    import sys

    code = ("import sys; sys.modules['scipy'] = None; import numpy as np; from edge.adapt.vocoder import convert; "
            "y = convert(np.random.default_rng(0).standard_normal(16000).astype(np.float32), 1.6, 1.2); "
            "assert y.shape == (16000,)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_augment_starts_a_share_of_its_copies_from_the_clip_voice_converted():
    """``augment(convert=...)`` (what a federated round's word copies get, ``edge.fl.local.FL_CONVERT``):
    that share of the changed copies carries the converted pitch, the others the clip's own."""
    import pytest

    from edge.adapt.ambient import augment
    from edge.errors import EdgelearnError

    clip = np.zeros(16000, np.float32)
    clip[3000:12600] = _vowelish(f0=120.0)
    clip = clip.astype(np.int16)[None]
    quiet = dict(speed=(1.0, 1.0), shift_s=0.0, snr_db=(80.0, 80.0))
    every = augment(clip, 5, np.random.default_rng(0), convert=(1.0, (1.5, 1.5), (1.1, 1.1)), **quiet)
    assert np.array_equal(every[0], clip[0])                    # the clip itself first, as always
    assert all(abs(_median_f0(c) - 180.0) < 9.0 for c in every[1:])
    plain = augment(clip, 5, np.random.default_rng(0), **quiet)
    assert all(abs(_median_f0(c) - 120.0) < 6.0 for c in plain[1:])
    half = augment(clip, 41, np.random.default_rng(1), convert=(0.5, (1.5, 1.5), (1.1, 1.1)), **quiet)
    moved = sum(abs(_median_f0(c) - 180.0) < 9.0 for c in half[1:])
    assert 10 <= moved <= 30                                    # 40 draws at 0.5
    for bad in ((1.5, (1.5, 2.0), (1.1, 1.2)), (0.5, (2.0, 1.5), (1.1, 1.2)), (0.5, (0.0, 1.5), (1.1, 1.2)),
                (0.5, (1.5,), (1.1, 1.2)), ("x", (1.5, 2.0), (1.1, 1.2)), (0.5,)):
        with pytest.raises(EdgelearnError, match="voice conversion"):
            augment(clip, 3, np.random.default_rng(0), convert=bad)
