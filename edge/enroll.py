"""Few-shot enrolment of custom keywords and the device state that keeps them.

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

State under ``--state DIR`` (one JSON file, written with ``atomic_write``)::

    keywords.json  {"format": 2, "model_id", "model_version",
                    "keywords": [{"name", "prototype", "w", "b", "threshold", "clips", ...,
                                  "verify": {"version", "threshold", "levels", "steps", "templates", ...}}]}

Format 1 (before the verifier) is still read; its keywords run the first stage only
until they are enrolled again. Saving writes format 2.

A state directory belongs to one bundle model and version; another bundle is
refused with a clear message, since embeddings of another encoder mean nothing.

    >>> state = DeviceState.open("state", bundle)
    >>> report = enroll(km, state, "hey edge", [read_wav(p) for p in paths])
    >>> state.custom().scores(embeddings)   # (N, K) in [0, 1]
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from edge import features as F
from edge.errors import EdgelearnError
from edge.atomic import atomic_write
from edge.portable import proto as P

FORMAT = 2
READABLE_FORMATS = (1, 2)
MIN_CLIPS, MAX_CLIPS = 3, 10   # per speaker
MAX_SPEAKERS = 4               # people who enrolled one keyword (`device enroll --add`)
# The first stage's bank false-accept rate and (edge.verify.PASS_TARGETS) the second stage's pass
# rate on distorted enrolment clips per noise level, chosen together on the kws_fewshot main set
# (the stronger stage takes more of the rejection); docs/edge-runtime.md.
FAR_TARGET = 0.004
# A keyword's sensitivities (`device enroll --sensitivity`, `device sensitivity`): per level, the
# first stage's bank false-accept rate and the second stage's pass rate on the distorted enrolment
# clips (levels at 20 dB and above, levels under 20 dB; None: edge.verify's PASS_TARGETS and
# NOISY_PASS of the version). "medium" is the default the targets above were chosen for; "low" and
# "high" were set beforehand, 4x fewer / more bank false accepts, not tuned on any benchmark, and
# bench/kws_custom measures all three.
SENSITIVITIES = {"low": (0.001, 0.5, 0.8), "medium": (FAR_TARGET, None, None), "high": (0.016, 0.8, 0.97)}
DEFAULT_SENSITIVITY = "medium"
MIN_SPEECH_S = 0.2
MAX_CLIP_S = 2.0
SHIFTS_S = (-0.15, -0.075, 0.0, 0.075, 0.15)
# the head's noisy copies of each shifted clip, dB below the window's level (20 only before verifier
# version 7; scripts/enroll_noise.py chose 20/10/5 on development data)
AUGMENT_SNRS_DB = (20.0, 10.0, 5.0)
_NAME = re.compile(r"^[a-z0-9][a-z0-9 _'-]{0,31}$")


class StateError(EdgelearnError):
    """The device state directory is unusable (another bundle, corrupt)."""


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def _vector(v, what: str, n: int | None = None) -> int:
    if not (isinstance(v, list) and v and all(_real(x) for x in v)):
        raise ValueError(f"{what} is not a list of finite numbers")
    if n is not None and len(v) != n:
        raise ValueError(f"{what} has {len(v)} values, the others have {n}")
    return len(v)


def check_keywords(kws) -> list[dict]:
    """The ``keywords`` list of keywords.json, checked entry by entry (what detection, enrolment and
    status read); raises ValueError saying which entry and field is wrong."""
    if not isinstance(kws, list):
        raise ValueError(f"'keywords' is {type(kws).__name__}, not a list")
    dim, names = None, set()
    for i, e in enumerate(kws):
        where = f"keyword {i + 1}"
        if not isinstance(e, dict):
            raise ValueError(f"{where} is {type(e).__name__}, not an object")
        name = e.get("name")
        if not isinstance(name, str) or not _NAME.match(name) or name in names:
            raise ValueError(f"{where} has name {name!r} (not a usable, unique keyword name)")
        names.add(name)
        where = f"keyword {name!r}"
        dim = _vector(e.get("w"), f"{where} 'w'", dim)
        if "prototype" in e:  # enrolment keeps it (hand-made entries may lack it; detection does not need it)
            _vector(e["prototype"], f"{where} 'prototype'", dim)
        for k in ("b", "threshold"):
            if not _real(e.get(k)):
                raise ValueError(f"{where} {k!r} is {e.get(k)!r}, not a finite number")
        _check_sensitivity(e, where)
        _check_speaker_heads(e, where, dim)
        if "verify" in e:
            v = e["verify"]
            if not isinstance(v, dict):
                raise ValueError(f"{where} 'verify' is {type(v).__name__}, not an object")
            ver = v.get("version", 1)
            if isinstance(ver, bool) or not isinstance(ver, int):
                raise ValueError(f"{where} verifier version {ver!r} is not a number")
            if not _real(v.get("threshold")):
                raise ValueError(f"{where} verifier threshold {v.get('threshold')!r} is not a finite number")
            q = v.get("qparams", [])
            if not (isinstance(q, list) and all(_real(x) for x in q)):
                raise ValueError(f"{where} verifier qparams {q!r} are not numbers")
            from edge import verify as V

            try:  # templates, steps and levels, as the detector will read them
                V.unpack(v)
                V.levels_of(v)
            except EdgelearnError as err:
                raise ValueError(f"{where}: {err.problem}") from None
    return kws


def _logit(p: float) -> float:
    p = min(max(float(p), 1e-6), 1 - 1e-6)
    return float(np.log(p / (1 - p)))


def _check_speaker_heads(e: dict, where: str, dim) -> None:
    heads = e.get("speaker_heads", [])
    if not isinstance(heads, list):
        raise ValueError(f"{where} 'speaker_heads' is not a list")
    for h in heads:
        if not isinstance(h, dict) or not _real(h.get("b")) or not _real(h.get("threshold")):
            raise ValueError(f"{where} has a speaker head without a finite 'b' and 'threshold'")
        _vector(h.get("w"), f"{where} speaker head 'w'", dim)
        lv = h.get("sensitivities", {})
        if not isinstance(lv, dict) or not all(k in SENSITIVITIES and _real(v) for k, v in lv.items()):
            raise ValueError(f"{where} speaker head 'sensitivities' is not a table of thresholds")
        if set(lv) != set(e.get("sensitivities", {})):
            raise ValueError(f"{where} speaker heads and the keyword have different sensitivity levels")


def _check_sensitivity(e: dict, where: str) -> None:
    level, table = e.get("sensitivity", DEFAULT_SENSITIVITY), e.get("sensitivities", {})
    if level not in SENSITIVITIES:
        raise ValueError(f"{where} sensitivity {level!r} is not one of {', '.join(SENSITIVITIES)}")
    if not isinstance(table, dict) or any(k not in SENSITIVITIES or not isinstance(v, dict) or not _real(
            v.get("threshold")) for k, v in table.items()):
        raise ValueError(f"{where} 'sensitivities' is not a table of levels with thresholds")
    for k, v in table.items():
        lv = v.get("verify_levels")
        if lv is not None and not (isinstance(lv, list) and lv and all(
                isinstance(p, list) and len(p) == 2 and all(_real(x) for x in p) for p in lv)):
            raise ValueError(f"{where} sensitivity {k!r} verifier levels are not (range, threshold) pairs")
    if level != DEFAULT_SENSITIVITY and level not in table:
        raise ValueError(f"{where} is set to sensitivity {level!r}, which its entry has no thresholds for")
    fa = e.get("fa_per_hour", {})
    if not isinstance(fa, dict) or not all(k in SENSITIVITIES and _real(v) and v >= 0 for k, v in fa.items()):
        raise ValueError(f"{where} 'fa_per_hour' is not a table of measured rates by level")


def at_sensitivity(e: dict) -> dict:
    """Entry ``e`` with the thresholds of its chosen sensitivity in the fields the detector reads
    (``threshold``; the verifier's ``levels`` and ``threshold``)."""
    level = e.get("sensitivity", DEFAULT_SENSITIVITY)
    if level == DEFAULT_SENSITIVITY:
        return e
    lv = e["sensitivities"][level]
    out = {**e, "threshold": lv["threshold"]}
    if "speaker_heads" in e:
        out["speaker_heads"] = [{**h, "threshold": h["sensitivities"][level]} for h in e["speaker_heads"]]
    if "verify" in e and lv.get("verify_levels"):
        out["verify"] = {**e["verify"], "levels": lv["verify_levels"],
                         "threshold": max(t for _, t in lv["verify_levels"])}
    return out


class CustomKeywords:
    """Scores of enrolled keywords from embeddings: sigmoid(w . e/|e| + b), and their second stage.

    ``bundle``: needed for the second stage (``edge.verify``) of keywords that carry one; without
    it (or with ``verify=False``) only the first stage runs."""

    def __init__(self, entries: list[dict], bundle=None, verify: bool = True):
        entries = [at_sensitivity(e) for e in entries]
        self.names = [e["name"] for e in entries]
        self.thresholds = np.array([e["threshold"] for e in entries], np.float32)
        # one row per speaker head (``speaker_heads``: the second and later people who enrolled), its
        # bias moved so that it crosses the keyword's threshold where it crosses its own; a keyword
        # scores its best row
        rows = [(k, e["w"], e["b"]) for k, e in enumerate(entries)]
        for k, e in enumerate(entries):
            t = _logit(e["threshold"])
            rows += [(k, h["w"], h["b"] - _logit(h["threshold"]) + t) for h in e.get("speaker_heads", ())]
        self._row_of = np.array([r[0] for r in rows], np.int64)
        self.w = np.array([r[1] for r in rows], np.float32).reshape(len(rows), -1)
        self.b = np.array([r[2] for r in rows], np.float32)
        self.verifier, self.templates, self.verify_thresholds = None, [None] * len(entries), []
        self.verify_levels = [None] * len(entries)
        if verify and bundle is not None and any("verify" in e for e in entries):
            from edge import verify as V

            self.verifier = V.Verifier(bundle)
            self.templates = [V.unpack(e["verify"], self.verifier.dim) if "verify" in e else None
                              for e in entries]
            stale = [e["name"] for e in entries if "verify" in e
                     and tuple(e["verify"].get("qparams", ())) != tuple(self.verifier.qparams)]
            if stale:
                raise StateError(f"keywords {stale} were verified with another backbone's quantisation",
                                 fix="re-enrol them for this bundle (--replace)")
            self.verify_levels = [V.levels_of(e["verify"]) if "verify" in e else None for e in entries]
            self._threshold_at = V.threshold_at
        self.verify_thresholds = [e["verify"]["threshold"] if "verify" in e else None for e in entries]
        self.verify_versions = [e["verify"].get("version", 1) if "verify" in e else None for e in entries]
        # per keyword, once: its templates as unit vectors (``Verifier.prepare``) and the lowest and
        # highest threshold its levels can give a window (``_passes``)
        self._prepared = [None if t is None else self.verifier.prepare(t, v)
                          for t, v in zip(self.templates, self.verify_versions)]
        self._bounds = [None if lv is None else (min(t for _, t in lv), max(t for _, t in lv))
                        for lv in self.verify_levels]

    def verifies(self, k: int) -> bool:
        return self.verifier is not None and self.templates[k] is not None

    def searches(self, k: int) -> bool:
        """Does keyword ``k``'s second stage check every window of a candidate (version 6 on), not
        only its peak window?"""
        from edge.verify import searches

        return self.verifies(k) and searches(self.verify_versions[k])

    def verify(self, k: int, feats: np.ndarray) -> tuple[bool, float]:
        """Second stage for keyword ``k`` on one normalised (49, 10) window: (passes, distance)."""
        if not self.verifies(k):
            return True, 0.0
        version, feats = self.verify_versions[k], np.asarray(feats)
        seqs = self.verifier.sequences(feats[None], version)
        d = float(self.verifier.distance(seqs, self._prepared[k], version=version)[0])
        return self._passes(k, d, feats), d

    def passes_any(self, k: int, windows) -> bool:
        """Does any of ``windows`` (normalised (49, 10) each) pass keyword ``k``'s second stage? The
        answer of ``any(verify(k, w)[0] for w in windows)``, from the same distances (each window's
        steps as ``verify`` makes them, one backbone run each), all aligned in one ``sdtw_batch``:
        the detector asks this of a candidate's windows, most of which it would try anyway."""
        if not self.verifies(k):
            return True
        if not len(windows):
            return False
        version = self.verify_versions[k]
        windows = [np.asarray(w) for w in windows]
        seqs = np.concatenate([self.verifier.sequences(w[None], version) for w in windows])
        d = self.verifier.distance(seqs, self._prepared[k], version=version)
        return any(self._passes(k, float(x), w) for x, w in zip(d, windows))

    # How far np.interp's result may stray outside the two level thresholds it blends: it computes a
    # convex combination in float64, a few units in the last place (~1e-16 here), far under this.
    _INTERP_SLACK = 1e-9

    def _passes(self, k: int, d: float, feats: np.ndarray) -> bool:
        """``d <= threshold_at(levels, feats)`` for keyword ``k``. The threshold interpolated at the
        window's noise range lies between the entry's lowest and highest level thresholds, so a
        distance clear of that span is decided without the range (a percentile over the window's
        frames); one within it (or within ``_INTERP_SLACK`` of its ends), and a window whose loudness
        is not finite (its range, then its threshold, would be NaN), gets the exact threshold."""
        levels = self.verify_levels[k]
        if levels is None:
            return d <= self.verify_thresholds[k]
        lo, hi = self._bounds[k]
        if np.isfinite(feats[..., 0]).all():
            if d < lo - self._INTERP_SLACK:
                return True
            if d > hi + self._INTERP_SLACK:
                return False
        return d <= float(self._threshold_at(levels, feats))

    def scores(self, emb: np.ndarray) -> np.ndarray:
        e = np.asarray(emb, np.float32)
        e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        z = e @ self.w.T + self.b
        if len(self._row_of) > len(self.names):
            best = np.full((len(e), len(self.names)), -np.inf, np.float32)
            np.maximum.at(best.T, self._row_of, z.T)
            z = best
        return 1.0 / (1.0 + np.exp(-z))


class DeviceState:
    """Enrolled keywords of one state directory, bound to one bundle model and version."""

    def __init__(self, root: Path, model_id: str, version: int, keywords: list[dict], bundle=None):
        self.root, self.model_id, self.version, self.keywords = Path(root), model_id, version, keywords
        self.bundle = bundle
        self.path = self.root / "keywords.json"

    @classmethod
    def open(cls, root, bundle) -> "DeviceState":
        root = Path(root)
        path = root / "keywords.json"
        if root.exists() and not root.is_dir():
            raise StateError(f"state path {root} is a file, not a directory", fix="pass a directory to --state")
        if not path.exists():
            return cls(root, bundle.model_id, bundle.version, [], bundle)
        try:
            data = json.loads(path.read_bytes())
            if not isinstance(data, dict):
                raise ValueError(f"it holds {type(data).__name__}, not an object")
            if data.get("format") not in READABLE_FORMATS:
                raise ValueError(f"format {data.get('format')!r}, this runtime reads {READABLE_FORMATS}")
            mid, ver = data.get("model_id"), data.get("model_version")
            if not isinstance(mid, str) or isinstance(ver, bool) or not isinstance(ver, int):
                raise ValueError(f"model {mid!r} v{ver!r} is not a model id and version")
            kws = check_keywords(data.get("keywords"))
        except (ValueError, OSError) as e:  # JSON and UTF-8 errors are ValueErrors
            raise StateError(f"{path} is unreadable ({getattr(e, 'strerror', None) or e})",
                             fix="restore it from a backup or delete it and enrol again") from None
        if (mid, ver) != (bundle.model_id, bundle.version):
            raise StateError(f"state directory {root} belongs to bundle {mid} v{ver} (says {path}), not "
                             f"{bundle.model_id} v{bundle.version}; its keywords were learned with "
                             "another encoder", fix="use the matching bundle, another --state "
                             "directory, or re-enrol the keywords for this bundle")
        return cls(root, mid, ver, kws, bundle)

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {"format": FORMAT, "model_id": self.model_id, "model_version": self.version,
                "keywords": self.keywords}
        atomic_write(self.root / "keywords.json", json.dumps(data, indent=1).encode())

    def names(self) -> list[str]:
        return [k["name"] for k in self.keywords]

    def custom(self, verify: bool = True, dim: int | None = None) -> CustomKeywords | None:
        """The enrolled keywords' scorer (None if there are none). ``dim``: the embedding size of the
        model that will score them, checked against theirs."""
        if not self.keywords:
            return None
        n = len(self.keywords[0]["w"])
        if dim is not None and n != dim:
            raise StateError(f"keywords in {self.path} score {n}-d embeddings, this bundle's encoder gives {dim}",
                             fix="restore the file from a backup, or delete it and enrol again")
        try:
            return CustomKeywords(self.keywords, self.bundle, verify)
        except EdgelearnError as e:  # a verifier entry this bundle cannot read
            raise StateError(f"{self.path}: {e.problem}", fix=e.fix) from None


def check_name(name: str, base_labels, existing) -> str:
    norm = " ".join(name.strip().lower().split())
    if not _NAME.match(norm):
        raise EdgelearnError(f"keyword name {name!r} is not usable",
                             fix="use 1-32 letters, digits, spaces, ' _ or -, starting with a letter or digit")
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
             "threshold": round(threshold, 6),
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
    if level not in SENSITIVITIES:
        raise EdgelearnError(f"sensitivity {level!r} is not one of {', '.join(SENSITIVITIES)}",
                             fix="pass low (fewest false accepts), medium (the default) or high (fewest misses)")
    return level


def sensitivity_table(e: dict) -> dict:
    """{level: {"threshold", "bank_false_accept_rate"[, "fa_per_hour"]}} of entry ``e`` (medium: its
    own fields; ``fa_per_hour``: measured by `device calibrate` on the place's own audio)."""
    out = {}
    measured = e.get("fa_per_hour") or {}
    for level in SENSITIVITIES:
        if level == DEFAULT_SENSITIVITY:
            out[level] = {"threshold": e["threshold"]}
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
    if level is not None:
        check_level(level)
    norm = name.strip().lower()
    entry = next((k for k in state.keywords if k["name"] == norm), None)
    if entry is None:
        raise EdgelearnError(f"no keyword {norm!r} is enrolled (enrolled: {', '.join(state.names()) or 'none'})",
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
