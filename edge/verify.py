"""Second-stage verifier for custom keywords: the order of sounds, by template matching over time.

The first stage (``edge.enroll.CustomKeywords``) scores a 64-d embedding that is a
mean over time, so "blue ferry" and "blueberry" can look alike to it. When it
fires, the verifier looks at the same 1 s window as a sequence: the frozen int8
backbone (``backbone_int8.tflite``, cut at ``pw3_relu``) gives 25 time steps of
5 x 64 activations, one 320-d vector per 40 ms, and (version 3) each step also
carries c1-c9 of the two normalised MFCC frames it covers (18 values, int8 at
``MFCC_Q``; c0, the loudness contour, is left to the backbone). The backbone's
features were trained to name 35 words; the spectral detail they drop is what
tells "bandana" from "banana". Each enrolment clip's speech steps are a template
(kept as int8). The cosine of two steps is ``1 - MFCC_WEIGHT`` times their
backbone parts' cosine plus ``MFCC_WEIGHT`` times their MFCC parts'. A window's
distance to a template is the mean cosine distance along the best alignment of
every template step to one window step, the window steps advancing by 0, 1 or 2
and never by 0 twice in a row (so the phrase may be up to twice as fast, or up
to twice as slow, and sit anywhere in the window): a subsequence DTW. The
distance is the smallest over the templates; the window passes at or below
the keyword's threshold.

The threshold comes from the enrolment clips alone (``calibrate``) and, since version 4,
follows the noise in the window: each clip is distorted as a stream distorts speech (+-10 %
speed, white or brown noise at ``SNR_LEVELS_DB`` on the speech) and compared with the *other*
clips' templates. Per noise level, the threshold is the distance that ``PASS_TARGETS`` (0.8;
0.85 in version 5, 0.65 from version 6) of these leave-one-out distances stay under, and the level is known to the
window by the range of
its loudness (normalised c0, loudest frame minus the 10th percentile, ``noise_range``; the median
from version 8): the
entry keeps (range, threshold) per level and a window's threshold is interpolated at its own
range, clamped to the ends. A quiet window gets the tight threshold of clean renders, a noisy one
the loose threshold that noise needs; one threshold for all (version 3) had to be the loose one.

Version 5 adds what was said: bundles built since then ship a phone model (``phones_int8.tflite``,
``host/phones.py``: per 20 ms frame, posteriors over espeak-ng's phones, trained with CTC on
words no bench speaks). Each step also carries the square roots of the posteriors of its two
frames, and the step cosine is ``WEIGHTS_5`` of the backbone, MFCC and phone parts' cosines (the
phone posteriorgrams of query-by-example spoken term detection). Backbone features and MFCC
frames move with the voice and the noise; phone posteriors were trained not to, so one wrong
phone moves them more than a renders' noise does. Bundles without a phone model enrol version 4.

Version 6 keeps version 5's steps and changes where they are looked for: the detector checks
every window of a first-stage candidate (from the run that crossed the threshold to the one that
closed it, the peak's first), and the keyword passes if any of them does (``searches``). The
first stage's peak is where the mean embedding matched best, not where a long phrase sits
whole in the window; with more windows tried, the thresholds are set tighter (65 % of the
distorted clips per level instead of 85 %). Versions 1-5 keep the peak window only.

Version 7 keeps version 6 and sets its thresholds for noise: levels at 5, 10, 20 and 30 dB (6: 10,
20, 30), and under 20 dB the distance 90 % of the distorted clips stay under (65 % at 20 and 30 dB):
a stream at 5-10 dB SNR otherwise lost most of the enrolment voice's own keywords. Chosen on
development data (scripts/enroll_noise.py) with the first stage's noisier copies (``edge.enroll.
AUGMENT_SNRS_DB``).

Version 8 keeps version 7 and measures a window's noise range from its median frame instead of
its 10th percentile (``RANGE_PERCENTILE``). Babble is speech: loud in words, quiet between them,
so a babble window's 10th percentile sat in a gap and the window was given the tight clean
threshold although its distances were a noisy window's. The adapted base commands' entries are
built with it (``COMMANDS_VERSION``; chosen on development data, scripts/adapt_verify.py). Custom
keywords still enrol version 7: on bench kws_fewshot version 8 missed more and accepted more
(docs/edge-runtime.md, "Babble is noise too").

The alignment (``sdtw``, ``sdtw_batch``, ``Prepared``) is ``edge/verify_align.py``.
    >>> v = Verifier(bundle)                         # v.version: 7 with the bundle's phone model, else 4
    >>> tpl = v.templates(windows, scale)            # int8 templates from 1 s int16 enrolment windows
    >>> levels, d, passed = v.calibrate(windows, tpl, scale, rng)
    >>> feats = F.normalize(F.mfcc(pcm), scale)       # (N, 49, 10)
    >>> ok = v.distance(v.sequences(feats), tpl) <= threshold_at(levels, feats, v.version)
"""

from __future__ import annotations

import base64

import numpy as np

from edge import features as F
from edge.errors import EdgelearnError
# the alignment has a module of its own; every name stays importable here
from edge.verify_align import Prepared, sdtw, sdtw_batch  # noqa: F401 (sdtw: re-exported)

STEPS = 25                    # backbone time steps per 1 s window (stride 2 over 49 frames)
MIN_TEMPLATE_STEPS = 4
SPEEDS = (0.9, 1.0, 1.1)
SNR_LEVELS_DB = (10.0, 20.0, 30.0)
# 8: version 7 with a window's noise range measured from its median frame (``RANGE_PERCENTILE``;
# the adapted base commands only: custom keywords lost more than they gained, docs/edge-runtime.md);
# 7: version 6 with its thresholds set for noise (``LEVELS_DB``, ``NOISY_PASS``); 6: version 5's steps, thresholds for a detector that checks every window of a candidate
# (``SEARCHES``); 5: phone posteriors beside the MFCC frames (bundles with a ``phones`` partition;
# others enrol version 4); 4: a threshold per noise level; 3: MFCC frames beside the backbone
# steps; 2: at most two template steps per window step; 1: no such limit. Entries keep the version
# they were enrolled (and calibrated) with: versions 1-3 have one threshold.
VERSION = 7                   # what a custom keyword enrols (with the bundle's phone model)
COMMANDS_VERSION = 8          # what the adapted base commands' entries are built with (edge/adapt/verified.py)
READABLE = (1, 2, 3, 4, 5, 6, 7, 8)
SEARCHES = 6                  # from this version on, a candidate passes if any of its windows does
MFCC_DIM = 2 * (F.N_MFCC - 1)  # c1-c9 of two 20 ms frames per 40 ms backbone step
MFCC_Q = 24.0                 # int8 units per unit of normalised MFCC (|v| <= 5.3 kept)
MFCC_WEIGHT = 0.3             # chosen on the kws_fewshot main set; see docs/edge-runtime.md
# version 5's shares of the step cosine: backbone, MFCC frames, phone posteriors (main set, ibid.)
WEIGHTS_5 = (0.7, 0.1, 0.2)
PHONE_Q = 127.0               # int8 units per unit of sqrt(posterior)
PASS_TARGET = 0.65            # per noise level, with edge.enroll.FAR_TARGET; see docs/edge-runtime.md
PASS_TARGETS = {4: 0.8, 5: 0.85, 6: PASS_TARGET, 7: PASS_TARGET, 8: PASS_TARGET}  # by the version a bundle enrols
# version 7: thresholds also at 5 dB, and where 90 % of the distorted clips pass under 20 dB (chosen on
# development data: scripts/enroll_noise.py; docs/edge-runtime.md, "Enrolment in noise")
LEVELS_DB = {7: (5.0, 10.0, 20.0, 30.0), 8: (5.0, 10.0, 20.0, 30.0)}   # by version; others SNR_LEVELS_DB
NOISY_PASS = {7: 0.9, 8: 0.9}               # by version: the pass target of levels under 20 dB
# version 8: the percentile of a window's loudness its noise range is measured from (others: 10).
# Babble is quiet between its words, so the 10th percentile sat in a gap and called a babble window
# clean (docs/edge-runtime.md, "Babble is noise too")
RANGE_PERCENTILE = {8: 50}


def phones_partition(bundle) -> dict | None:
    """The bundle's phone model (``host/phones.py``), or None for a bundle without one."""
    parts = [p for p in bundle.partitions if p.get("role") == "phones" and p.get("format") == "tflite"]
    return parts[0] if parts else None


def searches(version: int | None) -> bool:
    """Does an entry of ``version`` pass a candidate on any of its windows (else: its peak window only)?"""
    return version is not None and version >= SEARCHES


def version_for(bundle, commands: bool = False) -> int:
    """The verifier version a bundle enrols with a phone model: ``VERSION`` (7) for a custom keyword,
    ``COMMANDS_VERSION`` (8) for an adapted base command (``commands``); else 4."""
    if phones_partition(bundle) is None:
        return 4
    return COMMANDS_VERSION if commands else VERSION


class PhoneModel:
    """The bundle's int8 phone model: normalised (N, 49, 10) windows -> (N, 49, phones) posteriors
    over the phones without the CTC blank."""

    def __init__(self, bundle, part: dict, backend: str = "auto", num_threads: int = 1):
        from edge.backends import backend_for, dequantize, load, quantize

        self._q, self._dq = quantize, dequantize
        self.backend = load(bundle.path(part["file"]), backend_for(backend, part.get("format")), num_threads)
        self.n = int(self.backend.outputs[0].shape[-1])

    def __call__(self, feats: np.ndarray) -> np.ndarray:
        x = self._q(np.asarray(feats, np.float32).reshape(-1, F.N_FRAMES, F.N_MFCC), self.backend.inputs[0])
        return self._dq(self.backend.invoke(x)[0], self.backend.outputs[0])


class Verifier:
    """The bundle's int8 backbone (and phone model, version 5 on) as a per-time-step feature
    extractor, plus template distances. ``version`` is what it enrols: the ``version`` given (the
    adapted commands pass ``COMMANDS_VERSION``), else ``version_for(bundle)``, a custom keyword's;
    every method also takes another entry's version."""

    def __init__(self, bundle, backend: str = "auto", num_threads: int = 1, version: int | None = None):
        from edge.adapt.conv import Backbone

        try:
            self.backbone = Backbone(bundle, backend=backend, num_threads=num_threads)
        except EdgelearnError as e:
            raise EdgelearnError(f"the custom-keyword verifier needs the bundle's backbone: {e}",
                                 fix="use a bundle built by `edgelearn model` (it ships backbone_int8.tflite), "
                                     "or enrol with verify=False") from None
        self.qparams = self.backbone.qparams
        out = self.backbone.backend.outputs[0]
        self.backbone_dim = int(np.prod(out.shape[2:]))  # 5 x 64 per time step
        part = phones_partition(bundle)
        self.phones = None if part is None else PhoneModel(bundle, part, backend, num_threads)
        self.version = version_for(bundle) if version is None else int(version)  # what it enrols

    def dim(self, version: int | None = None) -> int | None:
        """Values per step of a template of ``version`` (None: a version-5 entry on a bundle
        without a phone model, which cannot be checked or run)."""
        version = version or self.version
        if version >= 5 and self.phones is None:
            return None
        return (self.backbone_dim + (MFCC_DIM if version >= 3 else 0)
                + (2 * self.phones.n if version >= 5 else 0))

    def raw(self, feats: np.ndarray, version: int | None = None) -> np.ndarray:
        """(N, 49, 10) normalised features -> int8 (N, 25, dim) steps: backbone (+ MFCC frames, v3;
        + the square roots of the phone posteriors of the same two frames, v5)."""
        version = version or self.version
        f = np.asarray(feats, np.float32).reshape(-1, F.N_FRAMES, F.N_MFCC)
        q = self.backbone(f)
        q = q.reshape(len(q), q.shape[1], -1)
        if version < 3:
            return q
        parts = [q, _pairs(np.clip(np.rint(f[..., 1:] * MFCC_Q), -127, 127))]  # c0 left out
        if version >= 5:
            if self.phones is None:
                raise EdgelearnError("a version-5 verifier entry needs the bundle's phone model",
                                     fix="use the bundle the keyword was enrolled with, or re-enrol it")
            parts.append(_pairs(np.rint(np.sqrt(np.maximum(self.phones(f), 0.0)) * PHONE_Q)))
        return np.concatenate([p.astype(np.int8) for p in parts], axis=-1)

    def unit(self, q: np.ndarray, version: int | None = None) -> np.ndarray:
        """int8 steps -> float32 vectors whose dot product is the step cosine of ``version``: each
        part a unit vector (the backbone's zero point removed first), weighted by its share."""
        version = version or self.version
        bb = q[..., : self.backbone_dim].astype(np.float32) - np.float32(self.qparams[1])
        if version < 3:
            return bb / np.maximum(np.linalg.norm(bb, axis=-1, keepdims=True), 1e-6)
        cut = self.backbone_dim + MFCC_DIM
        parts = [bb, q[..., self.backbone_dim:cut].astype(np.float32)]
        weights = (1.0 - MFCC_WEIGHT, MFCC_WEIGHT)
        if version >= 5:
            parts.append(q[..., cut:].astype(np.float32))
            weights = WEIGHTS_5
        out = []
        for v, w in zip(parts, weights):
            v /= np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-6)
            out.append(v * np.float32(np.sqrt(w)))
        return np.concatenate(out, axis=-1)

    def sequences(self, feats: np.ndarray, version: int | None = None) -> np.ndarray:
        return self.unit(self.raw(feats, version), version)

    def templates(self, windows: np.ndarray, scale) -> list[np.ndarray]:
        """1 s int16 enrolment windows (speech centred) -> one int8 (m, dim) template each."""
        raw = self.raw(F.normalize(F.mfcc(np.asarray(windows)), scale))
        return [r[a:b] for r, (a, b) in zip(raw, (speech_steps(w) for w in windows))]

    def prepare(self, templates: list[np.ndarray], version: int | None = None) -> "Prepared":
        """A keyword's int8 templates as ``distance`` uses them, once (the detector keeps one per keyword
        instead of turning every template into unit vectors at every window)."""
        version = version or self.version
        return Prepared([self.unit(t, version) for t in templates], version)

    def distance(self, seqs: np.ndarray, templates, exclude: int | None = None,
                 version: int | None = None) -> np.ndarray:
        """(N, 25, dim) ``sequences(feats, version)`` -> (N,) smallest template distance (``exclude``:
        a template index; ``version``: the entry's, whose threshold was calibrated with its
        features and alignment). ``templates``: int8 templates or ``prepare(templates, version)``.
        Every template in one ``sdtw_batch``: the same numbers as ``sdtw`` template by template."""
        version = version or self.version
        if not isinstance(templates, Prepared):
            templates = self.prepare(templates, version)
        elif templates.version != version:
            raise ValueError(f"templates prepared for version {templates.version}, asked for {version}")
        keep = [k for k in range(len(templates.units)) if k != exclude]
        d = sdtw_batch([templates.units[k] for k in keep], seqs, version >= 2,
                       stacked=templates.stacked if len(keep) == len(templates.units) else None)
        return d.min(axis=0)

    def calibrate(self, windows: np.ndarray, templates: list[np.ndarray], scale, rng,
                  pass_target: float | None = None, levels_db=None, noisy_pass: float | None = None,
                  ladder: dict | None = None) -> tuple[list[list[float]], np.ndarray, np.ndarray]:
        """Thresholds per noise level from leave-one-out distances of the distorted enrolment
        windows (``pass_target``: default ``PASS_TARGETS`` of this bundle's version; ``levels_db``
        and ``noisy_pass``, the pass target of levels under 20 dB: ``LEVELS_DB`` and ``NOISY_PASS``
        of the version, else ``SNR_LEVELS_DB`` and none). Returns
        (levels: [[noise range, threshold], ...] by rising range, every distance, whether each
        passes at the threshold its own window is given). ``ladder``: {name: (pass_target,
        noisy_pass)}; then a fourth item, {name: levels} from the same distances (the keyword's
        sensitivities, ``edge.enroll.SENSITIVITIES``)."""
        pass_target = PASS_TARGETS[self.version] if pass_target is None else pass_target
        levels_db = LEVELS_DB.get(self.version, SNR_LEVELS_DB) if levels_db is None else tuple(levels_db)
        noisy_pass = NOISY_PASS.get(self.version) if noisy_pass is None else noisy_pass
        if len(templates) < 2:
            raise EdgelearnError("the verifier needs at least 2 enrolment clips", fix="record more clips")
        dist = {lv: [] for lv in levels_db}
        rng_of = {lv: [] for lv in levels_db}
        prepared = self.prepare(templates)
        for k, w in enumerate(windows):
            for lv in levels_db:
                feats = F.normalize(F.mfcc(distort(w, rng, lv)), scale)
                dist[lv].append(self.distance(self.sequences(feats), prepared, exclude=k))
                rng_of[lv].append(noise_range(feats, self.version))
        d = {lv: np.concatenate(v) for lv, v in dist.items()}
        r = {lv: np.concatenate(v) for lv, v in rng_of.items()}

        def levels_for(target, noisy):
            return sorted([float(np.median(r[lv])),
                           float(np.quantile(d[lv], target if lv >= 20 or noisy is None else max(target, noisy)))]
                          for lv in levels_db)

        levels = levels_for(pass_target, noisy_pass)
        all_d, all_r = np.concatenate(list(d.values())), np.concatenate(list(r.values()))
        out = levels, all_d, all_d <= interpolate(levels, all_r)
        if ladder is None:
            return out
        return out + ({name: levels_for(t, n) for name, (t, n) in ladder.items()},)


def noise_range(feats: np.ndarray, version: int) -> np.ndarray:
    """(..., 49, 10) normalised windows -> (...,) range of their loudness: the loudest frame's c0 minus
    the ``RANGE_PERCENTILE`` (of the entry's ``version``; 10th before version 8) percentile's, about
    the speech-to-noise ratio on a log scale."""
    c0 = np.asarray(feats, np.float32)[..., 0]
    return c0.max(axis=-1) - np.percentile(c0, RANGE_PERCENTILE.get(version, 10), axis=-1)


def interpolate(levels, ranges) -> np.ndarray:
    """Thresholds at ``ranges`` from a version-4 entry's (range, threshold) levels: piecewise linear
    between them, the end levels' thresholds beyond."""
    lv = np.asarray(levels, np.float64)
    return np.interp(np.asarray(ranges, np.float64), lv[:, 0], lv[:, 1])


def threshold_at(levels, feats: np.ndarray, version: int) -> np.ndarray:
    """The threshold a version-4 (or later) entry of ``version`` gives each normalised (..., 49, 10)
    window."""
    return interpolate(levels, noise_range(feats, version))


def speech_bounds(window: np.ndarray) -> tuple[int, int]:
    """First and last speech frame of a clip window (``edge.enroll.speech_bounds``, the rule
    enrolment centres clips with)."""
    from edge.enroll import speech_bounds as bounds

    b = bounds(window)
    if b is None:
        raise EdgelearnError("an enrolment window is silent", fix="record the phrase again")
    return b


def speech_steps(window: np.ndarray) -> tuple[int, int]:
    """Backbone steps [a, b) that cover a 1 s clip window's speech, plus a step each side."""
    first, last = speech_bounds(window)
    a, b = max(0, first // 2 - 1), min(STEPS, last // 2 + 2)
    if b - a < MIN_TEMPLATE_STEPS:
        a = max(0, min(a, STEPS - MIN_TEMPLATE_STEPS))
        b = a + MIN_TEMPLATE_STEPS
    return a, b


def distort(window: np.ndarray, rng, snr_db: float) -> np.ndarray:
    """The clip's speech at each of ``SPEEDS`` (resampled, so pitch moves too), each with white and
    with brown-ish noise at ``snr_db`` on the speech: (6, 16000) int16."""
    first, last = speech_bounds(window)
    sp = np.asarray(window, np.float32)[first * F.HOP_LENGTH: last * F.HOP_LENGTH + F.FRAME_LENGTH]
    power = float((sp ** 2).mean())
    out = []
    for speed in SPEEDS:
        n = int(len(sp) / speed)
        x = F.fit_to_window(np.interp(np.arange(n) * speed, np.arange(len(sp)), sp).astype(np.float32))
        for brown in (False, True):
            z = rng.standard_normal(x.size).astype(np.float32)
            if brown:
                z = np.cumsum(z)
                z -= np.convolve(z, np.ones(64) / 64, mode="same")
            z *= np.sqrt(power / 10 ** (snr_db / 10) / max(float((z ** 2).mean()), 1e-12))
            out.append(np.clip(x + z, -32768, 32767))
    return np.asarray(out).astype(np.int16)


def _pairs(frames: np.ndarray) -> np.ndarray:
    """(N, 49, k) per-frame values -> (N, 25, 2k): the two 20 ms frames of each 40 ms step (frame
    49 repeats frame 48)."""
    f = np.concatenate([frames, frames[:, -1:]], axis=1)
    return f.reshape(len(f), STEPS, -1)


def pack(templates: list[np.ndarray], qparams, levels, distances: np.ndarray, version: int = VERSION) -> dict:
    """The state entry of a keyword's verifier (JSON-safe; int8 templates in base64). ``threshold`` is
    the noisiest level's, the loosest any window gets."""
    levels = [[round(float(r), 4), round(float(t), 6)] for r, t in levels]
    return {"version": int(version), "threshold": max(t for _, t in levels), "levels": levels,
            "qparams": [float(qparams[0]), int(qparams[1])], "dim": int(templates[0].shape[1]),
            "steps": [int(len(t)) for t in templates],
            "templates": base64.b64encode(np.concatenate(templates).astype(np.int8).tobytes()).decode(),
            "loo_median": round(float(np.median(distances)), 4)}


def levels_of(entry: dict) -> list[list[float]] | None:
    """A version-4 (or later) entry's (noise range, threshold) levels, checked; None for older entries
    (one threshold)."""
    if entry.get("version", 1) < 4:
        return None
    try:
        lv = [[float(r), float(t)] for r, t in entry["levels"]]
        if not lv or not np.all(np.isfinite(lv)) or any(b[0] < a[0] for a, b in zip(lv, lv[1:])):
            raise ValueError(f"levels {entry['levels']!r} are not (range, threshold) pairs by rising range")
    except (KeyError, ValueError, TypeError) as e:
        raise EdgelearnError(f"a keyword's verifier entry is unreadable ({e})",
                             fix="re-enrol the keyword (--replace)") from None
    return lv


def unpack(entry: dict, dim_of=None) -> list[np.ndarray]:
    """int8 templates of a state entry; a clear error for an entry this runtime cannot read
    (``dim_of``: ``Verifier.dim``, values per step by version, to check the entry's ``dim``)."""
    try:
        if entry["version"] not in READABLE:
            raise ValueError(f"verifier version {entry['version']}, this runtime reads {READABLE}")
        flat = np.frombuffer(base64.b64decode(entry["templates"]), np.int8)
        steps, dim = [int(s) for s in entry["steps"]], int(entry["dim"])
        if flat.size != sum(steps) * dim or not steps:
            raise ValueError(f"{flat.size} template values for steps {steps} x {dim}")
        want = None if dim_of is None else dim_of(entry["version"])
        if dim_of is not None and want is None:
            raise ValueError(f"a version-{entry['version']} entry needs the bundle's phone model, "
                             "which this bundle lacks")
        if want is not None and dim != want:
            raise ValueError(f"dim {dim} for a version-{entry['version']} entry of this backbone (expected {want})")
    except (KeyError, ValueError, TypeError) as e:
        raise EdgelearnError(f"a keyword's verifier entry is unreadable ({e})",
                             fix="re-enrol the keyword (--replace)") from None
    return np.split(flat.reshape(-1, dim), np.cumsum(steps)[:-1])
