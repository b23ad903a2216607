"""The custom-keyword variants ``scripts/enroll_noise.py`` enrols and scores (issue 17, development
only, never the device's): renders of a phrase, a first stage scored over the phrase's span
(``span_window``, ``span_frames``, ``SpanFeatures``) and a floor under the second stage's thresholds
from the negative bank's windows (``bank_floors``). Moved out of enroll_noise.py unchanged; it
re-exports every name."""

from __future__ import annotations

import numpy as np

FLOOR_HARD = 200  # the bank windows a keyword's floor is measured on


def renders(voice, phrase, n, seed):
    from host.data import synth as S

    rng = np.random.default_rng(seed)
    return S.render(S.Voice(*voice), [(phrase, float(rng.uniform(0.85, 1.15)), float(rng.uniform(0.9, 1.1)))
                                      for _ in range(n)])


def bank(km):
    """The negative bank's windows as a floor is measured on them: (features, embeddings, the bundle's
    ``Verifier``), from the corpus the device's bundle was made with (``host.recipe.negative_windows``)."""
    from edge import verify as V
    from host.data.corpus import build_corpus
    from host.recipe import negative_windows

    feats = km.features(negative_windows(build_corpus(progress=False)).astype(np.int16))
    return feats, km.infer(feats)[0], V.Verifier(km.bundle)


def bank_floors(state, ver, bank_feats, bank_emb, factor: float, hard: int = FLOOR_HARD,
                levels: int | None = None) -> None:
    """Raise every enrolled keyword's second-stage levels in ``state`` (``levels``: only the first so
    many, by rising noise range) to at least ``factor`` times the smallest distance of its ``hard``
    bank windows that its first stage scores highest (a window passes at or under its threshold, so
    the floor sits just under that window's distance)."""
    from edge import verify as V

    head = state.custom(verify=False)
    scores = head.scores(bank_emb)
    for k, e in enumerate(state.keywords):
        v = e["verify"]["version"]
        tpl = V.unpack(e["verify"])
        top = bank_feats[np.argsort(scores[:, k])[::-1][:hard]]
        floor = float(ver.distance(ver.sequences(top, v), ver.prepare(tpl, v), version=v).min()) * factor - 1e-6
        lv = e["verify"]["levels"]
        n = len(lv) if levels is None else levels
        e["verify"]["levels"] = [[r, round(max(t, floor), 6) if i < n else t] for i, (r, t) in enumerate(lv)]
        e["verify"]["threshold"] = max(t for _, t in e["verify"]["levels"])


def span_window(feats: np.ndarray, frames: int) -> np.ndarray:
    """Normalised windows ``(..., 49, 10)`` -> only their middle ``frames`` frames, with the window's
    mean removal made the span's own, and zeros outside: what a window would be if the frames
    around the span were the span's mean (``scripts/babble_where.py --fill mean``), so speech or
    noise around a phrase cannot move its embedding. An experiment (issue 17), not the device's."""
    f = np.asarray(feats, np.float32)
    if frames >= f.shape[-2]:
        return f
    a = (f.shape[-2] - frames) // 2
    out = np.zeros_like(f)
    mid = f[..., a:a + frames, :]
    out[..., a:a + frames, :] = mid - mid.mean(axis=-2, keepdims=True)
    return out


def span_frames(clips, name: str, margin_s: float, step: int = 4) -> int:
    """The span a phrase is scored over: its longest enrolment clip's speech (``enroll.speech_bounds``
    of the centred clip) plus ``margin_s`` on each side, rounded up to ``step`` frames (keywords of one
    length share one inference), at most the whole window."""
    from edge import enroll as E
    from edge import features as F

    longest = max(int(np.subtract(*E.speech_bounds(E.prepare_clip(c, name))[::-1])) + 1 for c in clips)
    n = longest + 2 * int(round(margin_s / 0.02))
    return min(F.N_FRAMES, -(-n // step) * step)


class SpanFeatures:
    """A KeywordModel whose ``features`` keep the middle ``frames`` frames (``span_window``), for
    enrolling a keyword that is scored over a span."""

    def __init__(self, km, frames: int):
        self.km, self.frames = km, frames
        self.bundle, self.labels, self.infer, self.scale = km.bundle, km.labels, km.infer, km.scale

    def features(self, pcm):
        return span_window(self.km.features(pcm), self.frames)
