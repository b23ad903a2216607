"""Few-shot enrolment of custom keywords.

From 3-10 clips of a word or phrase: embeddings from the frozen int8 encoder
(each clip also shifted in time and with a little noise, since a stream sees
the phrase anywhere in the window), a prototype (``edge.portable.proto``, the
same definition the ESP32 uses), outlier clips reported, and a small trained
head: logistic regression on the L2-normalised embedding, positives against
the bundle's negative bank (``negatives.npy``: other speech and noise). The
open-set threshold is calibrated on that bank: the score that only
``far_target`` (``FAR_TARGET``, 0.4 %) of negative windows exceed (never below 0.5). A second stage
(``edge.verify``, on by default) keeps the clips' int8 backbone steps as
templates; the detector runs it only when the first stage fires, and the
keyword counts only if the window also matches a template in time order (its
threshold comes from the enrolment clips alone and follows the window's noise).

What it writes, the state directory's ``keywords.json`` (``DeviceState``), and the scorer that
reads it (``CustomKeywords``) are ``edge.keywords``; they are importable from here as well.

    >>> state = DeviceState.open("state", bundle)
    >>> report = enroll(km, state, "hey edge", [read_wav(p) for p in paths])
    >>> state.custom().scores(embeddings)   # (N, K) in [0, 1]
"""

from __future__ import annotations

import numpy as np

from edge import features as F
from edge.errors import EdgelearnError
# the state and its scorer lived here until they got a module of their own: every name stays importable
from edge.keywords import (  # noqa: F401 (FORMAT, READABLE_FORMATS, at_sensitivity, check_keywords: re-exported)
    DEFAULT_SENSITIVITY, FAR_TARGET, FORMAT, NAME_RULE, READABLE_FORMATS, SENSITIVITIES, _NAME, CustomKeywords,
    DeviceState, StateError, at_sensitivity, check_keywords, shown)
from edge.portable import proto as P

MIN_CLIPS, MAX_CLIPS = 3, 10   # per speaker
MAX_SPEAKERS = 4               # people who enrolled one keyword (`device enroll --add`)
MIN_SPEECH_S = 0.2
MAX_CLIP_S = 2.0
SHIFTS_S = (-0.15, -0.075, 0.0, 0.075, 0.15)
# the head's noisy copies of each shifted clip, dB below the window's level (20 only before verifier
# version 7; scripts/enroll_noise.py chose 20/10/5 on development data)
AUGMENT_SNRS_DB = (20.0, 10.0, 5.0)


def check_name(name: str, base_labels, existing) -> str:
    norm = " ".join(name.strip().lower().split())
    if not _NAME.match(norm):
        raise EdgelearnError(f"keyword name {shown(name)} is not usable", fix=NAME_RULE)
    if norm in [b.lower() for b in base_labels]:
        raise EdgelearnError(f"keyword {norm!r} is already a base keyword of the bundle",
                             fix="the base model detects it already; pick another name")
    if norm in existing:
        raise EdgelearnError(f"keyword {norm!r} is already enrolled",
                             fix="pick another name or remove it first (--replace)")
    return norm


def speech_bounds(pcm: np.ndarray, floor_db: float = 35.0) -> tuple[int, int] | None:
    """First and last frame whose energy is within ``floor_db`` of the loudest; None if silent."""
    frames = F.frame(F.to_float(np.asarray(pcm)))
    energy = (frames ** 2).mean(axis=1)
    peak = float(energy.max())
    if peak < 1e-7:
        return None
    active = np.nonzero(energy > peak * 10 ** (-floor_db / 10))[0]
    return (int(active[0]), int(active[-1])) if active.size else None


def prepare_clip(pcm: np.ndarray, name: str) -> np.ndarray:
    """Check one clip and centre its speech in a 1 s window."""
    x = np.asarray(pcm)
    if x.size > MAX_CLIP_S * F.SAMPLE_RATE:
        raise EdgelearnError(f"{name}: {x.size / F.SAMPLE_RATE:.2f} s is too long for an enrolment clip",
                             fix=f"trim it to the phrase (at most {MAX_CLIP_S:.0f} s, ideally under 1 s)")
    if x.size < F.FRAME_LENGTH:
        raise EdgelearnError(f"{name}: {x.size} samples is too short", fix="record the whole phrase")
    bounds = speech_bounds(x)
    if bounds is None:
        raise EdgelearnError(f"{name}: the clip is silent", fix="check the microphone and record again")
    first, last = bounds
    speech = x[first * F.HOP_LENGTH : last * F.HOP_LENGTH + F.FRAME_LENGTH]
    if speech.size < MIN_SPEECH_S * F.SAMPLE_RATE:
        raise EdgelearnError(f"{name}: only {speech.size / F.SAMPLE_RATE:.2f} s of speech",
                             fix=f"record at least {MIN_SPEECH_S} s of the phrase")
    if speech.size > F.SAMPLE_RATE:
        speech = F.fit_to_window(speech)  # a phrase over 1 s keeps its centre, as training did
    return F.fit_to_window(speech.astype(np.int16))


def augment(clips: list[np.ndarray], rng, snrs_db=None) -> np.ndarray:
    """Each 1 s clip at several time shifts, each clean and with pink-ish noise at each of
    ``snrs_db`` (None: ``AUGMENT_SNRS_DB``) below the window's level."""
    out = []
    for c in clips:
        c = c.astype(np.float32)
        for s in SHIFTS_S:
            shifted = np.roll(c, int(s * F.SAMPLE_RATE))
            out.append(shifted)
            rms = np.sqrt((c ** 2).mean()) + 1.0
            for snr in (AUGMENT_SNRS_DB if snrs_db is None else snrs_db):
                noise = np.cumsum(rng.standard_normal(c.size)).astype(np.float32)
                noise -= np.convolve(noise, np.ones(64) / 64, mode="same")
                noise *= rms * 10 ** (-snr / 20) / (noise.std() + 1e-6)
                out.append(shifted + noise)
    return np.clip(np.array(out), -32768, 32767).astype(np.int16)


def train_head(pos: np.ndarray, neg: np.ndarray, steps: int = 400, l2: float = 1e-3, lr: float = 0.5):
    """Logistic regression on L2-normalised embeddings, classes balanced; returns (w, b)."""
    x = np.concatenate([pos, neg]).astype(np.float64)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    wt = np.r_[np.full(len(pos), 0.5 / len(pos)), np.full(len(neg), 0.5 / len(neg))]
    w, b = np.zeros(x.shape[1]), 0.0
    scale = 8.0  # features are unit vectors; scale the step so 400 steps converge
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
        g = wt * (p - y)
        w -= lr * scale * (x.T @ g + l2 * w)
        b -= lr * scale * g.sum()
    return w.astype(np.float32), float(b)


def negative_bank(bundle) -> np.ndarray:
    name = (bundle.manifest.get("extra", {}).get("negatives") or {}).get("file", "negatives.npy")
    try:
        bank = np.load(bundle.path(name)).astype(np.float32)
    except (OSError, ValueError, EdgelearnError) as e:
        raise StateError(f"bundle {bundle.model_id} has no usable negative bank ({e})",
                         fix="use a bundle built by `edgelearn model` (it ships negatives.npy)") from None
    if bank.ndim != 2 or len(bank) < 50:
        raise StateError(f"negative bank has shape {bank.shape}, expected (N >= 50, dim)")
    return bank


def enroll(km, state: DeviceState, name: str, clips: list[np.ndarray], clip_names=None,
           far_target: float = FAR_TARGET, replace: bool = False, seed: int = 0, verify: bool | None = None,
           sensitivity: str = DEFAULT_SENSITIVITY, speakers=None, save: bool = True) -> dict:
    """Learn keyword ``name`` from clips; saves the state; returns a report dict.
    ``verify``: also build the second stage (``edge.verify``; needs the bundle's backbone);
    None: when the bundle has a backbone partition. ``sensitivity``: the level detection uses
    (``SENSITIVITIES``; every level's thresholds are kept, ``keyword_sensitivity`` switches).
    ``speakers``: one id per clip when several people enrolled the phrase (3-10 clips each, up to
    ``MAX_SPEAKERS``): outliers are found among each speaker's own clips, each speaker gets a
    first-stage head of their own (``speaker_heads``, each at its share of ``far_target``; the
    keyword fires when any does), and the second stage keeps every speaker's templates (a window
    passes near any).
    ``save``: write the state (False: the caller saves ``state`` when it is ready to)."""
    from edge.options import check_keyword_name

    check_keyword_name(name)  # text before .strip() (a wrong type was an AttributeError)
    check_level(sensitivity)
    clip_names = clip_names or [f"clip {i + 1}" for i in range(len(clips))]
    speakers = np.zeros(len(clips), np.int64) if speakers is None else np.asarray(speakers, np.int64)
    groups = [np.flatnonzero(speakers == g) for g in np.unique(speakers)]
    if len(speakers) != len(clips) or len(groups) > MAX_SPEAKERS:
        raise EdgelearnError(f"{len(groups)} speakers' clips given, at most {MAX_SPEAKERS} can enrol one keyword",
                             fix="enrol the phrase for the people who use it most")
    for g in groups:
        if not MIN_CLIPS <= len(g) <= MAX_CLIPS:
            who = "" if len(groups) == 1 else f" from speaker {int(speakers[g[0]]) + 1}"
            raise EdgelearnError(f"{len(g)} enrolment clips given{who}, need {MIN_CLIPS}-{MAX_CLIPS}",
                                 fix="record the phrase 5 times, one clip per file")
    existing = [n for n in state.names() if not (replace and n == name.strip().lower())]
    norm = check_name(name, km.labels, existing)
    windows = [prepare_clip(c, n) for c, n in zip(clips, clip_names)]
    emb, _ = km.infer(km.features(np.stack(windows)))
    embs = [list(map(float, e)) for e in emb]
    outliers, cos = [], [0.0] * len(embs)
    for g in groups:  # each person's clips against their own: two voices are not outliers of each other
        mine = [embs[i] for i in g]
        outliers += [int(g[j]) for j in P.find_outliers(mine)]
        for j, c in zip(g, P.loo_cosines(mine)):
            cos[j] = c
    outliers.sort()
    keep = [i for i in range(len(windows)) if i not in outliers]
    short = [g for g in groups if sum(1 for i in g if i not in outliers) < MIN_CLIPS]
    if short:
        g = short[0]
        n_keep = sum(1 for i in g if i not in outliers)
        raise EdgelearnError(f"only {n_keep} of {len(g)} clips{'' if len(groups) == 1 else ' of one speaker'} "
                             f"sound like the same phrase (outliers: {[clip_names[i] for i in outliers if i in g]})",
                             fix="record the phrase again, the same way each time")
    rng = np.random.default_rng(seed)
    pos, _ = km.infer(km.features(augment([windows[i] for i in keep], rng)))
    per_clip = len(pos) // len(keep)  # augment's copies of each clip, in clip order
    bank = negative_bank(km.bundle)
    others = [np.asarray(k["prototype"], np.float32) for k in state.keywords
              if k["name"] != norm and "prototype" in k]
    neg = np.concatenate([bank] + ([np.stack(others)] if others else []))
    # One first-stage head per speaker (a linear head between two voices scores both lower): the
    # keyword fires when any does; each is set to its share of the bank false-accept rate.
    heads = []
    for g in groups:
        rows = np.concatenate([np.arange(m * per_clip, (m + 1) * per_clip) for m, i in enumerate(keep) if i in g])
        w, b = train_head(pos[rows], neg)
        ck = CustomKeywords([{"name": norm, "w": w, "b": b, "threshold": 0.5}])
        heads.append({"w": w, "b": b, "bank": ck.scores(bank)[:, 0], "pos": ck.scores(pos[rows])[:, 0]})

    def thresholds(far):
        return [max(0.5, float(np.quantile(h["bank"], 1.0 - far / len(heads)))) for h in heads]

    def bank_far(ts):
        return float(np.mean(np.any([h["bank"] >= t for h, t in zip(heads, ts)], axis=0)))

    ts = thresholds(far_target)
    threshold = ts[0]
    pos_pass = np.concatenate([h["pos"] >= t for h, t in zip(heads, ts)])
    entry = {"name": norm, "prototype": [round(v, 6) for v in P.prototype([embs[i] for i in keep])],
             "w": [round(float(v), 6) for v in heads[0]["w"]], "b": round(heads[0]["b"], 6),
             "threshold": round(threshold, 6), "bank_false_accept_rate": round(bank_far(ts), 5),
             "clips": len(keep), "outliers": [clip_names[i] for i in outliers], "speakers": len(groups),
             "sensitivity": sensitivity,
             "sensitivities": {}}
    ladder, by_head = {}, [{} for _ in heads]
    for level, (far, p_quiet, p_noisy) in SENSITIVITIES.items():
        lt = ts if level == DEFAULT_SENSITIVITY else thresholds(far)
        for h, t in zip(by_head, lt):
            h[level] = round(t, 6)
        if level == DEFAULT_SENSITIVITY:
            continue
        entry["sensitivities"][level] = {"threshold": round(lt[0], 6), "bank_false_accept_rate": round(bank_far(lt), 5)}
        if p_quiet is not None:
            ladder[level] = (p_quiet, p_noisy)
    if len(heads) > 1:
        entry["speaker_heads"] = [{"w": [round(float(v), 6) for v in h["w"]], "b": round(h["b"], 6),
                                   "threshold": t[DEFAULT_SENSITIVITY],
                                   "sensitivities": {k: v for k, v in t.items() if k != DEFAULT_SENSITIVITY}}
                                  for h, t in zip(heads[1:], by_head[1:])]
    report_verify = {}
    if verify is None:
        verify = any(p.get("role") == "backbone" for p in km.bundle.partitions)
        report_verify = {} if verify else {"verify": "off: the bundle has no backbone partition"}
    if verify:
        from edge import verify as V

        ver = V.Verifier(km.bundle)
        kept = np.stack([windows[i] for i in keep])
        templates = ver.templates(kept, km.scale)
        levels, dist, passed, by_level = ver.calibrate(kept, templates, km.scale, rng, ladder=ladder)
        entry["verify"] = V.pack(templates, ver.qparams, levels, dist, ver.version)
        for level, lv in by_level.items():
            entry["sensitivities"][level]["verify_levels"] = [[round(float(r), 4), round(float(t), 6)]
                                                              for r, t in lv]
        report_verify = {"verify_threshold_quiet": round(levels[-1][1], 4),
                         "verify_threshold_noisy": round(levels[0][1], 4),
                         "verify_enrolment_pass_rate": round(float(passed.mean()), 3)}
    state.keywords = [k for k in state.keywords if k["name"] != norm] + [entry]
    if save:
        state.save()
    return {"keyword": norm, "clips": len(clips), "used": len(keep), "speakers": len(groups),
            "outliers": [{"clip": clip_names[i], "cosine": round(float(cos[i]), 3)} for i in outliers],
            "threshold": round(threshold, 4),
            "enrolment_pass_rate": round(float(pos_pass.mean()), 3),
            "bank_false_accept_rate": round(bank_far(ts), 5), **report_verify,
            "sensitivity": sensitivity, "sensitivities": sensitivity_table(entry)}


def check_level(level) -> str:
    if not isinstance(level, str) or level not in SENSITIVITIES:  # [1]: this sentence, not "unhashable"
        raise EdgelearnError(f"sensitivity {level!r} is not one of {', '.join(SENSITIVITIES)}",
                             fix="pass low (fewest false accepts), medium (the default) or high (fewest misses)")
    return level


def sensitivity_table(e: dict) -> dict:
    """{level: {"threshold", "bank_false_accept_rate"[, "fa_per_hour"]}} of entry ``e`` (medium: its
    own fields, the rate None for a keyword enrolled before 2026-12-06; ``fa_per_hour``: measured
    by `device calibrate` on the place's own audio)."""
    out = {}
    measured = e.get("fa_per_hour") or {}
    for level in SENSITIVITIES:
        if level == DEFAULT_SENSITIVITY:
            out[level] = {"threshold": e["threshold"], "bank_false_accept_rate": e.get("bank_false_accept_rate")}
        elif level in e.get("sensitivities", {}):
            lv = e["sensitivities"][level]
            out[level] = {"threshold": lv["threshold"], "bank_false_accept_rate": lv.get("bank_false_accept_rate")}
        else:
            continue
        if level in measured:
            out[level]["fa_per_hour"] = measured[level]
            out[level]["measured_hours"] = e.get("fa_calibrated_hours")
    return out


def most_sensitive_within(e: dict, max_fa_h: float) -> str:
    """The most sensitive level whose false accepts `device calibrate` measured are at most
    ``max_fa_h`` per hour; an EdgelearnError when none was measured or none is within it."""
    measured = e.get("fa_per_hour") or {}
    if not measured:
        raise EdgelearnError(f"no false-accept rates were measured for {e['name']!r}",
                             fix="run `edgelearn device calibrate --state ST --wav everyday.wav` first (an hour "
                                 "or more of the place's audio that never says the keyword)")
    ok = [lv for lv in SENSITIVITIES if lv in measured and measured[lv] <= max_fa_h]
    if not ok:
        raise EdgelearnError(f"{e['name']!r} measured {min(measured.values())} false accepts per hour at best, "
                             f"over {max_fa_h}", fix="allow more, or enrol it again with more or cleaner clips")
    return ok[-1]  # SENSITIVITIES runs from low to high


def keyword_sensitivity(state: DeviceState, name: str, level: str | None = None,
                        max_fa_h: float | None = None) -> dict:
    """Keyword ``name``'s sensitivity and every level's thresholds; with ``level``, detect it at
    that level from now on (the state saved atomically); with ``max_fa_h``, at the most sensitive
    level `device calibrate` measured at or under that many false accepts per hour."""
    if level is not None and max_fa_h is not None:
        raise EdgelearnError("give a level or a false-accept rate, not both", fix="pass --level or --max-fa-per-hour")
    from edge.options import check, check_keyword_name

    check_keyword_name(name)
    check("max_fa_h", max_fa_h)  # 0, inf, -1, nan: refused as `detect --sensitivity` is (edge.options)
    if level is not None:
        check_level(level)
    norm = name.strip().lower()
    entry = next((k for k in state.keywords if k["name"] == norm), None)
    if entry is None:
        raise EdgelearnError(f"no keyword {shown(norm)} is enrolled (enrolled: {', '.join(state.names()) or 'none'})",
                             fix="enrol it first with `edgelearn device enroll`")
    if max_fa_h is not None:
        level = most_sensitive_within(entry, float(max_fa_h))
    if level is not None:
        if level != DEFAULT_SENSITIVITY and level not in entry.get("sensitivities", {}):
            raise EdgelearnError(f"keyword {norm!r} was enrolled before sensitivities existed: it has medium only",
                                 fix="enrol it again (`edgelearn device enroll --replace`) to get low and high")
        entry["sensitivity"] = level
        state.save()
    return {"keyword": norm, "sensitivity": entry.get("sensitivity", DEFAULT_SENSITIVITY),
            "sensitivities": sensitivity_table(entry)}
