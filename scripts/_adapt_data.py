"""The development data ``scripts/adapt_recipe.py`` and ``scripts/adapt_verify.py`` score adaptation
recipes on (issue 17), cached under ``.cache/adapt_recipe``: the voices' development streams and
self-speech, the Allison development folds, synthetic sentences, every stream window's backbone
output (``build``); ``emulate``, the Detector's trigger replayed on scores; ``Evaluator``, which
loads and scores them; ``MemStore``, an in-memory adaptation store. The recipes, sweeps and the
command line are in ``adapt_recipe.py``, which re-exports these names.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _base_streams as B  # noqa: E402
from bench import _realspeech as R  # noqa: E402
from edge import features as F  # noqa: E402
from edge.detect import Detector  # noqa: E402
from host.data.words import COMMANDS10, FILLERS  # noqa: E402

CACHE = ROOT / ".cache" / "adapt_recipe"
DEV_SEED = 101  # dev renders: seeds 101.. (the benchmark's test renders use 11..)


def fold(name: str) -> int:
    """A second, independent split of the development half (0 / 1) by name."""
    return hashlib.sha1(("fold:" + name).encode()).digest()[0] % 2


class _Shim:
    """What ``edge.operating.stream_scores`` asks of a detector, returning backbone outputs."""

    stride = 4

    def __init__(self, km, bb):
        self.km, self.bb = km, bb

    def scores(self, feats):
        q = self.bb(feats)
        return q.reshape(len(q), -1), None

    _keyword_end = staticmethod(Detector._keyword_end)


def stream_features(km, bb, pcm):
    from edge.operating import stream_scores

    x, ends, hours = stream_scores(_Shim(km, bb), pcm)
    return x.astype(np.int8).reshape(-1, 25, 5, 64), ends, hours


def _save(name, **arrs):
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(CACHE / f"{name}.npz", **arrs)


def _load(name):
    p = CACHE / f"{name}.npz"
    if not p.exists():
        return None
    with np.load(p, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def self_negatives(voice: str, n: int = 300, seed: int = 7, half: int | None = None):
    return B.other_speech(voice, n=n, seed=seed, half=half)


def synthetic_ambient(n: int = 300, seed: int = 9):
    """Word pairs (half-1 words) by espeak-ng training voices other than ``synthetic``'s, and Flite kal."""
    from host.data import synth as S
    from host.data.negatives import phrase_words, training_voices, word_pairs

    return word_pairs(n, seed, voices=training_voices(3) + [S.Voice("flite", "kal")],
                      words=[w for w in phrase_words() if B.word_half(w) == 1])


def other_unknowns(n_per_voice: int = 20):
    """Unknown-word clips (FILLERS) by other voices: Flite kal and six espeak-ng training voices."""
    from host.data import synth as S
    from host.data.corpus import CorpusConfig, assign_splits

    splits = assign_splits(S.all_voices(), CorpusConfig())
    voices = [S.Voice("flite", "kal")] + [v for v in S.espeak_voices() if splits[v.id] == "train"][1::9][:6]
    rng = np.random.default_rng(5)
    out = []
    for v in voices:
        ws = rng.choice(FILLERS, n_per_voice, replace=False)
        out += S.render(v, [(str(w), float(rng.uniform(0.9, 1.1)), 1.0) for w in ws])
    return out


def build(km, bb):
    """Every cached array the sweep needs (minutes once, then read from .cache)."""
    t0 = time.time()
    if _load("allison_dev") is None:
        dev = R.load_prompts(which="dev")
        for f in (0, 1):
            ps = [p for p in dev if fold(p.name) == f]
            pcm, spans = R.concat(ps)
            x, ends, hours = stream_features(km, bb, pcm)
            _save(f"allison_fold{f}", x=x, ends=ends, hours=hours, spans=np.asarray(spans),
                  names=np.array([p.name for p in ps]))
        _save("allison_dev", done=np.ones(1))
        print(f"allison folds {time.time() - t0:.0f}s", flush=True)
    pool = None
    for i, v in enumerate(B.VOICES):
        if _load(f"dev_{v}_clean") is None:
            pool = pool or B.babble_pool()
            clips = B.render_voice(v, seed=DEV_SEED + i)
            words = np.array([c.word for c in clips])
            for snr in B.SNRS:
                pcm, spans = B.positive_stream(clips, snr, seed=55, pool=pool)
                x, ends, _ = stream_features(km, bb, pcm)
                _save(f"dev_{v}_{'clean' if snr is None else snr}", x=x, ends=ends, spans=np.asarray(spans),
                      words=words)
            print(f"dev streams {v} {time.time() - t0:.0f}s", flush=True)
        if _load(f"adapt_{v}") is None:
            cl = B.adapt_clips(v, unknown=30, silence=10)
            w = np.stack([F.fit_to_window(c.pcm) for c in cl])
            _save(f"adapt_{v}", x=bb(km.features(w)), words=np.array([c.word for c in cl]))
        if _load(f"adaptpcm_{v}") is None:
            cl = B.adapt_clips(v, unknown=30, silence=10)
            _save(f"adaptpcm_{v}", w=np.stack([F.fit_to_window(c.pcm) for c in cl]),
                  words=np.array([c.word for c in cl]))
        if _load(f"selfamb_{v}") is None:  # the voice's own other speech, for training (other words)
            _save(f"selfamb_{v}", pcm=self_negatives(v, n=200, seed=8, half=1))
        if _load(f"self_{v}") is None:
            x, ends, hours = stream_features(km, bb, self_negatives(v, half=0))
            _save(f"self_{v}", x=x, ends=ends, hours=hours)
            print(f"self negatives {v} {time.time() - t0:.0f}s", flush=True)
    if _load("allison_pcm0") is None:
        dev = R.load_prompts(which="dev")
        for f in (0, 1):
            ps = [p for p in dev if fold(p.name) == f]
            pcm, spans = R.concat(ps)
            _save(f"allison_pcm{f}", pcm=pcm, spans=np.asarray(spans), names=np.array([p.name for p in ps]))
    if _load("synthetic") is None:
        from bench.kws_base import synthetic_negatives

        syn = synthetic_negatives(n=450)
        x, ends, hours = stream_features(km, bb, syn)
        _save("synthetic", x=x, ends=ends, hours=hours)
        print(f"synthetic {time.time() - t0:.0f}s", flush=True)
    if _load("synamb") is None:
        _save("synamb", pcm=synthetic_ambient())
        print(f"synthetic ambient {time.time() - t0:.0f}s", flush=True)
    if _load("others") is None:
        cl = other_unknowns()
        w = np.stack([F.fit_to_window(c) for c in cl])
        _save("others", x=bb(km.features(w)))
        print(f"other voices' unknowns {time.time() - t0:.0f}s", flush=True)


# --- the Detector's trigger on precomputed scores ------------------------------------------------

def emulate(scores, ends, thr, smooth: int = 2, peak_hops: int = 5, refractory_s: float = 1.0, verify=None):
    """``Detector.push`` events (keyword index, time_s, score) from (T, K) first-stage scores.
    ``verify(k, runs) -> bool`` (optional): a second stage on the candidate's runs (the peak's
    first), the decision the Detector makes for a version-6 custom keyword (which reports the first
    window that passes at once, with the peak so far: its time and score may be earlier and lower
    than the whole candidate's peak given here); a rejected candidate gives no event and no
    refractory period."""
    s = np.asarray(scores, np.float32)
    thr = np.broadcast_to(np.asarray(thr, np.float32), (s.shape[1],))
    sm = s.copy()
    for j in range(1, smooth):
        sm[j:] += s[:-j]
    div = np.minimum(np.arange(1, len(s) + 1), smooth).astype(np.float32)[:, None]
    sm /= div
    over = sm - thr
    hot = np.nonzero(over.max(axis=1) >= 0)[0]
    events, quiet, nxt, n = [], -1.0, 0, len(s)
    for j in hot:
        if j < nxt or ends[j, 0] < quiet:
            continue
        k = int(np.argmax(over[j]))
        score, t, left, i, pk = sm[j, k], ends[j, 1], peak_hops, j, j
        while i + 1 < n:
            i += 1
            left -= 1
            if sm[i, k] > score:
                score, t, pk = sm[i, k], ends[i, 1], i
            if left <= 0 or sm[i, k] < thr[k]:
                break
        else:
            i = n - 1
        if verify is not None and not verify(k, [pk] + [r for r in range(j, i + 1) if r != pk]):
            nxt = i + 1
            continue
        events.append((k, round(float(t), 3), float(score)))
        quiet, nxt = t + refractory_s, i + 1
    return events


# --- evaluating one tail delta ----------------------------------------------------------------------

def windows_of(pcm, hop_s=0.5, keep=None):
    """1 s windows every ``hop_s`` (as ``edge.adapt.ambient.ambient_windows``); ``keep(start_s)``."""
    hop = int(hop_s * 16000)
    starts = [a for a in range(0, len(pcm) - 16000 + 1, hop) if keep is None or keep(a / 16000)]
    return np.stack([pcm[a:a + 16000] for a in starts]).astype(np.int16)


class Evaluator:
    def __init__(self, bundle, labels, km=None, bb=None):
        self.km, self.bb = km, bb
        from edge.adapt import load_tail

        self.base = load_tail(bundle)
        self.labels = list(labels)
        self.kw = [self.labels.index(w) for w in COMMANDS10]
        from edge.adapt import Backbone

        self.qparams = Backbone(bundle).qparams
        self._data = {}

    def data(self, name):
        if name not in self._data:
            self._data[name] = _load(name)
        return self._data[name]

    def scores(self, delta, name):
        from edge.adapt import ConvTail

        d = self.data(name)
        p = ConvTail(self.base, delta, qparams=self.qparams).probs(d["x"], batch=512)
        return p[:, self.kw]

    def recall(self, delta, voice, snr, thr=0.7):
        d = self.data(f"dev_{voice}_{snr}")
        evs = emulate(self.scores(delta, f"dev_{voice}_{snr}"), d["ends"], thr)
        evs = [{"keyword": COMMANDS10[k], "time_s": t} for k, t, _ in evs]
        clips = [B.Clip(voice, str(w), np.zeros(0)) for w in d["words"]]
        return B.score_positives(evs, [tuple(s) for s in d["spans"]], clips)["balanced"]

    def fa(self, delta, name, thr=0.7, exclude=None):
        """(events, hours) on a negative stream; ``exclude``: (spans, prompts-say) for Allison folds."""
        d = self.data(name)
        evs = emulate(self.scores(delta, name), d["ends"], thr)
        if name.startswith("allison"):
            prompts = self.prompts(name)
            spans = [tuple(s) for s in d["spans"]]
            evs = [e for e in evs if not any(a - 0.3 <= e[1] <= b + 1.0 and p.says(COMMANDS10[e[0]])
                                             for (a, b), p in zip(spans, prompts))]
        return evs, float(d["hours"])

    def prompts(self, name):
        key = "prompts_" + name
        if key not in self._data:
            d = self.data(name)
            tr = R.transcripts()
            self._data[key] = [R.Prompt(str(n), tr[str(n)], R.spoken_words(tr[str(n)]), "dev", np.zeros(0))
                               for n in d["names"]]
        return self._data[key]

    def feats(self, windows):
        return np.concatenate([self.bb(self.km.features(windows[i:i + 256])) for i in range(0, len(windows), 256)])

    def ambient_pcm(self, fold_: int, hop_s: float = 0.5):
        """Keyword-free 1 s windows of one Allison fold (prompts that say a command left out)."""
        key = f"ambpcm{fold_}_{hop_s}"
        if key not in self._data:
            d = self.data(f"allison_pcm{fold_}")
            prompts = self.prompts(f"allison_fold{fold_}")
            bad = [tuple(sp) for sp, p in zip(d["spans"], prompts) if any(p.says(w) for w in COMMANDS10)]
            self._data[key] = windows_of(d["pcm"], hop_s, lambda t: not any(a - 1.0 <= t <= b for a, b in bad))
        return self._data[key]

    def ambient_x(self, fold_: int, hop_s: float = 0.5):
        key = f"ambx{fold_}_{hop_s}"
        if key not in self._data:
            self._data[key] = self.feats(self.ambient_pcm(fold_, hop_s))
        return self._data[key]

    def self_ambient(self, voice):
        key = f"selfambx_{voice}"
        if key not in self._data:
            self._data[key + "pcm"] = windows_of(self.data(f"selfamb_{voice}")["pcm"], 0.5)
            self._data[key] = self.feats(self._data[key + "pcm"])
        return self._data[key], self._data[key + "pcm"]

    def ambient(self, fold_: int, hop_windows: int = 6, drop_says=True):
        """Keyword-free windows of one Allison fold (every ``hop_windows`` th stream window: ~0.5 s)."""
        name = f"allison_fold{fold_}"
        d = self.data(name)
        spans = [tuple(s) for s in d["spans"]]
        prompts = self.prompts(name)
        bad = [(a, b) for (a, b), p in zip(spans, prompts) if any(p.says(w) for w in COMMANDS10)]
        idx = []
        for i in range(0, len(d["x"]), hop_windows):
            end = d["ends"][i, 0]
            if drop_says and any(a - 1.0 <= end <= b + 1.0 for a, b in bad):
                continue
            idx.append(i)
        return d["x"][np.array(idx)]


# --- one recipe -------------------------------------------------------------------------------------

class MemStore:
    """The part of ``AdaptStore`` that ``edge.adapt.run.train`` touches, in memory."""

    def __init__(self):
        self.saved = None

    def current(self, context):
        return None

    def load_checkpoint(self):
        return None, None

    def save_checkpoint(self, state, info):
        pass

    def save(self, context, delta, info, stage=None, charge=None):
        self.saved = delta
        return 1
