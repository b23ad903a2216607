"""The enrolled custom keywords: the state file that keeps them and the scorer detection runs.

``DeviceState`` reads and writes one state directory's keywords; ``CustomKeywords`` scores them
from embeddings, sigmoid(w . e/|e| + b), and runs their second stage (``edge.verify``) when the
first fires. ``edge.keywords_check`` holds the entries' rules: ``check_keywords`` checks the file
entry by entry, as detection, enrolment and status read it; ``at_sensitivity`` gives an entry the
thresholds of its chosen sensitivity (``SENSITIVITIES``); both are importable from here too.
Learning a keyword from clips is ``edge.enroll``, which writes what this module reads.

State under ``--state DIR`` (one JSON file, written with ``atomic_write``)::

    keywords.json  {"format": 2, "model_id", "model_version",
                    "keywords": [{"name", "prototype", "w", "b", "threshold", "clips", ...,
                                  "verify": {"version", "threshold", "levels", "steps", "templates", ...}}]}

Saving is a merge under the state lock (``edge.atomic.state_lock``): the file is read again and
only the keywords this process changed since it read it are written over it, so two commands on one
state (two enrolments, an enrolment and a calibration) both keep their work (``DeviceState.save``).

Format 1 (before the verifier) is still read; its keywords run the first stage only
until they are enrolled again. Saving writes format 2.

A damaged file (truncated, garbage, empty: bytes that are not JSON, ``DamagedKeywords``) is rebuilt by
the first command that opens the state (``DeviceState.open``; detect, status, run, wyoming, enroll):
under the state lock its bytes are kept as ``keywords.json.damaged`` and every keyword is enrolled
again from the clips the device kept (``edge.keywords_rebuild``), with one warning
line on stderr naming what was rebuilt, what was lost and what needs setting again. A second command
waits on the lock and reads the rebuilt file. Nothing is rebuilt when no clips were kept (the
sentence says to restore the file) or when the state says it runs another model version (the
adapt pointer, the agent's installed version, what is left of the file).

A state directory belongs to one bundle model and version; another bundle is
refused with a clear message, since embeddings of another encoder mean nothing.

    >>> state = DeviceState.open("state", bundle)
    >>> state.custom().scores(embeddings)   # (N, K) in [0, 1]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError
from edge.atomic import atomic_write, state_lock
from edge.custom_voices import lower_at, lowered
# the entries' rules and their check got a module of their own: every name stays importable from here
from edge.keywords_check import (  # noqa: F401 (DEFAULT_SENSITIVITY, FAR_TARGET, NAME_RULE, SENSITIVITIES, _NAME)
    _NAME, DEFAULT_SENSITIVITY, FAR_TARGET, NAME_RULE, SENSITIVITIES, at_sensitivity, check_keywords)
from edge.keywords_merge import merge, snapshot

FORMAT = 2
READABLE_FORMATS = (1, 2)
SHOWN_CHARS = 40  # of a name echoed in a message (it may be any length the user typed)


def shown(name) -> str:
    """``name`` quoted for a message, cut to ``SHOWN_CHARS`` characters with "…"."""
    s = str(name)
    return repr(s) if len(s) <= SHOWN_CHARS else repr(s[:SHOWN_CHARS]) + "…"


class StateError(EdgelearnError):
    """The device state directory is unusable (another bundle, corrupt)."""


class DamagedKeywords(StateError):
    """keywords.json is there, but its bytes are not JSON (truncated, garbage, empty) or the disk
    would not read them; ``detail`` says why. ``DeviceState.open`` rebuilds it."""

    def __init__(self, problem: str, detail: str, fix: str | None = None):
        super().__init__(problem, fix=fix)
        self.detail = detail


def _logit(p: float) -> float:
    p = min(max(float(p), 1e-6), 1 - 1e-6)
    return float(np.log(p / (1 - p)))


class CustomKeywords:
    """Scores of enrolled keywords from embeddings: sigmoid(w . e/|e| + b), and their second stage.

    ``bundle``: needed for the second stage (``edge.verify``) of keywords that carry one; without
    it (or with ``verify=False``) only the first stage runs. ``root``: the state directory, where the
    phrase models of keywords taught other voices lie (``edge.custom_voices``); without it (or
    with ``verify=False``) they are not loaded and such a keyword runs its own two stages alone.
    ``first_thresholds``: where each keyword's candidate opens (its threshold, lowered for a
    keyword with voices); ``thresholds``: where its own two stages start."""

    def __init__(self, entries: list[dict], bundle=None, verify: bool = True, root=None):
        levels = [e.get("sensitivity", DEFAULT_SENSITIVITY) for e in entries]
        entries = [at_sensitivity(e) for e in entries]
        self.names = [e["name"] for e in entries]
        self.thresholds = np.array([e["threshold"] for e in entries], np.float32)
        self.voices = [None] * len(entries)
        if verify and root is not None and any("voices" in e for e in entries):
            from edge.custom_voices import Voices

            self.voices = [Voices(e["voices"], root, e["name"], lv) if "voices" in e else None
                           for e, lv in zip(entries, levels)]
        self.first_thresholds = np.array([t if v is None else lowered(t, lower_at(v.lower, lv))
                                          for t, v, lv in zip(self.thresholds, self.voices, levels)], np.float32)
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

    # How far np.interp's result may stray outside the two level thresholds it blends: it computes a
    # convex combination in float64, a few units in the last place (~1e-16 here), far under this.
    _INTERP_SLACK = 1e-9

    def _passes(self, k: int, d: float, feats: np.ndarray) -> bool:
        """``d <= threshold_at(levels, feats, version)`` for keyword ``k``. The threshold interpolated
        at the window's noise range lies between the entry's lowest and highest level thresholds, so a
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
        return d <= float(self._threshold_at(levels, feats, self.verify_versions[k]))

    enrolled = True  # scores embeddings of the encoder the keywords were enrolled on (``Detector.scores``)

    def scores(self, emb: np.ndarray, adapted=None) -> np.ndarray:
        """(N, 64) embeddings of the encoder the keywords were enrolled on -> (N, K) first-stage
        scores (``adapted``, an adapted tail's own embedding, is not theirs: unused)."""
        e = np.asarray(emb, np.float32)
        # np.linalg.norm(e, axis=1) as it computes it, without its checks (one window every 80 ms)
        e = e / np.maximum(np.sqrt(np.add.reduce(e * e, axis=1, keepdims=True)), 1e-12)
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
        # what the file held when this process read it ({name: entry as JSON}, and its model); None:
        # a state made in memory (a scratch state, a detector's selection), saved whole
        self._base, self._base_model = None, None

    @classmethod
    def open(cls, root, bundle, backend: str = "auto") -> "DeviceState":
        """The state's keywords for ``bundle``; a damaged file is rebuilt from the kept clips
        (``edge.keywords_rebuild``; ``backend``: the interpreter the rebuild enrols with)."""
        root = Path(root)
        path = root / "keywords.json"
        if root.exists() and not root.is_dir():
            raise StateError(f"state path {root} is a file, not a directory", fix="pass a directory to --state")
        try:
            mid, ver, kws = _read(path, bundle)
        except DamagedKeywords as e:
            from edge.keywords_rebuild import rebuilt

            mid, ver, kws = rebuilt(root, bundle, e, backend)
        if (mid, ver) != (bundle.model_id, bundle.version):
            raise StateError(f"state directory {root} belongs to bundle {mid} v{ver} (says {path}), not "
                             f"{bundle.model_id} v{bundle.version}; its keywords were learned with "
                             "another encoder", fix="use the matching bundle, another --state "
                             "directory, or re-enrol the keywords for this bundle")
        state = cls(root, mid, ver, kws, bundle)
        state._base, state._base_model = snapshot(kws), (mid, ver)
        return state

    def rebound(self, bundle, keywords: list[dict]) -> "DeviceState":
        """``keywords`` bound to ``bundle`` (carrying the state to a new version): its ``save`` writes
        only over the file this state was read from (``StateError`` if a command changed it since)."""
        new = DeviceState(self.root, bundle.model_id, bundle.version, keywords, bundle)
        new._base, new._base_model = self._base, self._base_model
        return new

    def save(self, prefer: str = "raise", before_write=None) -> None:
        """Write the keywords (atomically), merged under the state lock with what the file holds now:
        keywords this process did not change are the file's (another command may have enrolled,
        replaced, removed or calibrated them meanwhile), those it changed are its own. A keyword both
        changed (e.g. enrolled by two commands at once) is ``prefer``'s: ``"ours"`` (an enrolment with
        --replace), ``"theirs"`` (a calibration's measurements of an entry enrolled again meanwhile),
        ``"raise"``: an EdgelearnError, nothing written. ``before_write()`` runs under the lock after
        the merge and before the file is written (the enrolment's kept clips)."""
        with state_lock(self.root):
            if self._base is not None:
                self.keywords = self._merged(prefer)
            if before_write is not None:
                before_write()
            self._write()

    def _write(self) -> None:
        """The file, atomically (the state lock held), and beside the kept clips what only it holds
        (``edge.keywords_rebuild.write_settings``: sensitivities, measured rates)."""
        from edge.keywords_rebuild import write_settings

        data = {"format": FORMAT, "model_id": self.model_id, "model_version": self.version,
                "keywords": self.keywords}
        atomic_write(self.path, json.dumps(data, indent=1).encode())
        self._base, self._base_model = snapshot(self.keywords), (self.model_id, self.version)
        write_settings(self.root, self.keywords)

    def _merged(self, prefer: str) -> list[dict]:
        mid, ver, kws = _read(self.path, self.bundle, self._base_model)
        base = self._base
        rebound = (self.model_id, self.version) != self._base_model
        if (mid, ver) != self._base_model or (rebound and snapshot(kws) != base):
            raise StateError(f"{self.path} was changed by another command while this one ran (it is bound "
                             f"to {mid} v{ver})", fix="run the command again")
        if rebound:  # carried to another version: written whole over the file it was read from
            return self.keywords
        return merge(self.keywords, kws, base, prefer)

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
            return CustomKeywords(self.keywords, self.bundle, verify, root=self.root)
        except EdgelearnError as e:  # a verifier entry this bundle cannot read
            raise StateError(f"{self.path}: {e.problem}", fix=e.fix) from None


def _read(path: Path, bundle, model=None) -> tuple:
    """(model_id, version, checked keywords) of keywords.json (a missing file: ``model`` or the
    bundle's, none), or StateError naming the file: ``DamagedKeywords`` when its bytes are not JSON
    (truncated, garbage, empty) or the disk will not read them. A file that parses but holds a wrong
    field (a hand edit) is a plain StateError saying which, as before: it is never rebuilt over."""
    import errno

    if not path.exists():
        return (*(model or (bundle.model_id, bundle.version)), [])
    fix = "restore it from a backup or delete it and enrol again"
    try:
        data = json.loads(path.read_bytes())
    except OSError as e:  # a disk that will not read the file is damage; a permission is not
        if e.errno != errno.EIO:
            raise StateError(f"{path} is unreadable ({e.strerror or e})", fix=fix) from None
        raise DamagedKeywords(f"{path} is unreadable ({e.strerror or e})", e.strerror or str(e), fix=fix) from None
    except ValueError as e:  # JSON and UTF-8 errors are ValueErrors
        raise DamagedKeywords(f"{path} is unreadable ({e})", str(e), fix=fix) from None
    try:
        if not isinstance(data, dict):
            raise ValueError(f"it holds {type(data).__name__}, not an object")
        if data.get("format") not in READABLE_FORMATS:
            raise ValueError(f"format {data.get('format')!r}, this runtime reads {READABLE_FORMATS}")
        mid, ver = data.get("model_id"), data.get("model_version")
        if not isinstance(mid, str) or isinstance(ver, bool) or not isinstance(ver, int):
            raise ValueError(f"model {mid!r} v{ver!r} is not a model id and version")
        return mid, ver, check_keywords(data.get("keywords"))
    except ValueError as e:
        raise StateError(f"{path} is unreadable ({e})", fix=fix) from None
