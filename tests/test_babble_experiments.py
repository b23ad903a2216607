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


def test_bank_floors_raise_levels_to_the_closest_of_the_hardest_bank_windows_only():
    """``enroll_noise.bank_floors``: the floor is measured on the bank windows the keyword's first stage
    scores highest (an easy window closer to the templates does not lower it), sits just under the
    closest of them, raises only thresholds below it, and only the first ``levels`` levels."""
    from types import SimpleNamespace

    from edge import verify as V
    from scripts.enroll_noise import bank_floors

    def state(levels):
        tpl = [np.zeros((4, 3), np.int8)] * 2
        entry = {"verify": V.pack(tpl, (0.1, 0), levels, np.array([0.1]), version=V.VERSION)}
        return SimpleNamespace(keywords=[entry],
                               custom=lambda verify: SimpleNamespace(scores=lambda emb: emb[:, :1]))

    # distance of a window = its one feature; first-stage score = its one embedding value
    ver = SimpleNamespace(sequences=lambda x, v: x, prepare=lambda t, v: t,
                          distance=lambda seqs, prep, version: seqs[:, 0])
    feats = np.array([[0.5], [0.4], [0.05], [0.9]])
    emb = np.array([[0.9], [0.8], [0.1], [0.7]])     # the 0.05 window is the first stage's easiest
    levels = [[1.0, 0.2], [2.0, 0.6], [3.0, 0.1]]
    st = state(levels)
    bank_floors(st, ver, feats, emb, 1.0, hard=2)
    got = st.keywords[0]["verify"]
    np.testing.assert_allclose([t for _, t in got["levels"]], [0.4, 0.6, 0.4], atol=1e-5)
    assert all(t < 0.4 or t == 0.6 for _, t in got["levels"])   # the closest hard window itself does not pass
    assert got["threshold"] == 0.6 and [r for r, _ in got["levels"]] == [1.0, 2.0, 3.0]
    st = state(levels)
    bank_floors(st, ver, feats, emb, 0.5, hard=2, levels=1)
    np.testing.assert_allclose([t for _, t in st.keywords[0]["verify"]["levels"]], [0.2, 0.6, 0.1], atol=1e-6)
    st = state(levels)
    bank_floors(st, ver, feats, emb, 1.0, hard=2, levels=1)
    np.testing.assert_allclose([t for _, t in st.keywords[0]["verify"]["levels"]], [0.4, 0.6, 0.1], atol=1e-5)


def test_verify_where_windows_and_babble_level():
    """``verify_where``'s 0.1 s hops cover the stream in order, and its babble sits ``snr_db`` under the
    speech's own level."""
    from scripts.verify_where import babbled, hop_windows

    pcm = np.arange(40000, dtype=np.int64).astype(np.int16)
    w = hop_windows(pcm)
    assert w.shape == (16, 16000) and w[3, 0] == pcm[4800] and w[-1, -1] == pcm[15 * 1600 + 15999]
    rng = np.random.default_rng(2)
    speech = (np.sin(np.arange(48000) * 0.05) * 3000).astype(np.int16)
    pool = [(rng.standard_normal(6000) * 1000).astype(np.float32) for _ in range(8)]
    out = babbled(speech, 10.0, pool, np.random.default_rng(3))
    noise = out.astype(np.float64) - speech
    ratio_db = 10 * np.log10((speech.astype(np.float64) ** 2).mean() / (noise ** 2).mean())
    assert out.dtype == np.int16 and abs(ratio_db - 10.0) < 0.5
