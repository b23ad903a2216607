"""The front end against librosa (the oracle) and against itself, streaming vs batch."""

import numpy as np
import pytest

from edge import features as F

librosa = pytest.importorskip("librosa")


def librosa_mfcc(x_int16: np.ndarray) -> np.ndarray:
    """librosa configured to the front end's parameters (docs/frontend-and-model.md).

    librosa frames n_fft (512) samples with the 480-sample window centred in
    them, so frame k covers [320k + 16, 320k + 496); padding 16 samples on each
    side lines its frames up with ours, [320k, 320k + 480).
    """
    y = np.pad(x_int16.astype(np.float32) / 32768.0, (16, 16))
    S = np.abs(librosa.stft(y, n_fft=512, hop_length=320, win_length=480, window="hann",
                            center=False)) ** 2
    M = librosa.filters.mel(sr=16000, n_fft=512, n_mels=40, fmin=20, fmax=4000, htk=True, norm=None)
    logmel = np.log(np.maximum(M @ S, 1e-6))
    return librosa.feature.mfcc(S=logmel, n_mfcc=10, dct_type=2, norm="ortho").T


def signals():
    rng = np.random.default_rng(0)
    t = np.arange(16000) / 16000
    yield "noise", (rng.standard_normal(16000) * 3000).astype(np.int16)
    yield "chirp", (8000 * np.sin(2 * np.pi * (200 + 1800 * t) * t)).astype(np.int16)
    yield "silence", np.zeros(16000, np.int16)
    yield "full-scale", np.where(rng.random(16000) > 0.5, 32767, -32768).astype(np.int16)


@pytest.mark.parametrize("name,x", list(signals()))
def test_matches_librosa(name, x):
    ours = F.mfcc(x)
    ref = librosa_mfcc(x)
    assert ours.shape == (49, 10) and ours.dtype == np.float32
    assert ref.shape == ours.shape
    np.testing.assert_allclose(ours, ref, atol=2e-4 * max(1.0, np.abs(ref).max()))


def test_components_match_librosa():
    M = librosa.filters.mel(sr=16000, n_fft=512, n_mels=40, fmin=20, fmax=4000, htk=True, norm=None)
    np.testing.assert_allclose(F.mel_matrix(), M.T, atol=1e-6)
    import scipy.signal

    np.testing.assert_allclose(F.hann_window(), scipy.signal.get_window("hann", 480), atol=1e-7)


def test_int16_and_float_inputs_agree():
    x = (np.random.default_rng(1).standard_normal(16000) * 2000).astype(np.int16)
    np.testing.assert_allclose(F.mfcc(x), F.mfcc(x.astype(np.float32) / 32768.0), atol=1e-5)


def test_batch_equals_single():
    x = (np.random.default_rng(2).standard_normal((3, 16000)) * 2000).astype(np.int16)
    b = F.mfcc(x)
    assert b.shape == (3, 49, 10)
    for i in range(3):
        np.testing.assert_array_equal(b[i], F.mfcc(x[i]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_equals_batch_for_any_chunking(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(3 * 16000 + 123) * 2000).astype(np.int16)
    stream = F.MfccStream()
    got, i = [], 0
    while i < len(x):
        n = int(rng.choice([1, 7, 160, 319, 320, 321, 480, 1000, 4000]))
        got.append(stream.push(x[i:i + n]))
        i += n
    frames = np.concatenate(got)
    expected_frames = 1 + (len(x) - 480) // 320
    assert frames.shape == (expected_frames, 10)
    assert stream.frames_emitted == expected_frames
    # Any 1 s window starting on a hop boundary equals the batch MFCC of that second.
    for start in (0, 17, 49, 97):
        np.testing.assert_allclose(frames[start:start + 49], F.mfcc(x[start * 320:start * 320 + 16000]),
                                   atol=1e-5)


def test_stream_emits_one_frame_per_hop():
    s = F.MfccStream()
    assert s.push(np.zeros(479, np.int16)).shape == (0, 10)
    assert s.push(np.zeros(1, np.int16)).shape == (1, 10)
    assert s.push(np.zeros(319, np.int16)).shape == (0, 10)
    assert s.push(np.zeros(1, np.int16)).shape == (1, 10)


def test_short_input_is_a_clear_error():
    with pytest.raises(ValueError, match="16000 samples"):
        F.mfcc(np.zeros(8000, np.int16))
    with pytest.raises(TypeError, match="int16"):
        F.mfcc(np.zeros(16000, np.int32))


def test_normalize_removes_window_mean_and_scales():
    f = np.random.default_rng(3).standard_normal((49, 10)).astype(np.float32) + 5
    scale = np.arange(1, 11, dtype=np.float32)
    n = F.normalize(f, scale)
    np.testing.assert_allclose(n.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(n * scale + f.mean(0), f, atol=1e-5)


def test_fit_to_window():
    x = np.arange(100, dtype=np.int16)
    y = F.fit_to_window(x)
    assert len(y) == 16000 and y[7950] == 0 and y[7951] == 1
    z = F.fit_to_window(np.arange(20000, dtype=np.int16))
    assert len(z) == 16000 and z[0] == 2000
