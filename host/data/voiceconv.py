"""Voice conversion of synthetic training speech with the WORLD vocoder (pyworld).

The corpus's training voices are espeak-ng's formant voices and two Festival diphone men; the
voices the model misses (Flite's slt, a woman; Festival's held-out slt) differ most in pitch,
and speed perturbation or VTLP move pitch and formants together by at most ~15 %. WORLD
(Morise et al. 2016) splits a clip into F0, spectral envelope and aperiodicity, so the pitch
can be raised like a woman's or a child's (x1.4-2.0) while the envelope is warped on its own
(formants x0.95-1.25), then resynthesised.

pyworld is an optional dependency (a source-only package on PyPI: it compiles on install), so
this module imports it only when called.

    >>> out = convert(pcm, f0_scale=1.8, formant_scale=1.15)      # int16 in, int16 out
    >>> rows = converted_rows(corpus, voices=("festival:kal_diphone",), copies=2, seed=0)
"""

from __future__ import annotations

import numpy as np

SR = 16000
F0_RANGE = (1.4, 2.0)
FORMANT_RANGE = (0.95, 1.25)


def _world():
    try:
        import pyworld
    except ImportError:
        raise SystemExit("voice conversion needs pyworld: .venv/bin/pip install pyworld") from None
    return pyworld


def convert(pcm: np.ndarray, f0_scale: float, formant_scale: float) -> np.ndarray:
    """Resynthesise ``pcm`` (16 kHz int16) with F0 x ``f0_scale`` and formants x ``formant_scale``."""
    pw = _world()
    x = pcm.astype(np.float64) / 32768.0
    f0, t = pw.dio(x, SR, frame_period=5.0)
    f0 = pw.stonemask(x, f0, t, SR)
    sp = pw.cheaptrick(x, f0, t, SR)
    ap = pw.d4c(x, f0, t, SR)
    bins = sp.shape[1]
    # formants up by a: the new envelope at frequency f is the old one at f / a
    src = np.clip(np.arange(bins) / formant_scale, 0, bins - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, bins - 1)
    w = src - lo
    sp2 = sp[:, lo] * (1 - w) + sp[:, hi] * w
    ap2 = ap[:, lo] * (1 - w) + ap[:, hi] * w
    y = pw.synthesize(f0 * f0_scale, np.ascontiguousarray(sp2), np.ascontiguousarray(ap2), SR, 5.0)
    y = y[: len(pcm)]
    peak = np.abs(y).max() + 1e-9
    gain = min(1.0, 0.95 / peak) * (np.abs(x).max() / peak if peak > 0 else 1.0)
    return np.clip(y * gain * 32768.0, -32768, 32767).astype(np.int16)


def _convert_job(job):
    pcm, f0s, fs = job
    return convert(pcm, f0s, fs)


def converted_rows(corpus, voices, copies: int, seed: int = 0, kinds=("keyword", "filler"),
                   workers: int = 2) -> dict:
    """{(voice id + "+world", text, kind, r): int16}: ``copies`` conversions of every training
    utterance of ``voices``, each at its own draw of F0 and formant scale."""
    from multiprocessing import Pool

    rng = np.random.default_rng([seed, 77])
    keys, jobs = [], []
    for i in range(len(corpus.text)):
        if corpus.split[i] != "train" or corpus.voice[i] not in voices or corpus.kind[i] not in kinds:
            continue
        pcm = corpus.audio[corpus.offsets[i]:corpus.offsets[i + 1]]
        for r in range(copies):
            keys.append((str(corpus.voice[i]) + "+world", str(corpus.text[i]), str(corpus.kind[i]), f"{i}.{r}"))
            jobs.append((pcm, rng.uniform(*F0_RANGE), rng.uniform(*FORMANT_RANGE)))
    if workers <= 1:
        return dict(zip(keys, map(_convert_job, jobs)))
    with Pool(workers) as pool:
        return dict(zip(keys, pool.map(_convert_job, jobs, chunksize=32)))
