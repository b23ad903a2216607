"""A Device's detection: ``Device.detect`` streams audio (a WAV file or file object, samples,
chunks, the microphone) through ``Device.detector``, the detector of the state's keywords, active
model and operating points, whose confirmed base-keyword detections feed the tail replay buffer.

Split from device.py to keep each file about one thing; ``Device`` inherits ``Detection``, and
``edge.device`` imports ``CHUNK`` and the helpers from here.

    >>> det, replay = Device("state/").detector(sensitivity=1.0)   # what the agent swaps on a new model
    >>> events = det.push(chunk)
"""

from __future__ import annotations

from edge.device_data import is_path
from edge.device_models import calibrated_for, embedding_dim, version_thresholds
from edge.errors import EdgelearnError

CHUNK = 1600  # samples pushed to the detector at a time (0.1 s, as a microphone delivers them)


class Detection:
    """Mixin: needs ``bundle``, ``state_dir``, ``backend``, ``enrolled``, ``recover`` and ``models``
    from ``Device``."""

    def detect(self, source=None, *, mic: bool = False, keywords=None, threshold=None,
               sensitivity: float | None = None, stride: int = 4, confirm: float = 0.9, replay: bool = True,
               asr: bool | str = "auto"):
        """Stream ``source`` through the detector; returns an iterator of events
        ``{"keyword", "time_s", "score"}``, each as soon as it is found.

        ``source``: a WAV path or binary file object (16 kHz mono 16-bit, any length, read in
        0.1 s chunks), an int16 array of samples, or an iterable of int16 chunks; ``mic=True``:
        the default ALSA device (``arecord``) until it stops (``mic="hw:1,0"``: that ALSA device; a
        recorder that fails is an ``edge.audio.MicError``). ``keywords``: base keywords to report
        (None: the bundle's commands; ``"all"``: every word label). ``threshold``: one for every
        base keyword or {keyword: threshold} (None: the version's own operating point when it was
        published with one, ``version_thresholds``, else
        ``edge.detect.THRESHOLD``); ``sensitivity``
        instead: the thresholds ``calibrate`` set for at most this many false accepts per hour.
        Base-keyword events at or above ``confirm`` feed the tail replay buffer unless
        ``replay=False``. ``asr``: a second stage confirms every base-keyword detection, its first stage
        at the stage's own threshold unless a threshold or sensitivity is given: ``"auto"`` (the
        default), the bundle's phrase models where it ships them, the model is its own encoder (not
        adapted here, no federated head) and neither a threshold nor a sensitivity is given
        (``default_stage``: the default operating point), else none; True or ``"pocketsphinx"``, a
        recogniser trained on real speech (``edge.confirm``; ``pip install 'edgelearn[asr]'``);
        ``"phrase"``, the bundle's phrase models of each command whatever the rest
        (``edge.phrase_stage``); False, none (the first stage alone). The models are loaded when this is called; the audio is read while the iterator runs."""
        from edge.options import check_detect

        # None is the default, as for threshold and sensitivity (stride < 1 was a TypeError deep in Detector)
        stride, confirm = (4 if stride is None else stride), (0.9 if confirm is None else confirm)
        check_detect(threshold=threshold, sensitivity=sensitivity, stride=stride, confirm=confirm)  # ranges
        if bool(mic) == (source is not None):
            raise EdgelearnError("detect needs one audio source", fix="pass a WAV file, samples or chunks, or mic=True")
        if source is not None:
            source = _checked_source(source)  # before any model is loaded
        det, store = self.detector(keywords=keywords, threshold=threshold, sensitivity=sensitivity, stride=stride,
                                   confirm=confirm, replay=replay, asr=asr)
        return _events(det, source, mic, store)

    def detector(self, *, keywords=None, threshold=None, sensitivity: float | None = None, stride: int = 4,
                 confirm: float = 0.9, replay: bool = True, enrolled=None, levels: dict | None = None,
                 asr: bool | str = "auto"):
        """(``edge.detect.Detector``, the tail replay store it feeds or None) for the state's keywords,
        active model and operating points (the options are ``detect``'s): what ``detect`` streams
        through, and what the agent swaps when the model changes (``Detector.continue_from``).
        ``enrolled``: names of the enrolled keywords to detect (None: every one; the Wyoming
        server's ``detect`` names, edge/wyoming.py). ``levels``: {enrolled keyword: sensitivity} to
        detect at instead of their own (``calibrate`` measures each level)."""
        from edge.options import check_detect

        stride, confirm = (4 if stride is None else stride), (0.9 if confirm is None else confirm)  # the defaults
        check_detect(threshold=threshold, sensitivity=sensitivity, stride=stride, confirm=confirm)  # ranges
        if threshold is not None and sensitivity is not None:
            raise EdgelearnError("detect takes a threshold or a sensitivity, not both",
                                 fix="pass threshold=T, or sensitivity=FA_PER_HOUR after `calibrate`")
        from edge.adapt.verified import load_verified
        from edge.detect import THRESHOLD, Detector, default_keywords

        bundle = self.bundle
        state = self.enrolled()
        if enrolled is not None or levels:
            from edge.enroll import DeviceState

            kws = [k for k in state.keywords if enrolled is None or k["name"] in set(enrolled)]
            kws = [{**k, "sensitivity": (levels or {}).get(k["name"], k.get("sensitivity", "medium"))} for k in kws]
            state = DeviceState(state.root, state.model_id, state.version, kws, bundle)
        recogniser = None if asr == AUTO else second_stage(asr, bundle)  # a missing package: before any model loads
        self.recover()
        km, head = self.models()
        if keywords == "all":
            keywords = [w for w in km.labels if not w.startswith("_")]
        elif keywords is not None:
            keywords = [keywords] if isinstance(keywords, str) else list(keywords)
        if asr == AUTO and threshold is None and sensitivity is None and keywords != [] and _own_encoder(km, head):
            recogniser = default_stage(bundle)  # (no base keyword watched: nothing for it to judge)
        if recogniser is not None and threshold is None and sensitivity is None:
            threshold = recogniser.first_stage
        feed, store = (None, None) if not replay else _replay_feeder(bundle, self.state_dir, km, self.backend,
                                                                     confirm)
        if sensitivity is not None:
            from edge.operating import load_points

            point = load_points(self.state_dir, calibrated_for(bundle, self.state_dir)).point(sensitivity)
            threshold = dict(point["thresholds"])
            if point.get("phrase") and asr in (AUTO, "phrase") and keywords != [] and _own_encoder(km, head):
                # both stages at the rate asked for (``edge.phrase_calibrate``): the first at the stage's
                # threshold (raised for a command the place says a sound-alike of), each command's cutoff
                # calibrated on the place's audio
                recogniser = default_stage(bundle) if recogniser is None else recogniser
                if recogniser is not None:
                    recogniser.cutoffs = {**recogniser.cutoffs, **point["phrase"]["cutoffs"]}
                    threshold = dict(point["phrase"]["first_stage"])
            if keywords is not None and isinstance(threshold, dict):
                threshold = {w: t for w, t in threshold.items() if w in keywords}
        if threshold is None:  # the version's own operating point (an adapted tail ends in its head too)
            thr = version_thresholds(bundle)
            if thr is not None:
                watched = default_keywords(km) if keywords is None else keywords
                threshold = {w: t for w, t in thr.items() if w in watched} or None
        threshold = THRESHOLD if threshold is None else threshold
        custom = state.custom(dim=embedding_dim(km))
        verified = None if head is not None else load_verified(self.state_dir, bundle, threshold=threshold,
                                                               keywords=keywords, custom=custom)
        if verified is not None:
            # the adapted commands run through both stages (edge/adapt/verified.py); the others as before
            keywords = [w for w in (default_keywords(km) if keywords is None else keywords)
                        if w not in verified.names[:verified.n_base]]
            custom = verified
            if isinstance(threshold, dict):
                threshold = {w: t for w, t in threshold.items() if w in keywords}
        det = Detector(km, custom=custom, keywords=keywords, threshold=threshold, stride=stride, head=head,
                       on_event=feed, asr=recogniser)
        return det, store


AUTO = "auto"
SECOND_STAGES = (AUTO, "pocketsphinx", "phrase")
_said_no_frontend = []


def default_stage(bundle):
    """The second stage of the default operating point: the bundle's phrase models where it ships
    them (the shipped bundle does: at equal false accepts on development data, 0 per hour, the
    cascade hears 24-28 points more of voices never trained on than the first stage alone;
    docs/edge-runtime.md, "The default operating point since session 43"), else None. Without their front end
    (pymicro-features, a dependency on x86_64 and aarch64) the first stage runs alone, said once."""
    from edge import phrase_stage

    if not phrase_stage.has_models(bundle):
        return None
    if not phrase_stage.available():
        if not _said_no_frontend:
            _said_no_frontend.append(True)
            import warnings

            warnings.warn("the base commands run without their phrase second stage: pymicro-features is not "
                          "installed (pip install 'edgelearn[phrase]')", stacklevel=3)
        return None
    return phrase_stage.PhraseConfirm(bundle)


def _own_encoder(km, head) -> bool:
    """Does detection run the bundle's own encoder, nothing adapted here and no federated head (what
    the phrase stage's cutoffs were chosen behind)?"""
    from edge.kws import KeywordModel

    return head is None and type(km) is KeywordModel


def second_stage(asr, bundle):
    """The base commands' second stage ``asr`` names (``detect``'s option; ``"auto"``: see
    ``default_stage``), or None."""
    if asr is None or asr is False:
        return None
    if asr == AUTO:
        return default_stage(bundle)
    if asr is True or asr == "pocketsphinx":
        from edge.confirm import AsrConfirm

        return AsrConfirm()
    if asr == "phrase":
        from edge.phrase_stage import PhraseConfirm

        return PhraseConfirm(bundle)
    raise EdgelearnError(f"asr={asr!r} is not a second stage",
                         fix=f"pass asr=False (none), True (PocketSphinx) or one of "
                             f"{', '.join(map(repr, SECOND_STAGES))}")


SOURCE_FIX = ("source may be a WAV path, a binary file object, 16 kHz mono samples (int16, or float in [-1, 1]; "
              "shape (N,)) or a list or iterator of such chunks")


def _checked_source(source):
    """``source`` if ``detect`` can read it, else one EdgelearnError. A stereo (N, 2) array (soundfile's)
    read as chunks, a dict or an empty iterable used to give no events and no word; 5 a TypeError."""
    import numpy as np

    from edge.options import refuse_channels, samples

    if is_path(source) or hasattr(source, "read"):
        return source
    if isinstance(source, np.ndarray):
        refuse_channels(source, "detect's audio")
        if source.ndim == 1:
            return samples(source, "detect's audio")
        if source.ndim == 2:  # rows of chunks (read one after another, as before)
            return source
        raise EdgelearnError(f"detect's audio has shape {source.shape}", fix=SOURCE_FIX)
    if isinstance(source, (bytes, bytearray, dict, set, frozenset)) or not hasattr(source, "__iter__"):
        raise EdgelearnError(f"detect cannot read {type(source).__name__} {str(source)[:40]!r} as audio",
                             fix=SOURCE_FIX)
    return source


def _replay_feeder(bundle, state_dir, km, backend, confirm):
    """on_event hook: confirmed base-keyword detections go into the tail replay buffer (weak labels)."""
    import numpy as np

    from edge.adapt import Backbone
    from edge.replay import TAIL_REPLAY, open_for_adding

    bb = Backbone(bundle, backend=backend)
    dim = int(np.prod(bb.backend.outputs[0].shape[1:]))
    store = open_for_adding(state_dir, dim=dim, max_bytes=1 << 20, name=TAIL_REPLAY)
    scale, zp = bb.qparams

    def feed(ev, window):
        if ev["keyword"] in km.labels and ev["score"] >= confirm and window is not None:
            q = bb(window[None])[0]
            store.add((q.astype(np.float32) - zp) * scale, km.labels.index(ev["keyword"]))

    return feed, store


def _events(det, source, mic, replay):
    """The detector's events over ``source`` (see ``Device.detect``); the replay buffer's last
    partial batch is written on the way out."""
    import numpy as np

    try:
        if mic:
            yield from _mic_events(det, None if mic is True else mic)
            return
        if is_path(source) or hasattr(source, "read"):
            from edge.audio import open_wav

            # streamed in 0.1 s chunks (as a mic would be): memory stays bounded at any length
            with open_wav(source, min_samples=1) as wav:
                for chunk in wav.chunks(CHUNK):
                    yield from det.push(chunk)
        else:
            from edge.options import samples

            chunks = source
            if isinstance(source, np.ndarray):
                chunks = (source[i:i + CHUNK] for i in range(0, len(source), CHUNK))
            for i, chunk in enumerate(chunks):
                # each chunk mono samples (a chunk of None, text or a stereo block: one sentence)
                yield from det.push(chunk if isinstance(source, np.ndarray)  # checked whole in detect
                                    else samples(chunk, f"detect's chunk {i + 1}"))
        yield from det.flush()
    finally:
        if replay is not None:
            replay.flush()  # batched writes


def _mic_events(det, device: str | None = None):
    """The detector's events over the microphone (``edge.audio.mic_chunks``: a recorder that fails is
    one ``MicError``, so ``device detect --mic`` ends non-zero)."""
    from edge.audio import mic_chunks

    for chunk in mic_chunks(CHUNK, device):
        yield from det.push(chunk)
