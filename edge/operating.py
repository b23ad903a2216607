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

    def thresholds(self, fa_h: float) -> dict:
        ok = [p for p in self.points if p["target_fa_h"] <= fa_h]
        if not ok:
            raise EdgelearnError(f"no operating point at or under {fa_h} false accepts per hour",
                                 fix=f"ask for one of {[p['target_fa_h'] for p in self.points]}")
        return dict(ok[-1]["thresholds"])


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


def load_points(state_dir, calibrated_for: dict) -> OperatingPoints:
    """The state's calibration, if it was made for this model and adapted context."""
    import json
    from pathlib import Path

    path = Path(state_dir) / POINTS_FILE
    if not path.is_file():
        raise EdgelearnError(f"{path} does not exist: this device has no calibrated operating points",
                             fix="run `edgelearn device calibrate --state ST --wav everyday.wav` first, "
                                 "or pass --threshold")
    try:
        if path.stat().st_size > MAX_POINTS_BYTES:
            raise ValueError("too large")
        table = json.loads(path.read_bytes())
        points = OperatingPoints(table)
        for p in points.points:
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
                       for v in p["thresholds"].values()):
                raise TypeError("a threshold is not a number")
    except (ValueError, TypeError, KeyError, AttributeError, EdgelearnError, RecursionError):
        raise EdgelearnError(f"{path} is damaged", fix="run `edgelearn device calibrate` again") from None
    if table.get("for") != calibrated_for:
        raise EdgelearnError(f"{path} was calibrated for {table.get('for')}, not for {calibrated_for}",
                             fix="run `edgelearn device calibrate` again after changing the model or context")
    return points
