"""Operating points: per-keyword thresholds chosen by false accepts per hour on negative speech.

A fixed threshold means different things for different keywords: on real speech the
shipped model's "yes" fires inside "yesterday" at 0.7 while "stop" never comes near it.
``calibrate`` replays the Detector's trigger (``edge.detect.count_events``) on the
window scores of streams that do not say the keywords, and gives each keyword the lowest
threshold on ``GRID`` whose false accepts stay within its share of the target rate
(the target split evenly over the keywords, so the detector as a whole stays at or under
``target_fa_h``). A keyword that fires even at the top of the grid gets the top.

``matched`` instead keeps a reference's rate word by word (a new model version's thresholds
from the old one's events on the same audio).

``sensitivity`` names a row of such a table: ``OperatingPoints.thresholds(fa_h)`` picks the
point calibrated to the largest rate at or under the one asked for.

    >>> scores, ends, hours = stream_scores(det, pcm)          # one negative stream
    >>> table = calibrate([(scores, ends, None)], hours, target_fa_h=0.5, names=det.names)
    >>> table["thresholds"]["yes"]
    0.86
"""

from __future__ import annotations

import numpy as np

from edge import features as F
from edge.detect import count_events
from edge.errors import EdgelearnError

GRID = tuple(round(0.2 + 0.01 * i, 2) for i in range(80))  # 0.20 .. 0.99
TARGETS = (0.1, 0.5, 1.0, 2.0, 5.0)   # false accepts per hour a sensitivity can ask for
# The least audio `device calibrate` takes: under half a minute one false accept already counts over
# 120 per hour, 24 times the most a sensitivity asks for (TARGETS), so every keyword's threshold would
# land where chance puts it (1.5 s of silence gave every keyword the grid's floor). Under an hour the
# command warns instead (docs/edge-runtime.md, "Operating points").
MIN_SECONDS = 30.0


def check_targets(targets) -> list[float]:
    """Target rates (false accepts per hour), sorted and distinct: finite numbers above 0, or one
    EdgelearnError (a NaN or inf target used to be written and then asked for)."""
    try:
        out = sorted({float(t) for t in targets})
    except (TypeError, ValueError):
        raise EdgelearnError(f"targets {targets!r} are not numbers", fix="pass e.g. 0.5,1,2") from None
    if not out or not all(np.isfinite(t) and t > 0 for t in out):
        raise EdgelearnError(f"--targets {','.join(f'{t:g}' for t in out) or '(none)'} is not a list of finite "
                             "rates above 0 false accepts per hour", fix="pass e.g. 0.5,1,2")
    return out


def check_length(hours: float) -> None:
    """Refuse audio far too short to estimate a false-accept rate on (``MIN_SECONDS``)."""
    if not hours * 3600 >= MIN_SECONDS:
        raise EdgelearnError(f"{hours * 3600:.1f} s of audio is far too little to measure false accepts per hour "
                             f"on (at least {MIN_SECONDS:.0f} s; an hour pins a rate), so the calibration was "
                             "not changed", fix="give minutes (ideally an hour or more) of the place's everyday "
                                                "speech that never says the keywords")


# `device calibrate` refuses audio that holds no speech-like sound at all: a minute of digital
# silence or a test tone used to be calibrated on and saved over a good calibration. The rule is
# deliberately simple and lenient: a 32 ms frame counts as sound that could be speech when it is above
# digital silence (RMS of SOUND_FLOOR LSB, about -78 dBFS: zeros and 1-LSB dither stay under it, any
# microphone's room noise is above it) and its spectrum changed from the frame before (relative
# spectral flux at least SOUND_FLUX: speech, a TV, a room's noise change from frame to frame, 0.6-0.8;
# a steady tone, square wave, hum or DC stays the same, under 0.35 for square waves up to 5 kHz at
# full scale). Audio with under MIN_SOUND_S of such frames in all holds nothing a keyword could be
# confused with, so no false-accept rate can be measured on it.
SOUND_FRAME, SOUND_FLOOR, SOUND_FLUX, MIN_SOUND_S = 512, 4.0, 0.5, 1.0


class SoundMeter:
    """Seconds of sound that could be speech (the rule above) in audio pushed chunk by chunk; the
    chunks of a long file pass through ``tee`` (so a caller can measure what it streams anyway)."""

    def __init__(self):
        self.rest = np.zeros(0, np.float64)  # samples short of a whole frame, carried to the next chunk
        self.prev = None                     # the last frame's magnitude spectrum
        self.frames = 0                      # frames that count
        self.samples = 0
        self.window = np.hanning(SOUND_FRAME)

    def push(self, chunk) -> None:
        x = np.concatenate([self.rest, np.asarray(chunk, np.float64)])
        self.samples += len(chunk)
        n = len(x) // SOUND_FRAME
        self.rest = x[n * SOUND_FRAME:]
        if n == 0:
            return
        fr = x[:n * SOUND_FRAME].reshape(n, SOUND_FRAME)
        loud = np.sqrt((fr ** 2).mean(axis=1)) >= SOUND_FLOOR
        spec = np.abs(np.fft.rfft(fr * self.window, axis=1))
        before = np.concatenate([spec[:1] if self.prev is None else self.prev[None], spec[:-1]])
        flux = np.linalg.norm(spec - before, axis=1) / np.maximum(np.linalg.norm(spec, axis=1), 1e-9)
        self.frames += int(np.count_nonzero(loud & (flux >= SOUND_FLUX)))
        self.prev = spec[-1]

    def tee(self, chunks):
        for c in chunks:
            self.push(c)
            yield c

    @property
    def seconds(self) -> float:
        return self.frames * SOUND_FRAME / F.SAMPLE_RATE

    def check(self, what: str = "the audio") -> None:
        """One EdgelearnError when the audio held no sound that could be speech (``MIN_SOUND_S``)."""
        if self.seconds < MIN_SOUND_S:
            raise EdgelearnError(f"{what} holds no speech-like sound at all (digital silence, or a steady tone "
                                 "or hum), so no false-accept rate can be measured on it and the calibration "
                                 "was not changed", fix="record the place's everyday audio (TV, conversation) "
                                                        "with the microphone the device listens with")


def stream_scores(det, audio, batch: int = 256, embeddings: bool = False):
    """Every window's first-stage scores and (end, keyword-end) times, as ``det`` would see them.

    ``audio``: int16 PCM, or an iterable of int16 chunks (a long file read piece by piece: one
    chunk's frames are held, never the file's). The same frames (``MfccStream``), windows (every
    ``det.stride`` hops once 49 frames are in) and scores (``det.scores``) as ``Detector.push``,
    batched; returns ((T, K) scores, (T, 2) ends, hours of audio), and with ``embeddings`` also the
    (T, D) embeddings the scores came from."""
    chunks = [audio] if isinstance(audio, np.ndarray) else audio
    mfcc, buf = F.MfccStream(), np.zeros((0, F.N_MFCC), np.float32)
    base, nxt = 0, F.N_FRAMES  # absolute index of buf[0]; frame count at which the next window ends
    rows, ends, samples, embs = [], [], 0, []
    for chunk in chunks:
        samples += len(chunk)
        buf = np.concatenate([buf, mfcc.push(np.asarray(chunk))])
        idx = np.arange(nxt, base + len(buf) + 1, det.stride)
        for s in range(0, len(idx), batch):
            wins = np.stack([buf[i - F.N_FRAMES - base:i - base] for i in idx[s:s + batch]])
            sc, emb = det.scores(F.normalize(wins, det.km.scale))
            rows.append(sc)
            if embeddings:
                embs.append(np.asarray(emb, np.float32))
            for i, w in zip(idx[s:s + batch], wins):
                end = ((i - 1) * F.HOP_LENGTH + F.FRAME_LENGTH) / F.SAMPLE_RATE
                ends.append((end, det._keyword_end(w, end)))
        if len(idx):
            nxt = int(idx[-1]) + det.stride
        drop = max(0, nxt - F.N_FRAMES - base)  # frames no later window needs
        buf, base = buf[drop:], base + drop
    scores = np.concatenate(rows) if rows else np.zeros((0, len(det.names)), np.float32)
    out = scores, np.asarray(ends, np.float64).reshape(-1, 2), samples / F.SAMPLE_RATE / 3600
    if embeddings:
        dim = int(embs[0].shape[1]) if embs else 0
        return out + (np.concatenate(embs) if embs else np.zeros((0, dim), np.float32),)
    return out


def calibrate(streams, hours: float, target_fa_h: float, names, grid=GRID, smooth: int = 2,
              peak_hops: int = 5, refractory_s: float = 1.0) -> dict:
    """Per-keyword thresholds for ``target_fa_h`` false accepts per hour on these negative streams.

    ``streams``: [(scores (T, K), ends (T, 2), exclude)], ``exclude(k, time_s) -> bool`` or None:
    events that do not count (the stream says keyword k there); ``hours``: their total length."""
    if hours <= 0:
        raise EdgelearnError("calibration needs negative speech", fix="pass at least a few minutes of audio")
    share = target_fa_h / len(names)
    out, rates = {}, {}
    for k, name in enumerate(names):
        chosen, rate = grid[-1], None
        for thr in grid:
            n = 0
            for scores, ends, exclude in streams:
                times = []
                count_events(scores[:, k], thr, ends, smooth=smooth, peak_hops=peak_hops,
                             refractory_s=refractory_s, times=times)
                n += sum(1 for t in times if exclude is None or not exclude(k, t))
            if n / hours <= share:
                chosen, rate = thr, n / hours
                break
        out[name], rates[name] = chosen, rate
    return {"target_fa_h": target_fa_h, "hours": hours, "thresholds": out, "fa_h": rates}


def held_at_default(point: dict, det) -> dict:
    """A calibrated point no more permissive than the detector's default thresholds (the bundle's own
    operating point) where the audio cannot show its target: when a single false accept would already
    exceed a keyword's share of the target rate, no event at all is all the audio can say, and the
    lowest threshold on the grid passes that on half a minute of a quiet room (the strictest
    sensitivity then fired the most). Those keywords keep the default (``held_at_default``)."""
    share = point["target_fa_h"] / len(det.names)
    if point["hours"] * share >= 1:
        return point
    default = {n: round(float(t), 4) for n, t in zip(det.names, det.thresholds)}
    held = sorted(n for n, t in point["thresholds"].items() if t < default[n])
    for n in held:
        point["thresholds"][n] = default[n]
    if held:
        point["held_at_default"] = held
    return point


def matched(scores, ends, reference, names, grid=GRID, smooth: int = 2) -> dict:
    """Per keyword, the lowest threshold on ``grid`` at which it fires on this negative stream no
    more often than ``reference`` says (its event count, e.g. another model's at 0.7 on the same
    audio): a new model version keeps the old one's false-accept rate word by word.
    ``scores``/``ends``: ``stream_scores``' (T, K) and (T, 2); ``reference``: K counts."""
    return {name: next((t for t in grid if count_events(scores[:, k], t, ends, smooth=smooth) <= reference[k]),
                       grid[-1]) for k, name in enumerate(names)}


class OperatingPoints:
    """A table of calibrated points ({"points": [calibrate(...) ...]}) -> thresholds for a rate."""

    def __init__(self, table: dict):
        pts = table.get("points") if isinstance(table, dict) else None
        if not isinstance(pts, list) or not pts:
            raise EdgelearnError("operating-point table has no points", fix="recalibrate")
        if not all(isinstance(p, dict) and isinstance(p.get("target_fa_h"), (int, float))
                   and not isinstance(p["target_fa_h"], bool) and np.isfinite(p["target_fa_h"])
                   and p["target_fa_h"] > 0 for p in pts):
            raise EdgelearnError("operating-point table has a target that is not a rate above 0", fix="recalibrate")
        self.points = sorted(pts, key=lambda p: p["target_fa_h"])

    def point(self, fa_h: float) -> dict:
        """The point calibrated to the largest rate at or under ``fa_h``."""
        ok = [p for p in self.points if p["target_fa_h"] <= fa_h]
        if not ok:
            raise EdgelearnError(f"no operating point at or under {fa_h} false accepts per hour",
                                 fix=f"ask for one of {[p['target_fa_h'] for p in self.points]}")
        return ok[-1]

    def thresholds(self, fa_h: float) -> dict:
        return dict(self.point(fa_h)["thresholds"])


POINTS_FILE = "operating.json"
MAX_POINTS_BYTES = 1 << 20  # a table for a few dozen keywords is a few KB


def save_points(state_dir, table: dict) -> None:
    """The device's calibration (``edgelearn device calibrate``), written atomically, 0600, under the
    state lock (one calibration replaces another whole)."""
    import json
    from pathlib import Path

    from edge.atomic import atomic_write, state_lock

    OperatingPoints(table)  # refuse to write a table that could not be read back
    data = json.dumps(table, indent=1, allow_nan=False).encode()
    with state_lock(state_dir):
        atomic_write(Path(state_dir) / POINTS_FILE, data)


class StaleCalibration(EdgelearnError):
    """The state's calibration was made for another model version or adapted context than detection
    runs now (an adaptation committed, a federated version installed since): the agent detects at
    the model's own thresholds until it matches again; ``device detect --sensitivity`` refuses it."""


def _unit(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1


def _read_points(path) -> tuple[dict, OperatingPoints]:
    """(table, points) of an existing operating.json, or one EdgelearnError: it is damaged."""
    import json

    try:
        if path.stat().st_size > MAX_POINTS_BYTES:
            raise ValueError("too large")
        table = json.loads(path.read_bytes())
        points = OperatingPoints(table)
        for p in points.points:
            phrase = p.get("phrase", {"first_stage": {}, "cutoffs": {}})  # both stages', since session 44
            if not all(_unit(v) for v in [*p["thresholds"].values(), *phrase["first_stage"].values(),
                                          *phrase["cutoffs"].values()]):
                raise TypeError("a threshold is not a number")
    except (ValueError, TypeError, KeyError, AttributeError, EdgelearnError, RecursionError, UnicodeDecodeError):
        raise EdgelearnError(f"{path} is damaged", fix="run `edgelearn device calibrate` again") from None
    return table, points


def load_points(state_dir, calibrated_for: dict) -> OperatingPoints:
    """The state's calibration, if it was made for this model and adapted context (else
    ``StaleCalibration``; missing or damaged: EdgelearnError)."""
    from pathlib import Path

    path = Path(state_dir) / POINTS_FILE
    if not path.is_file():
        raise EdgelearnError(f"{path} does not exist: this device has no calibrated operating points",
                             fix="run `edgelearn device calibrate --state ST --wav everyday.wav` first, "
                                 "or pass --threshold")
    table, points = _read_points(path)
    if table.get("for") != calibrated_for:
        raise StaleCalibration(f"{path} was calibrated for {table.get('for')}, not for {calibrated_for}",
                               fix="run `edgelearn device calibrate` again after changing the model or context")
    return points


def calibration_status(state_dir, bundle) -> dict | None:
    """What ``device status`` shows of the state's calibration (reads only; never raises for a bad
    state file): None when there is none; {"damaged", "fix"} when operating.json cannot be read
    (detection with a sensitivity would refuse it); else its targets, hours and ``current``: made for
    the model version and adapted context detection runs now with ``bundle`` (False: "stale" and
    "fix" say why; ``device detect --sensitivity`` refuses it and the agent detects at the model's
    default thresholds until `device calibrate` runs again; None: the adapt pointer is unreadable)."""
    from pathlib import Path

    from edge.device_models import calibrated_for

    path = Path(state_dir) / POINTS_FILE
    try:
        if not path.is_file():
            return None
        table, points = _read_points(path)
    except OSError as e:  # unreadable (permissions): as good as damaged for detection
        return {"damaged": f"{path} cannot be read ({e.strerror or e})", "fix": "check its permissions"}
    except EdgelearnError as e:
        return {"damaged": e.problem, "fix": e.fix}
    try:
        now = calibrated_for(bundle, state_dir)
    except EdgelearnError:  # a damaged adapt pointer: status reports it where it shows the contexts
        now = None
    out = {"targets": [p["target_fa_h"] for p in points.points], "hours": table.get("hours"),
           "for": table.get("for"), "current": None if now is None else table.get("for") == now,
           "phrase_stage": all("phrase" in p for p in points.points)}  # both stages calibrated (session 44)
    if out["current"] is False:
        out["stale"] = f"calibrated for {table.get('for')}, and detection runs {now}"
        out["fix"] = "run `edgelearn device calibrate` again to use a sensitivity with this model and context"
    return out
