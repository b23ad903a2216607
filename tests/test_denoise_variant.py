"""scripts/denoise_variant.py: its front ends and its window-recomputing Detector.

The experiment's figures (docs/frontend-and-model.md, "Noise reduction and the log's floor") rest
on two things: the variant front ends are what they say (a clean clip padded with silence is left
alone by the noise subtraction; the clamp bounds a window's depth), and the WindowDetector streams
exactly as the shipped Detector when the front end is the shipped one.
"""

import importlib.util
from pathlib import Path

import numpy as np

from edge import features as F
from edge.detect import Detector, detect_pcm

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("denoise_variant", ROOT / "scripts" / "denoise_variant.py")
dv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dv)


def tone_clip(rng, start=5000, n=6000, level=3000.0):
    x = np.zeros(F.WINDOW_SAMPLES, np.float32)
    t = np.arange(n) / F.SAMPLE_RATE
    x[start:start + n] = level * np.sin(2 * np.pi * (300 + 900 * t) * t) + rng.normal(0, 200, n)
    return x.astype(np.int16)


def test_subtraction_leaves_a_clean_padded_clip_alone_and_lowers_steady_noise():
    rng = np.random.default_rng(0)
    clip = tone_clip(rng)
    den = dv.denoised_mfcc(0.2, 0.05)
    np.testing.assert_allclose(den(clip), F.mfcc(clip), rtol=1e-5, atol=1e-4)
    noisy = np.clip(clip + rng.normal(0, 300, F.WINDOW_SAMPLES), -32768, 32767).astype(np.int16)
    # c0 (the log energy) of the noise-only frames drops, and the word stands further above them
    plain, cleaned = F.mfcc(noisy)[:, 0], den(noisy)[:, 0]
    quiet, word = slice(0, 10), slice(20, 30)
    assert (plain[quiet] - cleaned[quiet]).mean() > 5.0
    assert cleaned[word].mean() - cleaned[quiet].mean() > plain[word].mean() - plain[quiet].mean() + 5.0


def test_clamp_bounds_the_depth_of_a_window():
    rng = np.random.default_rng(1)
    clip = tone_clip(rng)
    clamp = dv.denoised_mfcc(None, 0.05, range_db=45)
    c0 = clamp(clip)[:, 0]
    # digital silence sits at the log floor in the shipped front end, at most 45 dB (in power per
    # mel channel, ~10.4 nats summed by the DCT's c0 over 40 channels / sqrt(40)) under the word here
    assert F.mfcc(clip)[:, 0].min() < c0.min()
    assert c0.max() - c0.min() <= 45 / 10 * np.log(10) * np.sqrt(40) + 1e-3


class _Model:
    """A stand-in keyword model: posteriors from the window's features, deterministic."""

    labels = ["_silence_", "_unknown_", "yes", "no"]
    scale = np.ones(F.N_MFCC, np.float32)

    def infer(self, feats):
        f = np.asarray(feats)
        e = np.stack([f[:, :, 0].mean(1), f[:, :, 1].mean(1), f[:, 20:30, 0].mean(1),
                      f[:, :, 2].std(1)], axis=1)
        p = np.exp(e - e.max(1, keepdims=True))
        return f.reshape(len(f), -1)[:, :8], p / p.sum(1, keepdims=True)


def test_window_detector_streams_exactly_as_the_detector():
    rng = np.random.default_rng(2)
    pcm = np.concatenate([tone_clip(rng, start=int(s)) for s in rng.integers(0, 9000, 6)])
    pcm = np.clip(pcm + rng.normal(0, 50, len(pcm)), -32768, 32767).astype(np.int16)
    km = _Model()
    a = Detector(km, keywords=["yes", "no"], threshold=0.3)
    b = dv.window_detector()(km, keywords=["yes", "no"], threshold=0.3)
    for chunk in (1600, 1024, 333):
        ev_a, ev_b = detect_pcm(a, pcm, chunk), detect_pcm(b, pcm, chunk)
        assert ev_a == ev_b and ev_a
        a.reset()
        b.reset()
