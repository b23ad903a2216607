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
Detection (``detect``, ``detector``) is ``edge.device_detect``, and the enrolled keywords (``enroll``,
``sensitivity``, ``carry_to``) ``edge.device_enrolment``: ``Device`` inherits their mixins, and their
names are importable from here too.
"""

from __future__ import annotations

from pathlib import Path

from edge.device_data import ambient_of, load_labelled
# detection and the enrolled keywords have modules of their own; every name stays importable from here
from edge.device_detect import CHUNK, Detection, _events, _mic_events, _replay_feeder  # noqa: F401
from edge.device_enrolment import (  # noqa: F401 (those not used here: re-exported)
    ADAPT_FILES, ENROLMENT_DIR, ENROLMENT_FILES, HOLD_CARRY_ENV, Enrolment, _basis, _bind_pointer, _slug)
# which model detection runs has a module of its own; every name stays importable from here
from edge.device_models import (  # noqa: F401 (those not called here: re-exported)
    base_models, calibrated_for, detection_info, detection_models, embedding_dim, head_params, is_federated,
    open_bundle, verifier_status, version_thresholds)
from edge.errors import EdgelearnError

DEFAULT_CONTEXT = "default"


def check_distill(distill: float) -> float:
    """``distill`` if it is a weight in 0..1 (``edge.options``, the rule the CLI parses with)."""
    from edge.options import check

    return check("distill", distill)


class Device(Detection, Enrolment):
    """A device's state directory (``state_dir``: enrolled keywords, adapted contexts, replay
    buffers, scheduler state, operating points) used with one bundle.

    ``bundle``: a loaded ``edge.bundle.Bundle``, or the path of a bundle directory or .zip (verified
    with ``trusted_keys``; None: the device's default keys); None: the federated version the agent
    installed and runs in ``state_dir`` (``edge.device_models.installed_version``), else the shipped model.
    ``backend``: ``litert | onnxruntime | auto``. ``sysfs_root``: where the scheduler reads the
    battery and temperature (``edge.scheduler``); ``idle_s``: a function giving seconds since the
    user was last active (None: treated as idle, as ``edgelearn device adapt`` does).

    An operation is a method that opens what it needs from the state directory and the bundle, so
    a new one (the federated round of ``edge.fl_client``) is one more method beside ``adapt``."""

    def __init__(self, state_dir, bundle=None, *, backend: str = "auto", trusted_keys=None,
                 sysfs_root="/", idle_s=None):
        from edge.options import check_device

        check_device(state_dir, bundle)  # wrong types named here, not a pathlib TypeError later
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
        """The verified bundle (loaded and checked on first use). None given: the federated version
        the agent installed and runs in the state directory, else the shipped model (``open_bundle``)."""
        if self._bundle is None:
            self._bundle = open_bundle(self._bundle_src, self._trusted_keys, state_dir=self.state_dir)
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

        return DeviceState.open(self.state_dir, self.bundle, self.backend)

    def models(self):
        """(model, head) that detection runs now: see ``detection_models``."""
        return detection_models(self.bundle, self.state_dir, self.backend)

    def calibrated_for(self) -> dict:
        return calibrated_for(self.bundle, self.state_dir)

    def keyword_model(self):
        from edge.kws import KeywordModel

        return KeywordModel(self.bundle, backend=self.backend)

    # -- adapt -----------------------------------------------------------------------------------
    def adapt(self, data, *, recipe: str | None = None, strategy: str | None = None, optimizer: str | None = None,
              steps: int | None = None, rank: int = 4, memory_budget: int = 256 * 1024, replay_bytes: int = 1 << 20,
              distill: float = 0.5, context: str = DEFAULT_CONTEXT, dw4: str = "auto", ambient=None,
              augment: int | None = None, balance: bool | None = None, negative_share: float | None = None,
              negative_distill: float | None = None, verify: bool | None = None, noisy_ambient: bool | None = None,
              lr: float | None = None, seed: int = 0, force: bool = False, keep_versions: int | None = None) -> dict:
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
        run (``"status": "paused"``: the next call resumes it); when it allows fewer steps than asked, the
        result says so (``steps_asked``, ``scheduler``: how many of how many, and its reason). A run whose
        loss diverges commits nothing (``"status": "diverged"``, ``edge.adapt.run.diverged``). Numeric
        options out of range (``lr`` <= 0, ``steps`` or ``rank`` < 1, ...: ``edge.options``) are
        one EdgelearnError before anything is read. ``dw4``: train the tail's depthwise
        layer too (``auto``: frozen for bias-only). ``distill``: weight of the bundle's own outputs
        in the replay examples' targets. ``keep_versions``: how many of the context's newest versions the
        commit leaves besides its current and previous ones (None: ``edge.adapt.prune.KEEP_VERSIONS``,
        10; older ones are pruned). Returns the run's result (status, steps, version, losses)
        with the recipe, strategy, trained tensors, bytes one step holds, examples (``n``) and the
        commands given a second stage (``verified``)."""
        import numpy as np

        from edge.adapt import Backbone, ConvTail, ConvTrainer, load_tail
        from edge.adapt.convtrain import choose_sparse
        from edge.adapt.delta import trained_on
        from edge.adapt.fcache import cached_features
        from edge.options import check_adapt
        from edge.adapt.recipe import resolve, train_options, training_windows
        from edge.adapt.run import train
        from edge.replay import TAIL_REPLAY, ReplayStore

        from edge.options import check_adapt_input

        check_adapt_input(data, context)  # a wrong type: one sentence, not pathlib's or "unhashable"
        # every numeric option in its range before anything is read or written (edge.options)
        check_adapt(steps=steps, rank=rank, memory_budget=memory_budget, replay_bytes=replay_bytes, distill=distill,
                    augment=augment, negative_share=negative_share, negative_distill=negative_distill, lr=lr,
                    seed=seed, keep_versions=keep_versions)
        r = resolve(recipe, strategy=strategy, optimizer=optimizer, steps=steps, augment=augment, balance=balance,
                    negative_share=negative_share, negative_distill=negative_distill, verify=verify,
                    noisy_ambient=noisy_ambient)
        bundle = self.bundle
        sched = self.scheduler()
        store = self.recover(sched)
        if keep_versions is not None:
            store.keep = keep_versions
        km = self.keyword_model()
        windows, y = load_labelled(km, data)
        amb = ambient_of(ambient)
        steps = asked = r["steps"]
        cut = None  # the scheduler's reason, when it allows fewer steps than asked
        if not force:
            d = sched.decide()
            if d.action != "train":
                return {"status": "deferred", "reason": d.reason}
            steps = min(steps, d.steps)
            cut = d.reason if steps < asked else None
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
        spent = res.pop("charge", None)  # a diverged run commits nothing: its energy is charged here
        if spent:
            sched.charge(spent["seq"], spent["steps"])
        store.recover(sched.charge)  # the run's energy, charged once (its record sits beside the result)
        if cut is not None:
            res["steps_asked"] = asked
            res["scheduler"] = f"the scheduler allowed {steps} of the {asked} steps asked: {cut}"
        return {**res, "recipe": r["recipe"], "strategy": r["strategy"], "tensors": tr.names,
                "step_bytes": tr.step_bytes(), "n": int(len(x)), "verified": sorted(entries or {})}

    def rollback(self, context: str = DEFAULT_CONTEXT) -> int | None:
        """Make ``context``'s previous version current again; returns it (None: the base model)."""
        from edge.options import check_context  # [1]: one sentence, not "unhashable type"
        return self.recover().rollback(check_context(context))

    def use(self, context: str | None) -> str | None:
        """Switch the active adapted context (None: the base model); returns the active one."""
        from edge.options import check_context
        store = self.recover()
        store.use(check_context(context, none_ok=True))
        return store.meta["active"]

    # -- calibrate -------------------------------------------------------------------------------
    def calibrate(self, wavs, targets=None) -> dict:
        """Per-keyword base thresholds for at most each of ``targets`` false accepts per hour (None:
        ``edge.operating.TARGETS``), measured on ``wavs``: WAVs of everyday audio of the place that
        say none of the base keywords (an hour or more; under ``edge.operating.MIN_SECONDS``, audio with
        no speech-like sound at all (``SoundMeter``), or targets that are not finite rates above 0, an
        EdgelearnError and nothing written). Saved under the state
        lock as the state's operating points for
        the active model and context (``detect(sensitivity=R)`` uses them); returns the table
        ({"for", "hours", "files", "points": [{"target_fa_h", "thresholds", ...}]}). Where detection
        runs the phrase second stage by default (``edge.device_detect.default_stage``), each point
        also holds the stage's cutoffs for its rate (``"phrase"``, ``edge.phrase_calibrate``), so a
        sensitivity keeps both stages; the thresholds are the first stage's alone (``--no-phrase``)."""
        from edge import phrase_calibrate as PC
        from edge.audio import open_wav
        from edge.detect import Detector
        from edge.device_detect import _own_encoder, default_stage
        from edge.operating import (TARGETS, SoundMeter, calibrate, check_length, check_targets, held_at_default,
                                    save_points, stream_scores)
        from edge.options import check_paths

        targets = check_targets(TARGETS if targets is None else targets)  # finite, above 0
        # numbers, None, an array: one sentence naming what calibrate takes, not pathlib's TypeError
        wavs = check_paths(wavs, "calibrate takes WAV paths", "pass a WAV path or a list of them")
        bundle = self.bundle
        km, head = self.models()
        det = Detector(km, head=head)
        stage = default_stage(bundle) if _own_encoder(km, head) else None
        both = PC.Collector(lambda rec: Detector(km, head=head, threshold=stage.first_stage, asr=rec), stage)
        streams, hours, meter = [], 0.0, SoundMeter()
        for path in wavs:
            with open_wav(path, min_samples=16000) as w:  # read in pieces: an hour of audio is fine
                chunks = meter.tee(w.chunks(16000 * 60))
                sc, ends, h = stream_scores(det, chunks if stage is None else both.tee(chunks))
            streams.append((sc, ends, None))
            hours += h
        check_length(hours)  # far too little audio: refused, the earlier calibration kept
        meter.check(str(wavs[0]) if len(wavs) == 1 else "the audio given")  # silence, a tone: refused too
        points = [held_at_default(calibrate(streams, hours, t, det.names), det) for t in targets]
        if stage is not None:
            for p, ph in zip(points, PC.device_points(stage, both.streams, hours, targets)):
                p["phrase"] = ph
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
        # merged under the state lock with what other commands saved meanwhile: a keyword enrolled
        # again since is kept as enrolled (these rates were measured on its old entry)
        state.save(prefer="theirs")
        return {k["name"]: counts[k["name"]] for k in state.keywords if k["name"] in counts
                and k.get("fa_per_hour") == counts[k["name"]]}

    # -- status ----------------------------------------------------------------------------------
    def status(self) -> dict:
        """Bundle, enrolled keywords and whether each one's verifier is current, adapted contexts,
        replay buffers, the scheduler's last decision, a federated version's operating point, and
        which model detection runs (``detection_info``). Reads only (but for a damaged ``keywords.json``,
        which any command that opens the keywords rebuilds: ``edge.keywords_rebuild``)."""
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
            try:
                rb = load_replay(self.state_dir / name)
            except EdgelearnError as e:  # reported, not fatal: status is where a user looks first
                replay[name] = {"damaged": e.problem, "fix": e.fix}
                continue
            if rb is not None:
                replay[name] = {"count": rb.count, "capacity": rb.capacity, "bytes": rb.nbytes,
                                "classes": {labels[k] if k < len(labels) else k: n
                                            for k, n in sorted(rb.class_counts().items())}}
        from edge.agent import read_status

        out = {"bundle": f"{bundle.model_id} v{bundle.version}", "keywords": state.names(),
               "verifier": verifier_status(state.keywords, bundle),
               "sensitivity": {k["name"]: k.get("sensitivity", "medium") for k in state.keywords},
               # keywords taught other voices (``edgelearn export voices``): their phrase models' cutoff
               "other_voices": {k["name"]: k["voices"]["cutoff"] for k in state.keywords if "voices" in k},
               "adapt": adapt.meta, "replay": replay,
               "last_schedule": last}
        op = (bundle.manifest.get("extra") or {}).get("operating")
        if op is not None:  # the version's default thresholds, shipped or federated (``version_thresholds``)
            try:
                thr = version_thresholds(bundle)
            except EdgelearnError:
                thr = "malformed"
            out["operating_point"] = {"thresholds": thr, "matched_to_version": op.get("matched_to_version"),
                                      "in_use": thr != "malformed"}
        out["detection"] = detection_info(bundle, self.state_dir)
        from edge.operating import calibration_status

        cal = calibration_status(self.state_dir, bundle)  # a damaged or stale calibration, said here
        if cal is not None:
            out["calibration"] = cal
        agent = read_status(self.state_dir)  # what `device run` did last (edge/agent.py)
        if agent is not None:
            out["agent"] = agent
        if not self.state_dir.is_dir():  # a mistyped --state reads as a fresh device: say so
            out["note"] = (f"{self.state_dir} does not exist: nothing is enrolled, adapted or calibrated there "
                           "yet (check the --state path if you expected a device)")
        return out

