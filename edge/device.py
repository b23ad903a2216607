"""One device: a state directory and a bundle, and everything ``edgelearn device`` does with them.

``Device`` owns the device's operations; ``edge.commands.device`` parses arguments, makes one call and
prints what it returns. Nothing here parses arguments or prints: bad input is an ``EdgelearnError``
that says what to do.

    >>> from edge import Device
    >>> dev = Device("state/")                       # the shipped, signed model
    >>> dev.enroll("hey edge", ["a.wav", "b.wav", "c.wav", "d.wav", "e.wav"])["threshold"]
    0.7487
    >>> for event in dev.detect("long.wav"):         # streamed in 0.1 s chunks, any length
    ...     print(event)                              # {"keyword": "hey edge", "time_s": 1.65, "score": 0.94}
    >>> dev.adapt("mydata/", strategy="lora", context="kitchen", force=True)["status"]
    'done'
    >>> dev.status()["adapt"]["active"]
    'kitchen'

What the state directory holds and what survives a crash: docs/edge-runtime.md, docs/faults.md.
Every operation that writes the adapted state first finishes or undoes what a crash interrupted
(``recover``). The bundle is verified on first use (``Device.bundle``), so a Device is cheap to make.
Which model detection runs on the bundle and the state (``detection_models``, ``detection_info``, a
federated version's head and thresholds) is ``edge.device_models``; its names are importable from here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from edge.device_data import ambient_of, is_path, load_labelled
# which model detection runs has a module of its own; every name stays importable from here
from edge.device_models import (  # noqa: F401 (those not called here: re-exported)
    base_models, calibrated_for, detection_info, detection_models, embedding_dim, head_params, is_federated,
    open_bundle, verifier_status, version_thresholds)
from edge.errors import EdgelearnError

DEFAULT_CONTEXT = "default"
CHUNK = 1600  # samples pushed to the detector at a time (0.1 s, as a microphone delivers them)


# what enrolled keywords and adapted tails are learned with (partition names and files of the bundle)
ENROLMENT_FILES = ("encoder", "encoder-onnx", "encoder-fp32", "phones", "negatives.npy")
ENROLMENT_DIR = "enrolment"  # the clips each keyword was enrolled from (Device.enroll), for carry_to


def _slug(name: str) -> str:
    """A keyword's file name: its letters and digits, '_' for anything else, and a digest of the name
    (two names never share a file)."""
    import hashlib
    import re

    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:32] + "-" + \
        hashlib.sha1(name.encode()).hexdigest()[:8]
ADAPT_FILES = ("backbone", "tail-prefix", "tail.npz")


def _basis(bundle, names) -> dict:
    """{name: sha256} of the bundle's partitions and files named in ``names`` that it has."""
    files = bundle.manifest.get("files", {})
    by_part = {p.get("name"): p.get("file") for p in bundle.manifest.get("partitions", [])}
    out = {}
    for n in names:
        f = by_part.get(n, n)
        if f in files:
            out[n] = files[f].get("sha256")
    return out


def check_distill(distill: float) -> float:
    if not 0.0 <= distill <= 1.0:
        raise EdgelearnError(f"--distill {distill} is outside 0..1", fix="pass a weight between 0 and 1")
    return distill



HOLD_CARRY_ENV = "EDGELEARN_CARRY_HOLD"  # test-only: Device.carry_to stops between its two writes


def _bind_pointer(store, bundle) -> None:
    """Rewrite the adapt pointer of ``store`` (atomically) as trained on ``bundle``."""
    import json

    from edge.atomic import atomic_write

    atomic_write(store.meta_path, json.dumps({**store.meta, "model": [bundle.model_id, bundle.version]},
                                             indent=1).encode())

class Device:
    """A device's state directory (``state_dir``: enrolled keywords, adapted contexts, replay
    buffers, scheduler state, operating points) used with one bundle.

    ``bundle``: a loaded ``edge.bundle.Bundle``, or the path of a bundle directory or .zip (verified
    with ``trusted_keys``; None: the device's default keys); None: the shipped model.
    ``backend``: ``litert | onnxruntime | auto``. ``sysfs_root``: where the scheduler reads the
    battery and temperature (``edge.scheduler``); ``idle_s``: a function giving seconds since the
    user was last active (None: treated as idle, as ``edgelearn device adapt`` does).

    An operation is a method that opens what it needs from the state directory and the bundle, so
    a new one (the federated round of ``edge.fl_client``) is one more method beside ``adapt``."""

    def __init__(self, state_dir, bundle=None, *, backend: str = "auto", trusted_keys=None,
                 sysfs_root="/", idle_s=None):
        self.state_dir = Path(state_dir)
        self.backend = backend
        self.sysfs_root = Path(sysfs_root)
        self.idle_s = idle_s or (lambda: 10 ** 6)
        self._bundle_src, self._trusted_keys = bundle, trusted_keys
        self._bundle = bundle if bundle is not None and hasattr(bundle, "manifest") else None

    def __repr__(self) -> str:
        return f"Device({str(self.state_dir)!r})"

    # -- what the operations share ---------------------------------------------------------------
    @property
    def bundle(self):
        """The verified bundle (loaded and checked on first use)."""
        if self._bundle is None:
            self._bundle = open_bundle(self._bundle_src, self._trusted_keys)
        return self._bundle

    def scheduler(self):
        """The state's battery/thermal/idle scheduler (``edge.scheduler.Scheduler``)."""
        from edge.scheduler import Scheduler

        return Scheduler(self.state_dir, sysfs_root=self.sysfs_root, idle_s=self.idle_s)

    def recover(self, scheduler=None):
        """Finish or undo what a crash interrupted in the state directory (``AdaptStore.recover``): a
        commit rolled forward with its energy charged once, staged and temp files of runs that never
        committed removed. Every operation that writes the state starts with it; returns the store."""
        from edge.adapt.store import AdaptStore

        store = AdaptStore(self.state_dir, self.bundle)
        store.recover((scheduler or self.scheduler()).charge)
        return store

    def enrolled(self):
        """The enrolled keywords (``edge.enroll.DeviceState``)."""
        from edge.enroll import DeviceState

        return DeviceState.open(self.state_dir, self.bundle)

    def models(self):
        """(model, head) that detection runs now: see ``detection_models``."""
        return detection_models(self.bundle, self.state_dir, self.backend)

    def calibrated_for(self) -> dict:
        return calibrated_for(self.bundle, self.state_dir)

    def keyword_model(self):
        from edge.kws import KeywordModel

        return KeywordModel(self.bundle, backend=self.backend)

    # -- detect ----------------------------------------------------------------------------------
    def detect(self, source=None, *, mic: bool = False, keywords=None, threshold=None,
               sensitivity: float | None = None, stride: int = 4, confirm: float = 0.9, replay: bool = True,
               asr: bool = False):
        """Stream ``source`` through the detector; returns an iterator of events
        ``{"keyword", "time_s", "score"}``, each as soon as it is found.

        ``source``: a WAV path or binary file object (16 kHz mono 16-bit, any length, read in
        0.1 s chunks), an int16 array of samples, or an iterable of int16 chunks; ``mic=True``:
        the default ALSA device (``arecord``) until it stops. ``keywords``: base keywords to report
        (None: the bundle's commands; ``"all"``: every word label). ``threshold``: one for every
        base keyword or {keyword: threshold} (None: the version's own operating point when it was
        published with one, ``version_thresholds``, else
        ``edge.detect.THRESHOLD``); ``sensitivity``
        instead: the thresholds ``calibrate`` set for at most this many false accepts per hour.
        Base-keyword events at or above ``confirm`` feed the tail replay buffer unless
        ``replay=False``. ``asr``: PocketSphinx confirms every base-keyword detection, first stage at
        ``edge.confirm.FIRST_STAGE`` unless a threshold or sensitivity is given (``edge.confirm``;
        ``pip install 'edgelearn[asr]'``). The models are loaded when this is called; the audio is
        read while the iterator runs."""
        if mic == (source is not None):
            raise EdgelearnError("detect needs one audio source", fix="pass a WAV file, samples or chunks, or mic=True")
        det, store = self.detector(keywords=keywords, threshold=threshold, sensitivity=sensitivity, stride=stride,
                                   confirm=confirm, replay=replay, asr=asr)
        return _events(det, source, mic, store)

    def detector(self, *, keywords=None, threshold=None, sensitivity: float | None = None, stride: int = 4,
                 confirm: float = 0.9, replay: bool = True, enrolled=None, levels: dict | None = None,
                 asr: bool = False):
        """(``edge.detect.Detector``, the tail replay store it feeds or None) for the state's keywords,
        active model and operating points (the options are ``detect``'s): what ``detect`` streams
        through, and what the agent swaps when the model changes (``Detector.continue_from``).
        ``enrolled``: names of the enrolled keywords to detect (None: every one; the Wyoming
        server's ``detect`` names, edge/wyoming.py). ``levels``: {enrolled keyword: sensitivity} to
        detect at instead of their own (``calibrate`` measures each level)."""
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
        recogniser = None
        if asr:
            from edge.confirm import FIRST_STAGE, AsrConfirm

            recogniser = AsrConfirm()
            if threshold is None and sensitivity is None:
                threshold = FIRST_STAGE
        self.recover()
        km, head = self.models()
        if keywords == "all":
            keywords = [w for w in km.labels if not w.startswith("_")]
        elif keywords is not None:
            keywords = [keywords] if isinstance(keywords, str) else list(keywords)
        feed, store = (None, None) if not replay else _replay_feeder(bundle, self.state_dir, km, self.backend,
                                                                     confirm)
        if sensitivity is not None:
            from edge.operating import load_points

            threshold = load_points(self.state_dir, calibrated_for(bundle, self.state_dir)).thresholds(sensitivity)
            if keywords is not None:
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

    def carry_to(self, new) -> dict:
        """Bind this state's enrolled keywords and adapted contexts to bundle ``new`` (a newer version
        of the same model). Keywords whose enrolment basis is unchanged in it (the encoder, phone
        model and negative bank: ``ENROLMENT_FILES``, compared by the manifests' sha256) carry as
        they are; when the basis changed, every keyword is enrolled again on ``new`` from the clips
        the device kept when it was enrolled (``enrolment_clips``: on the device only, never
        uploaded). Adapted contexts carry only when their backbone and base tail (``ADAPT_FILES``)
        are unchanged; on ``new`` their tails end in its federated head, and a context adapted
        against another head runs rebased onto it (``AdaptStore.load_carried``: the personal offsets
        on the new head) until it is adapted again on ``new`` (the agent does so at once, from its
        labelled clips). Nothing is written unless all of it carries; otherwise an EdgelearnError says
        what changed. Returns {"keywords": n, "contexts": n, "rederived": [names enrolled again]}.

        Two files move, each atomically: the adapt pointer first, the keywords last (the agent takes
        keywords bound to ``new`` as "carried", ``Agent._open_device``). A process killed between
        the two leaves the pointer on ``new`` and the keywords on the old version; the next call
        (the agent checks the installed version again on restart) finds the pointer already moved,
        takes it as carried (its basis was checked before it was written) and finishes; a version
        refused after all gets the pointer back with ``unbind_adapted``."""
        import json

        from edge.adapt.store import AdaptStore
        from edge.enroll import DeviceState

        old = self.bundle
        if new.model_id != old.model_id:
            raise EdgelearnError(f"bundle {new.model_id} is another model than {old.model_id}",
                                 fix="enrol the keywords again in a fresh state directory")
        state = self.enrolled()
        store, moved = self._adapt_store_of(old, new), False
        if store.model != [old.model_id, old.version]:
            moved = True  # a carry_to stopped between its two writes: the pointer is on `new` already
        changed = []
        if store.meta["contexts"] and not moved:
            a, b = _basis(old, ADAPT_FILES), _basis(new, ADAPT_FILES)
            changed = [n for n in a if a[n] != b.get(n)]
            if not changed:  # the adapted tails end in new's head (a federated version's): one they can run
                from edge.adapt import load_tail

                try:
                    load_tail(new)
                except EdgelearnError:
                    changed.append("the head (not one a conv tail can end in)")
        keywords, rederived = state.keywords, []
        if state.keywords and _basis(old, ENROLMENT_FILES) != _basis(new, ENROLMENT_FILES):
            missing = [k["name"] for k in state.keywords if self.enrolment_clips(k["name"]) is None]
            if missing:
                changed.append(f"the encoder (no kept enrolment clips for {', '.join(missing)})")
            elif not changed:
                keywords, rederived = self._rederive(new, [k["name"] for k in state.keywords]), \
                    [k["name"] for k in state.keywords]
        if changed:
            raise EdgelearnError(f"{new.model_id} v{new.version} changes {', '.join(sorted(set(changed)))}, which this "
                                 "device's keywords or adapted tail were learned with",
                                 fix="stay on the running version, or enrol and adapt again for the new one")
        if store.meta_path.exists() and not moved:
            _bind_pointer(store, new)
        if HOLD_CARRY_ENV in os.environ:  # test-only: tests/test_device_carry.py kills the process here
            Path(os.environ[HOLD_CARRY_ENV]).write_text("held")
            time.sleep(3600)
        if keywords:
            DeviceState(self.state_dir, new.model_id, new.version, keywords, new).save()
        self._bundle = new
        return {"keywords": len(keywords), "contexts": len(store.meta["contexts"]), "rederived": rederived}

    def _adapt_store_of(self, old, new):
        """The adapt store bound to ``old``, or to ``new`` when a carry_to already moved its pointer."""
        from edge.adapt.store import AdaptStore

        try:
            return AdaptStore(self.state_dir, old)
        except EdgelearnError:
            try:
                return AdaptStore(self.state_dir, new)
            except EdgelearnError:
                pass
            raise

    def unbind_adapted(self, refused) -> None:
        """After ``refused`` (a version a carry_to may have moved the adapt pointer to) was rolled
        back: the pointer back on this device's bundle, whose basis it was checked to share."""
        from edge.adapt.store import AdaptStore

        try:
            store = AdaptStore(self.state_dir, refused)
        except EdgelearnError:
            return  # not moved (or bound to this bundle already): nothing to undo
        if store.meta_path.exists() and store.model != [self.bundle.model_id, self.bundle.version]:
            _bind_pointer(store, self.bundle)

    def _rederive(self, new, names) -> list[dict]:
        """The keywords ``names`` enrolled on bundle ``new`` from their kept clips (in a scratch
        state: nothing of this state changes); their entries."""
        import tempfile

        from edge.enroll import DeviceState, enroll
        from edge.kws import KeywordModel

        km = KeywordModel(new, backend=self.backend)
        with tempfile.TemporaryDirectory(dir=self.state_dir, prefix=".rederive-") as tmp:
            scratch = DeviceState(Path(tmp), new.model_id, new.version, [], new)
            levels = {k["name"]: k.get("sensitivity", "medium") for k in self.enrolled().keywords}
            for name in names:
                clips, speakers = self.enrolment_clips(name, speakers=True)
                enroll(km, scratch, name, clips, sensitivity=levels.get(name, "medium"), speakers=speakers)
            return scratch.keywords

    def sensitivity(self, name: str, level: str | None = None, max_fa_h: float | None = None) -> dict:
        """Enrolled keyword ``name``'s sensitivity; with ``level`` (low: fewest false accepts,
        medium, high: fewest misses), detect it at that level from now on (every level's thresholds
        were set at enrolment). Returns {"keyword", "sensitivity", "sensitivities": {level:
        {"threshold", "bank_false_accept_rate"[, "fa_per_hour"]}}}. ``max_fa_h``: instead of a level,
        the most sensitive one ``calibrate`` measured at or under this many false accepts per hour."""
        from edge.enroll import keyword_sensitivity

        return keyword_sensitivity(self.enrolled(), name, level, max_fa_h)

    def enrolment_clips(self, name: str, speakers: bool = False):
        """The clips keyword ``name`` was enrolled from, as the device kept them (``ENROLMENT_DIR``),
        or None (enrolled before clips were kept, or removed); with ``speakers``, (clips, one
        speaker id per clip)."""
        import numpy as np

        path = self.state_dir / ENROLMENT_DIR / f"{_slug(name)}.npz"
        try:
            with np.load(path, allow_pickle=False) as z:
                keys = sorted((k for k in z.files if k.startswith("clip_")), key=lambda k: int(k.split("_")[1]))
                clips = [np.asarray(z[k], np.int16) for k in keys]
                who = np.asarray(z["speakers"], np.int64) if "speakers" in z.files else np.zeros(len(clips), np.int64)
        except (OSError, ValueError, KeyError, IndexError):
            return None
        if len(who) != len(clips):
            return None
        return (clips, [int(v) for v in who]) if speakers else clips

    # -- enroll ----------------------------------------------------------------------------------
    def enroll(self, name: str, clips, *, replace: bool = False, add: bool = False,
               sensitivity: str | None = None) -> dict:
        """Learn keyword ``name`` from 3-10 clips (WAV paths or int16 arrays): prototype, head and
        open-set threshold from the bundle's negative bank, and the second-stage templates
        (``edge.enroll.enroll``); saves the state; returns the report (``outliers``: clips left
        out because they do not sound like the others). ``add``: these clips are another person
        saying the enrolled keyword (up to ``edge.enroll.MAX_SPEAKERS``): it is enrolled again from
        every speaker's kept clips and these. ``sensitivity``: low, medium or high
        (``edge.enroll.SENSITIVITIES``; every level is calibrated, ``sensitivity`` switches; None:
        medium, or with ``add`` the keyword's own)."""
        from edge.audio import read_wav
        from edge.enroll import enroll

        import numpy as np

        from edge.atomic import atomic_write, npz_bytes

        state = self.enrolled()
        clips = list(clips)
        names = [str(c) if is_path(c) else f"clip {i + 1}" for i, c in enumerate(clips)]
        pcm = [read_wav(c, min_samples=1) if is_path(c) else c for c in clips]
        speakers = [0] * len(pcm)
        if add:
            norm = name.strip().lower()
            entry = next((k for k in state.keywords if k["name"] == norm), None)
            if entry is None:
                raise EdgelearnError(f"--add needs an enrolled keyword; {norm!r} is not one",
                                     fix="enrol it first without --add")
            kept = self.enrolment_clips(norm, speakers=True)
            if kept is None:
                raise EdgelearnError(f"the device kept no clips of {norm!r} (enrolled before it kept them)",
                                     fix="enrol it again with --replace, then --add the other speaker")
            new = max(kept[1]) + 1
            names = [f"kept clip {i + 1} (speaker {w + 1})" for i, w in enumerate(kept[1])] + names
            pcm, speakers = kept[0] + pcm, kept[1] + [new] * len(pcm)
            sensitivity = sensitivity or entry.get("sensitivity", "medium")
        rep = enroll(self.keyword_model(), state, name, pcm, clip_names=names, replace=replace or add,
                     sensitivity=sensitivity or "medium", speakers=speakers, save=False)
        # kept on the device (never uploaded) so that a version with a new encoder can enrol it again;
        # written before the keyword (a kill between leaves clips the keyword is re-derived from)
        path = self.state_dir / ENROLMENT_DIR / f"{_slug(rep['keyword'])}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, npz_bytes({**{f"clip_{i}": np.asarray(c, np.int16) for i, c in enumerate(pcm)},
                                      "speakers": np.asarray(speakers, np.int64)}))
        state.save()
        return rep

    # -- adapt -----------------------------------------------------------------------------------
    def adapt(self, data, *, recipe: str | None = None, strategy: str | None = None, optimizer: str | None = None,
              steps: int | None = None, rank: int = 4, memory_budget: int = 256 * 1024, replay_bytes: int = 1 << 20,
              distill: float = 0.5, context: str = DEFAULT_CONTEXT, dw4: str = "auto", ambient=None,
              augment: int | None = None, balance: bool | None = None, negative_share: float | None = None,
              negative_distill: float | None = None, verify: bool | None = None, noisy_ambient: bool | None = None,
              lr: float | None = None, seed: int = 0, force: bool = False) -> dict:
        """Train the float conv tail on the frozen int8 backbone with replay, and commit it as the
        next version of ``context`` (which becomes active).

        ``data``: a directory ``DIR/<label>/*.wav`` of the bundle's labels, or ``(clips, labels)``
        (int16 clips, label names or indices). ``recipe``: ``None``/``"plain"`` (the clips as they
        are: bias-only, SGD, 200 steps) or ``"speaker"`` (``edge.adapt.recipe.SPEAKER``: speaker
        adaptation of the base commands from ~3 clips each, with negatives and a second stage);
        ``strategy``, ``optimizer``, ``steps``, ``augment`` (copies of each command clip),
        ``balance``, ``negative_share``, ``negative_distill``, ``verify`` (build the commands'
        second stage, ``edge.adapt.verified``) and ``noisy_ambient`` (a noisy copy of every ambient
        window too) override the recipe's. ``ambient``: WAV paths (or
        (N, 16000) int16 windows) of everyday audio of the place that says none of the commands,
        trained on as ``_unknown_`` (``edge.adapt.ambient``). Unless ``force``, the scheduler decides
        first (a run it defers returns ``{"status": "deferred", "reason": ...}``) and may pause the
        run (``"status": "paused"``: the next call resumes it). ``dw4``: train the tail's depthwise
        layer too (``auto``: frozen for bias-only). ``distill``: weight of the bundle's own outputs
        in the replay examples' targets. Returns the run's result (status, steps, version, losses)
        with the recipe, strategy, trained tensors, bytes one step holds, examples (``n``) and the
        commands given a second stage (``verified``)."""
        import numpy as np

        from edge.adapt import Backbone, ConvTail, ConvTrainer, load_tail
        from edge.adapt.convtrain import choose_sparse
        from edge.adapt.delta import trained_on
        from edge.adapt.fcache import cached_features
        from edge.adapt.recipe import resolve, train_options, training_windows
        from edge.adapt.run import train
        from edge.replay import TAIL_REPLAY, ReplayStore

        check_distill(distill)
        r = resolve(recipe, strategy=strategy, optimizer=optimizer, steps=steps, augment=augment, balance=balance,
                    negative_share=negative_share, negative_distill=negative_distill, verify=verify,
                    noisy_ambient=noisy_ambient)
        bundle = self.bundle
        sched = self.scheduler()
        store = self.recover(sched)
        km = self.keyword_model()
        windows, y = load_labelled(km, data)
        amb = ambient_of(ambient)
        steps = r["steps"]
        if not force:
            d = sched.decide()
            if d.action != "train":
                return {"status": "deferred", "reason": d.reason}
            steps = min(steps, d.steps)
        # the plain recipe trains on the clips as given, in their order (as before the recipe existed)
        x_in, yy = (training_windows(windows, y, km.labels, ambient=amb, augment=r["augment"], seed=seed,
                                     noisy_ambient=r["noisy_ambient"])
                    if r["augment"] > 1 or amb is not None else (windows, y))
        bb = Backbone(bundle, backend=self.backend)
        x = cached_features(self.state_dir, bb, km, x_in)  # int8; epochs never rerun the backbone
        train_dw = dw4 == "train" or (dw4 == "auto" and r["strategy"] != "bias-only")
        # from what detection runs: a context adapted against another head, rebased onto this one
        tail = ConvTail(load_tail(bundle), store.load_carried(context)[0], qparams=bb.qparams, train_dw=train_dw)
        chosen = choose_sparse(tail, x[:32], yy[:32], memory_budget, r["optimizer"]) if r["strategy"] == "sparse" else ()
        tr = ConvTrainer(tail, r["strategy"], r["optimizer"], rank=rank, sparse_weights=chosen, lr=lr, seed=seed)
        names = set(tail.delta) | set(tr.names)
        if any(n.startswith("cls.lora") for n in names):  # merged into cls_w at the commit
            names.add("cls_w")
        record = {"trained_on": trained_on(bundle, tail.base, names)}  # the head it ends in (carry_to)
        # the replay buffer is written once, in the run's commit (nothing on a pause)
        replay = ReplayStore(self.state_dir, dim=int(np.prod(x.shape[1:])), max_bytes=replay_bytes,
                             name=TAIL_REPLAY, flush_every=1 << 62)
        sampled = r["balance"] or r["negative_share"] is not None or r["negative_distill"] > 0
        teacher = ConvTail(load_tail(bundle), qparams=bb.qparams).probs \
            if distill > 0 or (sampled and r["negative_distill"] > 0) else None
        entries = None
        if r["verify"]:
            from edge.adapt.verified import command_entries

            entries = command_entries(bundle, km, windows, y, seed=seed)

        def stage():
            replay.add_many(tail.to_float(x), yy)
            out = {TAIL_REPLAY: replay.staged()}
            if entries:
                from edge.adapt.verified import entries_bytes, entries_file

                out[entries_file(context)] = entries_bytes(entries, tail.merged())
            return out

        options = train_options(km.labels, r["balance"], r["negative_share"], r["negative_distill"]) if sampled else {}
        res = train(tr, x, yy, store, context, steps, replay=replay, teacher=teacher, distill=distill, seed=seed,
                    should_continue=(lambda: True) if force else sched.should_continue,
                    charge_seq=sched.charged + 1, stage=stage, record=record, **options)
        if res["status"] == "done":
            replay.mark_saved()
        store.recover(sched.charge)  # the run's energy, charged once (its record sits beside the result)
        return {**res, "recipe": r["recipe"], "strategy": r["strategy"], "tensors": tr.names,
                "step_bytes": tr.step_bytes(), "n": int(len(x)), "verified": sorted(entries or {})}

    def rollback(self, context: str = DEFAULT_CONTEXT) -> int | None:
        """Make ``context``'s previous version current again; returns it (None: the base model)."""
        return self.recover().rollback(context)

    def use(self, context: str | None) -> str | None:
        """Switch the active adapted context (None: the base model); returns the active one."""
        store = self.recover()
        store.use(context)
        return store.meta["active"]

    # -- calibrate -------------------------------------------------------------------------------
    def calibrate(self, wavs, targets=None) -> dict:
        """Per-keyword base thresholds for at most each of ``targets`` false accepts per hour (None:
        ``edge.operating.TARGETS``), measured on ``wavs``: WAVs of everyday audio of the place that
        say none of the base keywords (an hour or more). Saved as the state's operating points for
        the active model and context (``detect(sensitivity=R)`` uses them); returns the table
        ({"for", "hours", "files", "points": [{"target_fa_h", "thresholds", ...}]})."""
        from edge.audio import open_wav
        from edge.detect import Detector
        from edge.operating import TARGETS, calibrate, save_points, stream_scores

        try:
            targets = sorted({float(t) for t in (TARGETS if targets is None else targets)})
        except (TypeError, ValueError):
            raise EdgelearnError(f"targets {targets!r} are not numbers", fix="pass e.g. [0.5, 1, 2]") from None
        if not targets or min(targets) <= 0:
            raise EdgelearnError("--targets needs rates above 0 false accepts per hour", fix="pass e.g. 0.5,1,2")
        wavs = [wavs] if is_path(wavs) else list(wavs)
        bundle = self.bundle
        km, head = self.models()
        det = Detector(km, head=head)
        streams, hours = [], 0.0
        for path in wavs:
            with open_wav(path, min_samples=16000) as w:  # read in pieces: an hour of audio is fine
                sc, ends, h = stream_scores(det, w.chunks(16000 * 60))
            streams.append((sc, ends, None))
            hours += h
        points = [calibrate(streams, hours, t, det.names) for t in targets]
        table = {"for": calibrated_for(bundle, self.state_dir), "hours": hours,
                 "files": [str(p) for p in wavs], "points": points}
        save_points(self.state_dir, table)
        custom = self._calibrate_enrolled(wavs, hours)
        if custom:
            table["enrolled"] = custom
        return table

    def _calibrate_enrolled(self, wavs, hours: float) -> dict:
        """False accepts per hour of every enrolled keyword at each of its sensitivities (both
        stages, as detection runs them) on ``wavs``; kept in each entry (``fa_per_hour``, with the
        hours measured) and returned as {keyword: {level: rate}}. Enrolling again drops them."""
        from edge.audio import open_wav
        from edge.enroll import SENSITIVITIES

        state = self.enrolled()
        if not state.keywords:
            return {}
        counts = {k["name"]: {} for k in state.keywords}
        for level in SENSITIVITIES:
            names = [k["name"] for k in state.keywords if level == "medium" or level in k.get("sensitivities", {})]
            if not names:
                continue
            det, _ = self.detector(keywords=[], replay=False, enrolled=names, levels={n: level for n in names})
            n = dict.fromkeys(names, 0)
            for path in wavs:
                det.reset()
                with open_wav(path, min_samples=16000) as w:
                    for chunk in w.chunks(16000 * 60):
                        for ev in det.push(chunk):
                            n[ev["keyword"]] += 1
                for ev in det.flush():
                    n[ev["keyword"]] += 1
            for name, c in n.items():
                counts[name][level] = round(c / hours, 3)
        for k in state.keywords:
            k["fa_per_hour"] = counts[k["name"]]
            k["fa_calibrated_hours"] = round(hours, 4)
        state.save()
        return counts

    # -- status ----------------------------------------------------------------------------------
    def status(self) -> dict:
        """Bundle, enrolled keywords and whether each one's verifier is current, adapted contexts,
        replay buffers, the scheduler's last decision, a federated version's operating point, and
        which model detection runs (``detection_info``). Reads only: never changes the state."""
        from edge.adapt.store import AdaptStore
        from edge.replay import EMBEDDING_REPLAY, TAIL_REPLAY, load_replay
        from edge.scheduler import last_record

        bundle = self.bundle
        labels = list(bundle.labels)
        state = self.enrolled()
        adapt = AdaptStore(self.state_dir, bundle)  # read-only: no recover
        last = last_record(self.state_dir)
        replay = {}
        for name in (EMBEDDING_REPLAY, TAIL_REPLAY):
            rb = load_replay(self.state_dir / name)
            if rb is not None:
                replay[name] = {"count": rb.count, "capacity": rb.capacity, "bytes": rb.nbytes,
                                "classes": {labels[k] if k < len(labels) else k: n
                                            for k, n in sorted(rb.class_counts().items())}}
        from edge.agent import read_status

        out = {"bundle": f"{bundle.model_id} v{bundle.version}", "keywords": state.names(),
               "verifier": verifier_status(state.keywords, bundle),
               "sensitivity": {k["name"]: k.get("sensitivity", "medium") for k in state.keywords},
               "adapt": adapt.meta, "replay": replay,
               "last_schedule": last}
        op = (bundle.manifest.get("extra") or {}).get("operating")
        if op is not None:  # a federated version's default thresholds (``version_thresholds``)
            try:
                thr = version_thresholds(bundle)
            except EdgelearnError:
                thr = "malformed"
            out["operating_point"] = {"thresholds": thr, "matched_to_version": op.get("matched_to_version"),
                                      "in_use": thr != "malformed"}
        out["detection"] = detection_info(bundle, self.state_dir)
        agent = read_status(self.state_dir)  # what `device run` did last (edge/agent.py)
        if agent is not None:
            out["agent"] = agent
        return out


def _replay_feeder(bundle, state_dir, km, backend, confirm):
    """on_event hook: confirmed base-keyword detections go into the tail replay buffer (weak labels)."""
    import numpy as np

    from edge.adapt import Backbone
    from edge.replay import TAIL_REPLAY, ReplayStore

    bb = Backbone(bundle, backend=backend)
    dim = int(np.prod(bb.backend.outputs[0].shape[1:]))
    store = ReplayStore(state_dir, dim=dim, max_bytes=1 << 20, name=TAIL_REPLAY)
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
            yield from _mic_events(det)
            return
        if is_path(source) or hasattr(source, "read"):
            from edge.audio import open_wav

            # streamed in 0.1 s chunks (as a mic would be): memory stays bounded at any length
            with open_wav(source, min_samples=1) as wav:
                for chunk in wav.chunks(CHUNK):
                    yield from det.push(chunk)
        else:
            chunks = source
            if isinstance(source, np.ndarray):
                chunks = (source[i:i + CHUNK] for i in range(0, len(source), CHUNK))
            for chunk in chunks:
                yield from det.push(np.asarray(chunk))
        yield from det.flush()
    finally:
        if replay is not None:
            replay.flush()  # batched writes


def _mic_events(det):
    import shutil
    import subprocess

    import numpy as np

    if shutil.which("arecord") is None:
        raise EdgelearnError("--mic needs `arecord` (ALSA utils), which is not installed",
                             fix="apt install alsa-utils, or pass --wav FILE")
    proc = subprocess.Popen(["arecord", "-q", "-f", "S16_LE", "-r", "16000", "-c", "1", "-t", "raw"],
                            stdout=subprocess.PIPE)
    try:
        while chunk := proc.stdout.read(3200):
            yield from det.push(np.frombuffer(chunk[: len(chunk) // 2 * 2], "<i2"))
    finally:
        proc.terminate()
