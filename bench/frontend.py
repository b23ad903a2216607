"""Front end: ours (numpy, edge/features.py) vs librosa configured identically, same audio, same run.

Reports max |difference| of the 49x10 MFCC and time per 1 s window for the batch
path, plus our streaming path (one 20 ms hop at a time).

    $ edgelearn bench frontend
"""

from __future__ import annotations

import numpy as np

from bench.common import row, timeit, write_results


def librosa_mfcc(x):
    import librosa

    y = np.pad(x.astype(np.float32) / 32768.0, (16, 16))
    S = np.abs(librosa.stft(y, n_fft=512, hop_length=320, win_length=480, window="hann", center=False)) ** 2
    M = librosa.filters.mel(sr=16000, n_fft=512, n_mels=40, fmin=20, fmax=4000, htk=True, norm=None)
    return librosa.feature.mfcc(S=np.log(np.maximum(M @ S, 1e-6)), n_mfcc=10, dct_type=2, norm="ortho").T


def main():
    from edge import features as F

    rng = np.random.default_rng(0)
    clips = (rng.standard_normal((20, 16000)) * 3000).astype(np.int16)
    diff = max(float(np.abs(F.mfcc(c) - librosa_mfcc(c)).max()) for c in clips)
    c = clips[0]
    t_ours = timeit(lambda: F.mfcc(c), number=200)
    t_lib = timeit(lambda: librosa_mfcc(c), number=50)

    stream = F.MfccStream()
    hops = c.reshape(-1, 320)

    def one_second_streamed():
        for h in hops:
            stream.push(h)

    t_stream = timeit(one_second_streamed, number=20)
    rows = [
        row("frontend", "max |ours - librosa| (MFCC)", diff, "abs", "librosa", 0.0, ratio=None),
        row("frontend", "batch MFCC per 1 s window", t_ours * 1e3, "ms", "librosa", t_lib * 1e3),
        row("frontend", "streamed MFCC per 1 s (50 hops)", t_stream * 1e3, "ms", "librosa batch", t_lib * 1e3),
    ]
    write_results("frontend", rows)


if __name__ == "__main__":
    main()
