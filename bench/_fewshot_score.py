"""Scoring for the ``kws_fewshot`` bench: enrol each keyword, count its misses and false accepts.

``evaluate_keywords`` enrols 5 renders of every custom phrase per voice exactly as a
device does (``edge.enroll.enroll``) and measures the keyword model with and without
its time-order verifier: misses on held-out renders through the real ``Detector``,
false accepts on the cached negative stream with ``count_events`` (the Detector's
trigger on precomputed scores; ``check_counter`` checks the two agree). The rest
reads the results: operating curves, where false accepts come from.

    >>> res, models, fa = evaluate_keywords(km, voices, audio, pieces, stream, np.random.default_rng(11))
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench._fewshot_data import HELD_OUT, NEAR_MISS, SHOTS, STREAM_HOURS, negative_stream, positive_snippet, \
    run_windows, snippet_runs
from bench.common import row
from edge.detect import count_events


def window_verifier(custom, frames, scale, k: int = 0):
    """verify(run index) -> bool for keyword ``k`` on the windows of ``frames`` (memoised), as the
    Detector runs it on a candidate's windows; ``.distances`` keeps what it computed."""
    from edge import features as F

    cs = run_windows(frames)
    memo = {}

    def check(j):
        if j not in memo:
            memo[j] = custom.verify(k, F.normalize(frames[cs[j] - F.N_FRAMES: cs[j]], scale))
        return memo[j][0]

    check.distances = memo
    return check


def evaluate_keywords(km, voices, pos_audio, pieces, stream: dict, rng):
    """Every custom phrase of every voice enrolled from ``pos_audio["pos|voice|phrase|k"]``, k < SHOTS,
    and measured on the held-out k (snippets drawn from ``rng``) and the negative ``stream`` (``emb``,
    ``unit``, ``ends``, ``frames``, ``bank_unit``).

    Returns (res, models, fa): res per keyword model (voice, phrase, misses, held-out, fa, fa proto,
    misses proto, outliers, misses 2-stage, fa 2-stage); models the score series ``operating_curve``
    and ``check_counter`` read; fa the false accepts' times and phrases per stage."""
    from edge.detect import Detector, detect_pcm
    from edge.enroll import FAR_TARGET, DeviceState, enroll
    from host.data.words import CUSTOM_PHRASES

    emb, unit, ends, frames, bank_unit = (stream[k] for k in ("emb", "unit", "ends", "frames", "bank_unit"))
    fa_all = {"times": [], "phrases": [], "voices": [], "times2": [], "phrases2": [], "voices2": []}
    res, models = [], []
    for v in voices:
        for ph in CUSTOM_PHRASES:
            clips = [pos_audio[f"pos|{v.id}|{ph}|{k}"] for k in range(SHOTS + HELD_OUT)]
            with tempfile.TemporaryDirectory() as d:
                state = DeviceState.open(d, km.bundle)
                rep = enroll(km, state, ph, clips[:SHOTS])
                custom, two, entry = state.custom(verify=False), state.custom(), state.keywords[0]
            snippets = [positive_snippet(rng, c, pieces) for c in clips[SHOTS:]]
            misses = [0, 0]
            for i, det in enumerate((Detector(km, custom=custom, keywords=[]), Detector(km, custom=two, keywords=[]))):
                for snip in snippets:
                    det.reset()
                    misses[i] += not any(e["keyword"] == ph for e in detect_pcm(det, snip))
            thr = float(custom.thresholds[0])
            stream_scores = custom.scores(emb)[:, 0]
            times, times2 = [], []
            fa = count_events(stream_scores, thr, ends, times=times)
            check = window_verifier(two, frames, km.scale)
            fa2 = count_events(stream_scores, thr, ends, times=times2, verify=check, search=two.searches(0))
            fa_all["times"] += times
            fa_all["phrases"] += [ph] * len(times)
            fa_all["voices"] += [v.id] * len(times)
            fa_all["times2"] += times2
            fa_all["phrases2"] += [ph] * len(times2)
            fa_all["voices2"] += [v.id] * len(times2)
            runs = [snippet_runs(km, s) for s in snippets]
            pos_emb = [(e, en) for e, en, _ in runs]
            models.append({"thr": thr, "stream": stream_scores, "ends": ends, "verify": check,
                           "search": two.searches(0), "pos": [custom.scores(e)[:, 0] for e, _ in pos_emb],
                           "pos_ends": [en for _, en in pos_emb],
                           "pos_verify": [window_verifier(two, fr, km.scale) for _, _, fr in runs]})
            # reference: cosine to the prototype (the ESP32's head), threshold at the same bank rate
            proto = np.asarray(entry["prototype"], np.float32)
            thr_p = float(np.quantile(bank_unit @ proto, 1.0 - FAR_TARGET))
            fa_p = count_events(unit @ proto, thr_p, ends)
            p_miss = 0
            for e, _ in pos_emb:
                c = (e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)) @ proto
                p_miss += bool(np.convolve(c, np.ones(2) / 2)[: len(c)].max() < thr_p)
            res.append((v.id, ph, misses[0], len(snippets), fa, fa_p, p_miss, rep["outliers"], misses[1], fa2))
            print(f"{v.id:28s} {ph:12s} miss {misses[0]}/{len(snippets)}  FA {fa:3d}  (proto: miss {p_miss}, "
                  f"FA {fa_p}; two-stage: miss {misses[1]}, FA {fa2})", file=sys.stderr)
    return res, models, fa_all


def check_counter(km, audio, models, res, frames, minutes=6):
    """The false accepts are counted by ``count_events`` on cached scores; the real Detector on the first
    minutes of the same stream must give the same events for the noisiest keyword model, with the
    first stage alone and with the verifier."""
    from edge.detect import Detector
    from edge.enroll import DeviceState, enroll

    k = int(np.argmax([r[4] for r in res]))
    voice, phrase = res[k][0], res[k][1]
    clips = [audio[f"pos|{voice}|{phrase}|{i}"] for i in range(SHOTS)]
    with tempfile.TemporaryDirectory() as d:
        state = DeviceState.open(d, km.bundle)
        enroll(km, state, phrase, clips)
        one, two = state.custom(verify=False), state.custom()
    pieces = [audio[k2] for k2 in sorted(audio) if k2.startswith("neg|")]
    dets = [Detector(km, custom=one, keywords=[]), Detector(km, custom=two, keywords=[])]
    got = [0, 0]
    for blk in negative_stream(pieces, minutes * 60):
        for i, det in enumerate(dets):
            got[i] += len(det.push(blk))
    got = [g + len(det.flush()) for g, det in zip(got, dets)]
    m = models[k]
    n = int(np.searchsorted(m["ends"][:, 0], minutes * 60, side="right"))
    want = count_events(m["stream"][:n], m["thr"], m["ends"][:n])
    check = window_verifier(two, frames, km.scale)
    want2 = count_events(m["stream"][:n], m["thr"], m["ends"][:n], verify=check, search=two.searches(0))
    return [row("kws_fewshot", f"events in the first {minutes} min: real Detector vs the bench's counter "
                f"({voice}, {phrase!r})", got[0], "events", "count_events on cached scores", want, ratio=None),
            row("kws_fewshot", f"two-stage events in the first {minutes} min: real Detector vs the bench's "
                f"counter ({voice}, {phrase!r})", got[1], "events", "count_events(verify=...) on cached scores",
                want2, ratio=None, verifier_rejections=dets[1].rejected)]


def kind_of(text: str) -> str:
    from host.data.words import FILLERS, SPEECH_COMMANDS

    if any(text in v for v in NEAR_MISS.values()):
        return "near-miss"
    return "speech-commands word" if text in SPEECH_COMMANDS else "filler" if text in FILLERS else "word run"


def stream_timeline(audio, root: Path):
    """(keys of the negative pieces, (N, 3) array of start s, end s, piece index) for the cached stream."""
    keys = [k for k in sorted(audio) if k.startswith("neg|")]
    path = root / "stream-timeline.json"
    if path.exists():
        timeline = json.loads(path.read_text())
    else:
        timeline = []
        for _ in negative_stream([audio[k] for k in keys], STREAM_HOURS * 3600, timeline=timeline):
            pass
        path.write_text(json.dumps(timeline))
    return keys, np.asarray(timeline)


def _letters(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalpha())


_PHONEMES: dict = {}


def phonemes(text: str) -> str:
    """espeak-ng's US English phonemes of ``text`` (its ASCII notation), stress marks, pauses and word
    breaks removed: one string per pronunciation, whoever the voice. Cached per text."""
    if text not in _PHONEMES:
        import re
        import subprocess

        out = subprocess.run(["espeak-ng", "-q", "-x", "-v", "en-us", text], capture_output=True, text=True,
                             check=True).stdout
        _PHONEMES[text] = re.sub(r"[\s'_,%=]", "", out)
    return _PHONEMES[text]


def says_keyword(text: str, phrase: str) -> bool:
    """Does a negative piece actually say the keyword? By letters ("cinnamon roll" for "cinnamon",
    "magnets" for "magnet", "goodnight moon" for "good night", spaces ignored) or by pronunciation
    (a homophone: "good knight" for "good night", "doll fin" for "dolphin"), which no detector
    listening to sounds can or should tell apart."""
    return _letters(phrase) in _letters(text) or phonemes(phrase) in phonemes(text)


def says_as_words(text: str, phrase: str) -> bool:
    """Does a piece say the keyword as whole words? Some run of its words sounds exactly like the
    keyword ("cinnamon roll", "good knight", "goodnight moon"), so "magnets", "dolphins" and
    "thunderbolt", which extend its last word, do not: the stricter rule of ``on_negative_speech``."""
    words, target = text.lower().split(), phonemes(phrase)
    return any(phonemes(" ".join(words[i:j])) == target
               for i in range(len(words)) for j in range(i + 1, len(words) + 1))


def on_negative_speech(audio, root: Path, res, fa: dict, hours: float, stage: int = 2,
                       says=None) -> tuple[np.ndarray, int]:
    """False accepts per hour of each keyword model in ``res`` (evaluate_keywords' order) on the
    stream's *negative* speech for that keyword: events on pieces that say the keyword itself
    ("cinnamon roll" for "cinnamon", "magnets", the homophone "good knight") are not false accepts, and
    the time of those pieces is taken out of the keyword's hours. An event is on such a piece when
    the piece overlaps the second before the keyword's end. ``stage``: 1 (first stage alone) or 2;
    ``says``: which pieces say the keyword (default ``says_keyword``; ``says_as_words`` keeps the
    pieces that extend it as negatives). Returns (FA/h per model, events dropped)."""
    says = says or says_keyword
    keys, tl = stream_timeline(audio, root)
    texts = [k.split("|")[2] for k in keys]
    starts = tl[:, 0]
    sfx = "2" if stage == 2 else ""
    spans, spoken_h = {}, {}
    for ph in {r[1] for r in res}:
        own = np.array([says(texts[int(k)], ph) for k in tl[:, 2]], bool)
        spans[ph] = own
        spoken_h[ph] = float((tl[own, 1] - tl[own, 0]).sum()) / 3600
    kept, dropped = {}, 0
    for t, ph, v in zip(fa["times" + sfx], fa["phrases" + sfx], fa["voices" + sfx]):
        lo, hi = max(0, int(np.searchsorted(starts, t - 2.5))), int(np.searchsorted(starts, t))
        seg = tl[lo:hi]
        if any(spans[ph][lo + i] and min(b, t) - max(a, t - 1.0) > 0 for i, (a, b, _k) in enumerate(seg)):
            dropped += 1
        else:
            kept[(v, ph)] = kept.get((v, ph), 0) + 1
    return np.array([kept.get((r[0], r[1]), 0) / (hours - spoken_h[r[1]]) for r in res]), dropped


def fa_sources(audio, fa_times, phrases, root: Path):
    """What the second before each false accept's keyword end mostly held: {kind: share}, and the
    speech-time shares."""
    keys, tl = stream_timeline(audio, root)
    starts = tl[:, 0]
    counts, own = {}, 0
    for t, ph in zip(fa_times, phrases):
        lo = max(0, int(np.searchsorted(starts, t - 2.5)))
        hi = int(np.searchsorted(starts, t))
        best, kind = 0.0, "no speech (noise)"
        for a, b, k in tl[lo:hi]:
            ov = min(b, t) - max(a, t - 1.0)
            if ov > best:
                best, text = ov, keys[int(k)].split("|")[2]
                kind = kind_of(text)
        if best > 0 and text in NEAR_MISS.get(ph, ()):
            own += 1
        counts[kind] = counts.get(kind, 0) + 1
    speech = {}
    for a, b, k in tl:
        kd = kind_of(keys[int(k)].split("|")[2])
        speech[kd] = speech.get(kd, 0.0) + (b - a)
    tot = sum(speech.values())
    n = max(1, len(fa_times))
    return ({k: round(v / n, 3) for k, v in sorted(counts.items())},
            {k: round(v / tot, 3) for k, v in sorted(speech.items())}, round(own / n, 3))


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def operating_curve(models, hours, offsets=np.linspace(-1.0, 3.0, 65), two_stage=False):
    """(offset, FRR, FA/h per keyword) when every model's first-stage threshold moves by the same
    logit offset (``two_stage``: with each model's verifier, its threshold as enrolled).

    Read off this evaluation to show the trade-off; the device never uses it (its thresholds
    come from the bank and the enrolment clips alone)."""
    curve = []
    for d in offsets:
        fa = miss = n = 0
        for m in models:
            thr = float(_sigmoid(np.log(m["thr"] / (1 - m["thr"])) + d))
            fa += count_events(m["stream"], thr, m["ends"], verify=m["verify"] if two_stage else None,
                               search=m["search"])
            for sc, ends, check in zip(m["pos"], m["pos_ends"], m["pos_verify"]):
                miss += not count_events(sc, thr, ends, verify=check if two_stage else None, search=m["search"])
                n += 1
        curve.append((float(d), miss / n, fa / len(models) / hours))
    return curve


def plot_curve(curve, path, curve2=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([c[2] for c in curve], [100 * c[1] for c in curve], "o-", ms=3, label="first stage alone")
    if curve2 is not None:
        ax.plot([c[2] for c in curve2], [100 * c[1] for c in curve2], "s-", ms=3, label="with time-order verifier")
        ax.legend(fontsize=8)
    ax.axvline(0.5, ls="--", c="grey")
    ax.axhline(10, ls="--", c="grey")
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("false accepts per hour per keyword")
    ax.set_ylabel("false-reject rate (%)")
    ax.set_title("5-shot custom keywords, unseen voices")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def curve_rows(curve, prefix: str):
    ok = [c for c in curve if c[2] <= 0.5]
    at_goal = min(ok, key=lambda c: c[1]) if ok else None
    ten = [c for c in curve if c[1] <= 0.10]
    at_frr = min(ten, key=lambda c: c[2]) if ten else None
    return [row("kws_fewshot", f"{prefix}FRR at <= 0.5 FA/h (shared first-stage threshold offset read off this "
                "evaluation; not used on the device)", None if at_goal is None else round(100 * at_goal[1], 2), "%",
                "goal", 10.0, offset_logit=None if at_goal is None else at_goal[0]),
            row("kws_fewshot", f"{prefix}FA/h at FRR <= 10 % (same caveat)", None if at_frr is None else
                round(at_frr[2], 3), "FA/h", "goal", 0.5, offset_logit=None if at_frr is None else at_frr[0])]
