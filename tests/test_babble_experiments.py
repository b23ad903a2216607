"""The babble experiments' scoring over a phrase's span (scripts/enroll_noise.py, scripts/babble_where.py):
the detector-side form computed from normalised cepstra is the log-mel form it claims to be."""

import numpy as np
import pytest

from scripts.babble_where import SpanMasked
from scripts.enroll_noise import span_frames, span_window


@pytest.fixture(scope="module")
def km():
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys

    return KeywordModel(load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys()))


def test_span_window_is_the_window_with_the_frames_around_the_span_set_to_its_mean(km):
    rng = np.random.default_rng(4)
    pcm = (rng.standard_normal((3, 16000)) * np.linspace(200, 6000, 16000)).astype(np.int16)
    for frames in (20, 29, 48):
        masked = SpanMasked(km, "mean")
        masked.frames = frames
        got = span_window(km.features(pcm), frames)
        np.testing.assert_allclose(got, masked.features(pcm), atol=1e-4)
        a = (49 - frames) // 2
        assert not got[:, :a].any() and not got[:, a + frames:].any()
        np.testing.assert_allclose(got[:, a:a + frames].mean(axis=1), 0, atol=1e-5)
    # the whole window is left as it is; other fills differ from the mean's
    np.testing.assert_array_equal(span_window(km.features(pcm), 49), km.features(pcm))
    silence = SpanMasked(km, "silence")
    silence.frames = 29
    assert np.abs(silence.features(pcm) - span_window(km.features(pcm), 29)).max() > 0.1


def test_span_frames_is_the_longest_clips_speech_plus_margins_rounded_up():
    clip = np.zeros(14000, np.int16)
    clip[4000:10000] = (np.sin(np.arange(6000) * 0.3) * 8000).astype(np.int16)  # 0.375 s of tone
    short = clip.copy()
    short[8000:10000] = 0                                                       # 0.25 s
    n = span_frames([short, clip], "tone", 0.0)
    assert n % 4 == 0 and 20 <= n <= 24  # the longer clip's ~19 frames of 20 ms, rounded up to a multiple of 4
    assert span_frames([short], "tone", 0.0) < n
    assert span_frames([short, clip], "tone", 0.06) in (n + 4, n + 8)  # 3 frames each side, rounded
    assert span_frames([clip], "tone", 1.0) == 49  # never more than the window
