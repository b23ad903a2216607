"""Streaming keyword detection: audio of any length in, detection events out.

The front end runs once per hop (``MfccStream``: 20 ms of new audio -> one
MFCC frame); every ``stride`` hops the int8 encoder runs on the last 49 frames
(1 s). Each invocation gives base-class posteriors and the embedding that the
enrolled custom keywords score (``edge.enroll.CustomKeywords``). Scores are
smoothed over the last ``smooth`` invocations; a keyword whose smoothed score
crosses its threshold opens a candidate, the candidate's peak (over at most
``peak_window_s``) becomes the event, then a refractory period silences every
keyword, so one utterance gives one event. A custom keyword with a second stage
(``edge.verify``) is checked on its peak window before it becomes an event; from
verifier version 6 on (``CustomKeywords.searches``) every window of the candidate is
checked as it arrives, and the first that passes is the event at once (the peak so
far: its score and keyword end), so a phrase whose first stage crosses only near its
end is reported then, not a peak window later (Wyoming's latency). A rejected
candidate gives no event and no refractory period (``rejected`` counts them;
``verified``, the windows checked), so the encoder's cost per hop is unchanged and
the verifier runs only when the first stage fires.

With ``asr`` (``edge.confirm.AsrConfirm`` or ``edge.phrase_stage.PhraseConfirm``, the Pi tier), a
base keyword's candidate is held until ``AFTER_S`` (or the stage's own ``after_s``) of audio past its
keyword end has arrived, then the stage judges that audio (from ``BEFORE_S``, or its ``before_s``,
before the keyword end) and the event stands only if it heard the command (``says``;
``edge.confirm``: the command alone; ``edge.phrase_stage``: the command's phrase model reaches its
cutoff); a rejected one, like a custom keyword's, gives no event and no refractory period. The
event keeps its ``time_s`` and comes up to ``after_s`` later. Where custom keywords are enrolled
too, a base event the stage passed comes out only a refractory period past its keyword end, and a
custom keyword crossing its threshold before then takes it over (``_custom_first``): the lowered
first stage would otherwise let a command the user's phrase starts like ("left" in "lights on")
win; where nothing is said for ``QUIET_S`` past the command it comes out then (no enrolled phrase
goes on from a command said alone). A rejected candidate frees the detector at once, as without
enrolled keywords.

Holding a candidate for its second stage's audio and judging it is the mixin
``edge.detect_held.HeldCandidates``. A custom keyword taught other voices (``edge.custom_voices``)
is also watched on its own beside the one candidate slot, its phrase models judging the candidates
its watch opens under its threshold, so that no other keyword's candidate hides it: the mixin
``edge.detect_voices.VoicesWatch``.

An event's ``time_s`` is the end of the keyword: in the peak window, the last
frame whose log energy (MFCC c0) is above the midpoint of the window's range.

    >>> det = Detector(KeywordModel(bundle), custom=DeviceState.open(state_dir, bundle).custom())  # edge.enroll
    >>> for chunk in chunks_of_pcm:
    ...     for ev in det.push(chunk):
    ...         print(ev)      # {"keyword": "yes", "time_s": 3.42, "score": 0.93}
"""

from __future__ import annotations

import numpy as np

from edge import features as F
from edge.audio import to_int16
from edge.confirm import AFTER_S, BEFORE_S
# the Detector's trigger replayed on precomputed scores (for scoring many operating points): its own
# module to keep this one about the streaming Detector; importable from here as before
from edge.detect_replay import count_events, trigger  # noqa: F401
from edge.errors import EdgelearnError
# candidates held for the audio their second stage judges: a mixin of the Detector, its own module
from edge.detect_held import QUIET_S, QUIET_SLACK_S, HeldCandidates  # noqa: F401 (QUIET_*: re-exported)
# each keyword taught other voices watched beside the slot: a mixin of the Detector, its own module
from edge.detect_voices import VoicesWatch

NON_KEYWORDS = ("_silence_", "_unknown_")
THRESHOLD = 0.7  # a base keyword's threshold when none is calibrated for it


def default_keywords(model) -> list[str]:
    """The base keywords a detector reports unless told: the bundle's 12-class command words, else
    every word label. ``model``: a keyword model (``.bundle``, ``.labels``) or a bundle."""
    manifest = getattr(model, "manifest", None) or getattr(getattr(model, "bundle", None), "manifest", None) or {}
    extra = manifest.get("extra", {}) or {}
    return [w for w in extra.get("labels12", list(model.labels)) if w not in NON_KEYWORDS]


def bundle_thresholds(manifest: dict) -> dict | None:
    """The per-keyword thresholds a bundle was published with (manifest ``extra.operating.thresholds``:
    the shipped model's operating point chosen by false accepts per hour on real development speech,
    host/recipe.py, or a federated version's matched to the version federation started from), or None.
    A malformed table is one EdgelearnError."""
    op = ((manifest or {}).get("extra") or {}).get("operating")
    if op is None:
        return None
    thr = op.get("thresholds") if isinstance(op, dict) else None
    labels = set(manifest.get("labels") or (manifest.get("extra") or {}).get("labels12") or ())
    if not isinstance(thr, dict) or not all(
            isinstance(k, str) and k in labels and isinstance(v, (int, float)) and not isinstance(v, bool)
            and 0 < v <= 1 for k, v in thr.items()):
        raise EdgelearnError(f"bundle version {manifest.get('version')}'s operating point (manifest extra.operating) "
                             "is malformed", fix="install another version, or pass --threshold")
    return {k: float(v) for k, v in thr.items()}


class Detector(HeldCandidates, VoicesWatch):
    def __init__(self, km, custom=None, keywords=None, stride: int = 4, smooth: int = 2,
                 threshold: float | dict | None = None, refractory_s: float = 1.0, peak_window_s: float = 0.4,
                 head=None, on_event=None, asr=None):
        """``km``: a KeywordModel; ``custom``: CustomKeywords or None; ``keywords``: base labels
        to report (default: the bundle's 12-class command words, else every word label);
        ``threshold``: one for every base keyword, or {keyword: threshold} (``edge.operating``), or
        None: the bundle's own operating point (``bundle_thresholds``), else ``THRESHOLD``;
        ``head``: an adapted embedding head (``edge.adapt.EmbeddingHead``) that replaces the bundle's base
        posteriors (an adapted conv tail comes as ``km``: ``edge.adapt.TailModel``);
        ``on_event(event, window)``: called with each event and the normalised (49, 10)
        window of its peak, e.g. to feed confirmed detections to the replay buffer; ``asr``: a
        recogniser that confirms base keywords (``says(word, pcm) -> bool``; ``edge.confirm``)."""
        if stride < 1 or smooth < 1:
            raise EdgelearnError(f"stride ({stride}) and smooth ({smooth}) must be >= 1")
        self.km, self.custom, self.head, self.on_event, self.asr = km, custom, head, on_event, asr
        labels = list(km.labels)
        if keywords is None:
            keywords = default_keywords(km)
        unknown = [w for w in keywords if w not in labels]
        if unknown:
            raise EdgelearnError(f"keywords {unknown} are not labels of this bundle",
                                 fix=f"choose from {[w for w in labels if w not in NON_KEYWORDS]}")
        self.base_idx = np.array([labels.index(w) for w in keywords], dtype=np.int64)
        self.names = list(keywords) + (list(custom.names) if custom is not None else [])
        if threshold is None:
            own = bundle_thresholds(getattr(getattr(km, "bundle", None), "manifest", None) or {}) or {}
            threshold = {w: own[w] for w in keywords if w in own} or THRESHOLD
        if isinstance(threshold, dict):  # per keyword (``edge.operating``); others keep THRESHOLD
            unknown = sorted(set(threshold) - set(keywords))
            if unknown:
                raise EdgelearnError(f"thresholds given for {unknown}, which this detector does not report",
                                     fix=f"name only keywords of {list(keywords)}")
            base_thr = np.array([threshold.get(w, THRESHOLD) for w in keywords], np.float32)
        else:
            base_thr = np.full(len(keywords), threshold, np.float32)
        # where a candidate opens; a custom keyword taught other voices (``edge.custom_voices``) opens
        # lower than its own two stages start (``_own``), in a watch of its own (``edge.detect_voices``)
        # whose candidates its phrase models judge on their audio; the slot sees it at ``_own``
        first = getattr(custom, "first_thresholds", None) if custom is not None else None
        self.thresholds = np.concatenate([base_thr, custom.thresholds if first is None else first]) \
            if custom is not None else base_thr
        self._own = np.concatenate([base_thr, custom.thresholds]) if custom is not None else base_thr
        self._voices = list(getattr(custom, "voices", None) or [None] * len(self.names[len(keywords):]))
        self._watched = np.array([False] * len(keywords) + [v is not None for v in self._voices], bool)
        self.stride, self.smooth = stride, smooth
        scale = getattr(km, "scale", None)   # the model's input scale (features.normalize), as an array once
        self._scale = None if scale is None else np.asarray(scale, np.float32)
        self.refractory = refractory_s
        self.peak_hops = max(1, int(round(peak_window_s * F.SAMPLE_RATE / F.HOP_LENGTH / stride)))
        # audio the second stage may need: its snippet (``before_s``/``after_s`` of its own, e.g.
        # edge.phrase_stage's, else edge.confirm's), the peak window's delay, and a margin
        self._before = float(getattr(asr, "before_s", BEFORE_S))
        self._after = float(getattr(asr, "after_s", AFTER_S))
        self._keeps_audio = asr is not None or any(v is not None for v in self._voices)
        longest = max([self._before + self._after] + [v.before_s + v.after_s for v in self._voices if v is not None])
        # a base candidate is judged as soon as its snippet is whole; with enrolled keywords beside the
        # base ones, one the stage passed is held (``_accepted``) until the time its refractory period
        # would silence has passed, so that an enrolled keyword crossing its threshold there takes it
        # over (``_custom_first``), or until nothing has been said for QUIET_S past it
        # (``_quiet_after``); one the stage rejects frees the detector at once
        self._wait = max(self._after, refractory_s if custom is not None and len(custom.thresholds) else 0.0)
        self._keep = int((longest + 0.5) * F.SAMPLE_RATE) + self.peak_hops * stride * F.HOP_LENGTH
        self.reset()

    def reset(self) -> None:
        self.stream = F.MfccStream()
        self.frames = np.zeros((2 * F.N_FRAMES, F.N_MFCC), np.float32)  # ring, doubled for a view
        self.n_frames = 0
        self.history = np.zeros((self.smooth, len(self.names)), np.float32)
        self.n_inv = 0
        self.quiet_until = -1.0
        self.candidate = None  # (score, k, time_s, invocations left)
        self._peak_window = None
        self.invocations = 0
        self.rejected = 0
        self.verified = 0      # windows the second stage ran on
        self.pending = None    # a base keyword's candidate waiting for the recogniser's audio
        self.judging = None    # the last candidate put to the recogniser (_confirm)
        self._accepted = False  # ...or, passed by it, for the enrolled keywords' chance (``_wait``)
        self.audio = np.zeros(0, np.int16)  # the last seconds of audio, with asr
        # the phrase models' front end and states over this stream's judged audio, shared by the
        # snippets of keywords taught other voices (edge.phrase_tape)
        self._tape = None
        if any(v is not None for v in self._voices):
            from edge.phrase_tape import Tape

            self._tape = Tape()
        self.samples = 0       # samples pushed since reset
        self._watch_reset()

    def _window(self) -> np.ndarray:
        i = self.n_frames % F.N_FRAMES
        return self.frames[i : i + F.N_FRAMES]

    def push(self, pcm) -> list[dict]:
        events = []
        self.samples += len(pcm)  # the clock a second stage's snippets are cut by (continue_from carries it)
        if self._keeps_audio:  # the recogniser's copy (int16, as the audio came); the front end gets pcm as is
            # (a block of rows: in order; float audio in [-1, 1], which the front end also takes, as int16)
            raw = to_int16(np.asarray(pcm).reshape(-1))
            self.audio = np.concatenate([self.audio, raw])[-(self._keep + len(raw)):]
        for fr in self.stream.push(pcm):
            i = self.n_frames % F.N_FRAMES
            self.frames[i] = fr
            self.frames[i + F.N_FRAMES] = fr
            self.n_frames += 1
            if self.n_frames >= F.N_FRAMES and (self.n_frames - F.N_FRAMES) % self.stride == 0:
                ev = self._step()
                if ev is not None:
                    events.append(ev)
            ev = None
            if self.pending is not None and not self._accepted and \
                    self.samples >= self._pending_end(self.pending[2], self.pending[1]):
                ev = self._confirm()
            if self._accepted and (self.samples >= int(round((self.pending[2] + self._wait) * F.SAMPLE_RATE))
                                   or self._quiet_after(self.pending[2])):
                ev = self._release()
            if ev is not None:
                events.append(ev)
            if self._watch:
                events += self._watch_due()
        return events

    def continue_from(self, old: "Detector") -> list[dict]:
        """Take over ``old``'s audio (the front end's stream, the last 49 frames, the clock and the
        refractory period) so detection goes on with this detector's model and keywords without
        dropping or repeating audio; ``old``'s open candidate is decided first, by ``old``, and
        returned as its events. Smoothing starts afresh (the scores of two models are not averaged).
        A base keyword's candidate held for the recogniser moves to this detector, which decides it
        when its audio has come, as ``old`` would have (deciding it now would cut its snippet short)."""
        ev = old._emit() if old.candidate is not None else None  # a base keyword's is held: old.pending
        events = [ev] if ev else []
        events += old._watch_due(final=True)   # old's watches decided on the audio there is
        if old._accepted:  # passed by old's stage, waiting only for old's enrolled keywords: out now
            events.append(old._release())
        held, old.pending = old.pending, None
        if held is not None and (self.asr is None or old.names[held[1]] not in self.names[:len(self.base_idx)]):
            old.pending, held = held, None  # nowhere to go: decided on the audio there is
            events += old.flush()
        self.stream, self.frames, self.n_frames = old.stream, old.frames, old.n_frames
        self.quiet_until = old.quiet_until
        self.samples = old.samples
        if self._keeps_audio and old._keeps_audio:
            self.audio = old.audio
        if self._tape is not None and old._tape is not None:
            self._tape = old._tape   # the same stream: its frames and the front end's state go on
        if held is not None:
            self.pending = (held[0], self.names.index(old.names[held[1]]), *held[2:])
        return events

    def flush(self) -> list[dict]:
        """End of stream: emit a candidate still waiting for its peak window to close."""
        ev = self._emit() if self.candidate is not None else None
        if self._accepted:
            ev = self._release()
        elif self.pending is not None:
            ev = self._confirm(final=True)
        return ([ev] if ev else []) + self._watch_due(final=True)

    def scores(self, feats: np.ndarray):
        """(N, 49, 10) normalised features -> (N, len(names)) scores and embeddings."""
        # an adapted tail: enrolled custom keywords score the embedding they were enrolled on
        both = getattr(self.km, "infer_enrolled", None) if getattr(self.custom, "enrolled", False) else None
        if both is not None:
            emb, probs, enrolled = both(feats)
        else:
            (emb, probs), enrolled = self.km.infer(feats), None
        if self.head is not None:
            probs = self.head.probs(emb)
        s = probs[:, self.base_idx]
        if self.custom is not None:
            cs = self.custom.scores(emb) if enrolled is None or enrolled is emb else \
                self.custom.scores(enrolled, adapted=emb)
            s = np.concatenate([s, cs], axis=1)
        return s, emb

    def _step(self):
        win = self._window()
        feats = F.normalize(win, self.km.scale if self._scale is None else self._scale)[None]
        cur = feats[0]
        s, _ = self.scores(feats)
        self.history[self.n_inv % self.smooth] = s[0]
        self.n_inv += 1
        self.invocations += 1
        n = min(self.n_inv, self.smooth)
        sm = self.history[:n].sum(axis=0)   # .mean(axis=0), as numpy computes it, without its checks
        sm /= n
        end_s = ((self.n_frames - 1) * F.HOP_LENGTH + F.FRAME_LENGTH) / F.SAMPLE_RATE
        slot = self._slot_thresholds()
        over = sm - slot
        k = int(np.argmax(over))
        if self._custom_first(over, end_s):
            k = len(self.base_idx) + int(np.argmax(over[len(self.base_idx):]))
            self.candidate = self.pending = None
            self._accepted = False
        out = None
        if self.candidate is not None:
            score, ck, t, left = self.candidate
            if sm[ck] > score:
                self.candidate = (float(sm[ck]), ck, self._keyword_end(win, end_s), left - 1)
                self._peak_window = cur
            else:
                self.candidate = (score, ck, t, left - 1)
            if self._passes_now(ck, cur):
                out = self._pass()
            elif self.candidate[3] <= 0 or sm[ck] < slot[ck]:
                out = self._emit()
        elif over[k] >= 0 and end_s >= self.quiet_until and self.pending is None:
            self.candidate = (float(sm[k]), k, self._keyword_end(win, end_s), self.peak_hops)
            self._peak_window = cur
            if self._passes_now(k, cur):
                out = self._pass()
        if self._watch:
            self._watch_step(sm, win, cur, end_s)
        return out

    def _searches(self, k: int) -> bool:
        """Is keyword ``k`` a custom keyword whose second stage tries every window (version 6 on)?"""
        nb = len(self.base_idx)
        return k >= nb and self.custom.verifies(k - nb) and self.custom.searches(k - nb)

    def _passes_now(self, k: int, win) -> bool:
        """A searching keyword's candidate window, checked as it arrives: does it pass? (A candidate
        under the keyword's own threshold, opened lower for its phrase models, is not checked.)"""
        return self._searches(k) and self.candidate[0] >= self._own[k] and self._verify(k - len(self.base_idx), win)

    def _pass(self):
        """The open candidate's event now (one of its windows passed the second stage)."""
        score, k, t, _ = self.candidate
        self.candidate = None
        return self._event(score, k, t, self._peak_window)

    def _emit(self):
        score, k, t, _ = self.candidate
        self.candidate = None
        nb = len(self.base_idx)
        # (a keyword taught other voices: its watch judges the audio its own stages reject)
        if self._searches(k):  # each window was checked as it came (``_passes_now``): none passed
            return self._reject()
        if k >= nb and self.custom.verifies(k - nb):
            if score < self._own[k] or not self._verify(k - nb, self._peak_window):
                return self._reject()
        elif k < nb and self.asr is not None:
            return self._hold(score, k, t)
        return self._event(score, k, t, self._peak_window)

    def _event(self, score, k, t, peak):
        if self._watch and self._watched_again(k, t):   # the slot's, of an utterance its watch passed
            return self._reject()
        self.quiet_until = t + self.refractory
        ev = {"keyword": self.names[k], "time_s": round(float(t), 3), "score": round(float(score), 4)}
        if self.on_event is not None:
            self.on_event(ev, peak)
        return ev

    def _verify(self, k: int, window) -> bool:
        """Custom keyword ``k``'s second stage on one window (``verified`` counts them)."""
        self.verified += 1
        return bool(self.custom.verify(k, window)[0])

    @staticmethod
    def _keyword_end(win: np.ndarray, end_s: float) -> float:
        c0 = win[:, 0]
        mid = 0.5 * (float(c0.max()) + float(c0.min()))
        last = int(np.nonzero(c0 >= mid)[0][-1])  # >=: a flat window (digital silence) has no frame above
        frames_after = F.N_FRAMES - 1 - last
        return end_s - frames_after * F.HOP_LENGTH / F.SAMPLE_RATE


def detect_pcm(det: Detector, pcm: np.ndarray, chunk: int = 1600) -> list[dict]:
    """Run a whole clip through the detector in chunks of ``chunk`` samples (as a mic would)."""
    events = []
    for start in range(0, len(pcm), chunk):
        events.extend(det.push(pcm[start : start + chunk]))
    return events + det.flush()
