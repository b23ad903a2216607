"""A second stage for adapted base commands: the time-order verifier, built from the adaptation clips.

The speaker recipe (``edge.adapt.recipe``) makes the tail name the user's commands (first stage),
but the tail scores a mean over time: on everyday speech it still fires on "going", "know",
"yesterday". Custom keywords already have the answer (``edge.verify``: the clips' int8 backbone
steps as templates, subsequence DTW, thresholds from the clips alone per noise level); here the
same entries are built for every command that ``device adapt`` got clips of, and committed with the
adapted version (``adapt/<context>/verify.json``, with a digest of the delta it belongs to).

``VerifiedCommands`` gives the Detector's custom-keyword interface (``names``, ``thresholds``,
``scores(emb)``, ``verifies``, ``searches``, ``verify``), so an unchanged ``edge.detect.Detector``
runs the commands through both stages: ``Detector(tail_model, keywords=[], custom=vc)``. Its
scores are the adapted tail's own posteriors (the classifier applied to the tail's embedding,
exactly what ``TailModel.infer`` gives), and enrolled custom keywords ride along (``custom=``).

    >>> entries = command_entries(bundle, km, windows, y)              # at adapt time
    >>> vc = load_verified(state_dir, bundle, custom=state.custom())     # at detect time, or None
    >>> det = Detector(TailModel(bundle, delta), keywords=[], custom=vc)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError

FORMAT = 1
MAX_BYTES = 4 << 20  # ten commands' entries are ~100 KB
NEGATIVE_LABELS = ("_unknown_", "_silence_")


def delta_digest(delta: dict) -> str:
    """A digest of a tail delta (names, shapes, float32 bytes) that ties entries to their version."""
    h = hashlib.sha256()
    for k in sorted(delta):
        a = np.ascontiguousarray(np.asarray(delta[k], np.float32))
        h.update(k.encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()[:32]


def command_entries(bundle, km, windows, y, seed: int = 0, max_clips: int = 10) -> dict:
    """{label: verifier entry (``edge.verify.pack``)} for every word label with 2 or more clips
    among ``windows`` (1 s int16, label ids ``y``); at most ``max_clips`` clips each (the first)."""
    from edge import verify as V
    from edge.enroll import prepare_clip

    labels = list(km.labels)
    ver = V.Verifier(bundle, version=V.version_for(bundle, commands=True))
    rng = np.random.default_rng(seed)
    out = {}
    y = np.asarray(y)
    for k in sorted(set(int(v) for v in y)):
        name = labels[k]
        if name in NEGATIVE_LABELS:
            continue
        idx = np.nonzero(y == k)[0][:max_clips]
        if len(idx) < 2:
            continue
        try:
            win = np.stack([prepare_clip(np.asarray(windows[i]), f"{name} clip {j + 1}") for j, i in enumerate(idx)])
        except EdgelearnError:
            continue  # a silent or too-short clip: this command keeps the first stage only
        tpl = ver.templates(win, km.scale)
        levels, dist, _ = ver.calibrate(win, tpl, km.scale, rng)
        out[name] = V.pack(tpl, ver.qparams, levels, dist, ver.version)
    return out


def entries_file(context: str) -> str:
    """Where a context's entries live, relative to the state directory."""
    return f"adapt/{context}/verify.json"


def entries_bytes(entries: dict, delta: dict) -> bytes:
    return json.dumps({"format": FORMAT, "delta": delta_digest(delta), "commands": entries}).encode()


class VerifiedCommands:
    """Base commands scored by an adapted conv tail's classifier, each with its verifier entry; and,
    after them, the enrolled custom keywords of ``custom`` (a ``CustomKeywords``) unchanged."""

    def __init__(self, bundle, tail, entries: dict, threshold=0.7, keywords=None, custom=None):
        from edge import verify as V

        labels = list(bundle.labels)
        wanted = list(entries) if keywords is None else [k for k in keywords if k in entries]
        bad = [k for k in wanted if k not in labels]
        if bad:
            raise EdgelearnError(f"verified commands {bad} are not labels of this bundle",
                                 fix="adapt again for this bundle")
        self.tail, self.custom = tail, custom
        self.idx = np.array([labels.index(k) for k in wanted], np.int64)
        self.verifier = V.Verifier(bundle)
        self.entries = [entries[k] for k in wanted]
        stale = [k for k, e in zip(wanted, self.entries) if tuple(e.get("qparams", ())) != tuple(self.verifier.qparams)]
        if stale:
            raise EdgelearnError(f"verifier entries of {stale} were built with another backbone", fix="adapt again")
        self.templates = [V.unpack(e, self.verifier.dim) for e in self.entries]
        self.levels = [V.levels_of(e) for e in self.entries]
        self.versions = [e.get("version", 1) for e in self.entries]
        self._threshold_at, self._searches = V.threshold_at, V.searches
        thr = np.array([threshold.get(k, 0.7) if isinstance(threshold, dict) else threshold for k in wanted],
                       np.float32)
        self.n_base = len(wanted)
        self.names = wanted + (list(custom.names) if custom is not None else [])
        self.thresholds = np.concatenate([thr, custom.thresholds]) if custom is not None else thr

    @property
    def enrolled(self) -> bool:
        """Custom keywords ride along (they score the embedding they were enrolled on)."""
        return self.custom is not None

    def scores(self, emb: np.ndarray, adapted=None) -> np.ndarray:
        """(N, 64) embeddings -> (N, K) scores: the tail's posteriors of the commands from the adapted
        tail's embedding ``adapted`` (``emb`` when None), then the custom keywords' from ``emb``, the
        embedding they were enrolled on (``TailModel.infer_enrolled``)."""
        e = np.asarray(emb if adapted is None else adapted, np.float32)
        logits = self.tail._linear(e.copy(), "cls", None, False)
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        s = p[:, self.idx]
        if self.custom is not None:
            s = np.concatenate([s, self.custom.scores(emb)], axis=1)
        return s

    def verifies(self, k: int) -> bool:
        return True if k < self.n_base else self.custom.verifies(k - self.n_base)

    def searches(self, k: int) -> bool:
        return self._searches(self.versions[k]) if k < self.n_base else self.custom.searches(k - self.n_base)

    def verify(self, k: int, feats: np.ndarray) -> tuple[bool, float]:
        if k >= self.n_base:
            return self.custom.verify(k - self.n_base, feats)
        feats = np.asarray(feats)
        v = self.versions[k]
        d = float(self.verifier.distance(self.verifier.sequences(feats[None], v), self.templates[k], version=v)[0])
        lv = self.levels[k]
        thr = self.entries[k]["threshold"] if lv is None else float(self._threshold_at(lv, feats, v))
        return d <= thr, d


def load_entries(state_dir, context: str, delta: dict) -> dict | None:
    """The context's verifier entries if they were built for exactly ``delta``; else None."""
    path = Path(state_dir) / entries_file(context)
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ValueError("too large")
        doc = json.loads(path.read_bytes())
        if doc.get("format") != FORMAT or not isinstance(doc.get("commands"), dict):
            raise ValueError("not a verifier file")
    except (OSError, ValueError, AttributeError, RecursionError):
        raise EdgelearnError(f"{path} is damaged", fix="run `edgelearn device adapt` again, or delete the file "
                                                        "(the commands then run the first stage only)") from None
    return doc["commands"] if doc.get("delta") == delta_digest(delta) else None


def load_verified(state_dir, bundle, threshold=0.7, keywords=None, custom=None) -> VerifiedCommands | None:
    """``VerifiedCommands`` for the state's active conv-tail context, when its current version was
    committed with verifier entries; None otherwise (the Detector then runs as before)."""
    from edge.adapt.conv import ConvTail, load_tail
    from edge.adapt.delta import CONV_TAIL, delta_kind
    from edge.adapt.store import AdaptStore

    store = AdaptStore(state_dir, bundle)
    context = store.meta.get("active")
    if context is None:
        return None
    delta = store.load(context)
    if not delta or delta_kind(delta) != CONV_TAIL:
        return None
    entries = load_entries(state_dir, context, delta)  # tied to the committed delta
    if not entries:
        return None
    tail = ConvTail(load_tail(bundle), store.load_carried(context)[0])  # as detection runs it
    return VerifiedCommands(bundle, tail, entries, threshold=threshold, keywords=keywords, custom=custom)
