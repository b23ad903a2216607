"""A Device's enrolled keywords: enrolling one (``Device.enroll``; its clips kept on the device,
``ST/enrolment/<slug>.npz``, ``_slug``: what its enrolment was given, so that enrolling it again gives
the same entry: ``edge.keywords_rebuild``), its sensitivity, and carrying the keywords and the
adapted contexts to a newer version of the model (``Device.carry_to``: as they are, or enrolled
again from the kept clips when the encoder changed; ``unbind_adapted`` when the version is refused
after all). Enrolling every keyword again when ``keywords.json`` is damaged: edge/keywords_rebuild.py.

Split from device.py to keep each file about one thing; ``Device`` inherits ``Enrolment``, and
``edge.device`` imports the constants and the helpers from here.

    >>> dev.enroll("hey edge", ["a.wav", "b.wav", "c.wav"])["threshold"]
    >>> dev.carry_to(new_bundle)   # {"keywords": 1, "contexts": 0, "rederived": [], "voices_dropped": []}
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from edge.device_data import is_path
from edge.errors import EdgelearnError

# what enrolled keywords and adapted tails are learned with (partition names and files of the bundle)
ENROLMENT_FILES = ("encoder", "encoder-onnx", "encoder-fp32", "phones", "negatives.npy")
ENROLMENT_DIR = "enrolment"  # the clips each keyword was enrolled from (Device.enroll), for carry_to
SETTINGS_FILE = "settings.json"  # in ENROLMENT_DIR: what keywords.json alone holds, for rebuild_keywords


def _slug(name: str) -> str:
    """A keyword's file name: its letters and digits, '_' for anything else, and a digest of the name
    (two names never share a file)."""
    import hashlib
    import re

    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:32] + "-" + \
        hashlib.sha1(name.encode()).hexdigest()[:8]


def _refuse_repeated(clips) -> None:
    """One sentence when a WAV file is given twice (the same file by any path: a typo, and it would
    count twice towards the clips a keyword needs)."""
    seen = {}
    for c in clips:
        if not is_path(c):
            continue
        try:
            st = os.stat(c)
            key = (st.st_dev, st.st_ino)  # hard links and other spellings of one file
        except OSError:
            key = os.path.realpath(c)  # missing: read_wav says so next
        if key in seen:
            which = f"{c} is given twice" if str(seen[key]) == str(c) else f"{seen[key]} and {c} are the same file"
            raise EdgelearnError(f"{which}, and each enrolment clip must be a recording of its own",
                                 fix="pass each WAV file once (record the phrase again for more clips)")
        seen[key] = c


CLIPS_FIX = "pass a list of 3-10 clips: WAV paths, or 16 kHz mono int16 (or float in [-1, 1]) sample arrays"


def _clip_list(clips) -> list:
    """``clips`` as a list of WAV paths and sample arrays (one path or 1-D array: a list of one, said as
    "1 enrolment clip given"); anything else is one sentence saying what clips may be ([] was a numpy
    ValueError, b"..." "3200 enrolment clips given", [None] * 3 "1 samples is too short")."""
    import numpy as np

    from edge.enroll import MAX_CLIPS, MIN_CLIPS
    from edge.options import refuse_channels

    if is_path(clips) or isinstance(clips, np.ndarray) and clips.ndim == 1:
        return [clips]
    if isinstance(clips, np.ndarray):
        refuse_channels(clips, "an enrolment clip")  # one stereo clip, not 2-sample clips
    if not isinstance(clips, (list, tuple, np.ndarray)):
        raise EdgelearnError(f"enrolment clips cannot be {type(clips).__name__} {str(clips)[:40]!r}", fix=CLIPS_FIX)
    clips = list(clips)
    bad = next((i for i, c in enumerate(clips) if not (is_path(c) or isinstance(c, (np.ndarray, list, tuple)))), None)
    if bad is not None:
        raise EdgelearnError(f"enrolment clip {bad + 1} is {type(clips[bad]).__name__} {str(clips[bad])[:40]!r}, "
                             "not a WAV path or samples", fix=CLIPS_FIX)
    if not clips:  # a count above MAX_CLIPS is edge.enroll's sentence (it counts each speaker's)
        raise EdgelearnError(f"no enrolment clips given, need {MIN_CLIPS}-{MAX_CLIPS}", fix=CLIPS_FIX)
    return clips


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


HOLD_CARRY_ENV = "EDGELEARN_CARRY_HOLD"  # test-only: Device.carry_to stops between its two writes


def _bind_pointer(store, bundle) -> None:
    """Rewrite the adapt pointer of ``store`` (atomically) as trained on ``bundle``."""
    import json

    from edge.atomic import atomic_write

    atomic_write(store.meta_path, json.dumps({**store.meta, "model": [bundle.model_id, bundle.version]},
                                             indent=1).encode())


class Enrolment:
    """Mixin: needs ``bundle``, ``_bundle``, ``state_dir``, ``backend``, ``enrolled`` and
    ``keyword_model`` from ``Device``."""

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
        from edge.audio import read_wav, to_int16
        from edge.enroll import enroll
        from edge.keywords import shown
        from edge.options import check_keyword_name, samples

        import numpy as np

        from edge.atomic import atomic_write, npz_bytes

        check_keyword_name(name)  # None, 5, b"..": one sentence, not an AttributeError from .strip()
        clips = _clip_list(clips)  # before the state or the model is read
        state = self.enrolled()
        _refuse_repeated(clips)
        names = [str(c) if is_path(c) else f"clip {i + 1}" for i, c in enumerate(clips)]
        # float clips in [-1, 1] (soundfile's default) as detect reads them (edge.options.samples), then
        # int16 (edge.audio.to_int16, as write_wav stores them): cast as they were, they were all silence
        pcm = [read_wav(c, min_samples=1) if is_path(c) else to_int16(samples(c, n)) for c, n in zip(clips, names)]
        speakers = [0] * len(pcm)
        if add:
            norm = name.strip().lower()
            entry = next((k for k in state.keywords if k["name"] == norm), None)
            if entry is None:
                raise EdgelearnError(f"--add needs an enrolled keyword; {shown(norm)} is not one",
                                     fix="enrol it first without --add")
            kept = self.enrolment_clips(norm, speakers=True)
            kept_file = self.state_dir / ENROLMENT_DIR / f"{_slug(norm)}.npz"
            if kept is None and (kept_file.exists() or kept_file.is_symlink()):  # there, but not readable
                raise EdgelearnError(f"the device's kept clips of {shown(norm)} are damaged ({kept_file} cannot "
                                     "be read)", fix="enrol it again with --replace, then --add the other speaker")
            if kept is None:
                raise EdgelearnError(f"the device kept no clips of {shown(norm)} (enrolled before it kept them)",
                                     fix="enrol it again with --replace, then --add the other speaker")
            new = max(kept[1]) + 1
            names = [f"kept clip {i + 1} (speaker {w + 1})" for i, w in enumerate(kept[1])] + names
            pcm, speakers = kept[0] + pcm, kept[1] + [new] * len(pcm)
            sensitivity = sensitivity or entry.get("sensitivity", "medium")
        before = {k["name"]: k for k in state.keywords}
        rep = enroll(self.keyword_model(), state, name, pcm, clip_names=names, replace=replace or add,
                     sensitivity=sensitivity or "medium", speakers=speakers, save=False)
        self._keep_voices(state, before.get(rep["keyword"]), rep)
        # kept on the device (never uploaded) so that a version with a new encoder can enrol it again;
        # written before the keyword (a kill between leaves clips the keyword is re-derived from), under
        # the state lock once the merge with what another command saved meanwhile is known to succeed.
        # With them, what else the enrolment was given (its name, level, clip names and the other
        # keywords' prototypes it was trained against: enroll's negatives beside the bank), so that
        # rebuild_keywords enrols it again to the same entry.
        path = self.state_dir / ENROLMENT_DIR / f"{_slug(rep['keyword'])}.npz"
        negatives = [k["prototype"] for k in state.keywords if k["name"] != rep["keyword"] and "prototype" in k]

        def keep_clips():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, npz_bytes({
                **{f"clip_{i}": np.asarray(c, np.int16) for i, c in enumerate(pcm)},
                "speakers": np.asarray(speakers, np.int64), "name": np.asarray(rep["keyword"]),
                "sensitivity": np.asarray(rep["sensitivity"]), "wav_names": np.asarray([str(n) for n in names]),
                "negatives": (np.asarray(negatives, np.float32).reshape(len(negatives), -1) if negatives
                              else np.zeros((0, 0), np.float32)),
                "enrolled_ns": np.asarray(time.time_ns(), np.int64)}))

        # --replace: this enrolment wins over one another command saved meanwhile; without it (and with
        # --add, whose kept clips another command may have changed) such a keyword is refused
        state.save(prefer="ours" if replace and not add else "raise", before_write=keep_clips)
        return rep

    def _keep_voices(self, state, old, rep) -> None:
        """A keyword taught other voices (``edgelearn export voices``) and enrolled again keeps them
        (``edge.custom_voices.carried``); ``rep`` then shows its new thresholds and ``other_voices``
        (True, or why the path was dropped)."""
        if not old or "voices" not in old:
            return
        from edge.custom_voices import carried
        from edge.enroll import negative_bank, sensitivity_table

        entry, why = carried(old, state.keywords[-1], negative_bank(self.bundle), self.state_dir)
        state.keywords[-1] = entry
        if why is not None:
            rep["other_voices"] = (f"dropped: {why}; run `edgelearn export voices --state {self.state_dir} "
                                   f"--keyword {rep['keyword']!r}` again")
            return
        rep.update(threshold=round(entry["threshold"], 4), bank_false_accept_rate=entry["bank_false_accept_rate"],
                   sensitivities=sensitivity_table(entry), other_voices=True)

    def sensitivity(self, name: str, level: str | None = None, max_fa_h: float | None = None) -> dict:
        """Enrolled keyword ``name``'s sensitivity; with ``level`` (low: fewest false accepts,
        medium, high: fewest misses), detect it at that level from now on (every level's thresholds
        were set at enrolment). Returns {"keyword", "sensitivity", "sensitivities": {level:
        {"threshold", "bank_false_accept_rate"[, "fa_per_hour"]}}}. ``max_fa_h``: instead of a level,
        the most sensitive one ``calibrate`` measured at or under this many false accepts per hour."""
        from edge.enroll import keyword_sensitivity
        from edge.options import check, check_keyword_name

        check_keyword_name(name)
        check("max_fa_h", max_fa_h)  # a finite rate above 0, as detect's sensitivity (edge.options)
        return keyword_sensitivity(self.enrolled(), name, level, max_fa_h)

    def enrolment_clips(self, name: str, speakers: bool = False):
        """The clips keyword ``name`` was enrolled from, as the device kept them (``ENROLMENT_DIR``),
        or None (enrolled before clips were kept, or removed); with ``speakers``, (clips, one
        speaker id per clip)."""
        from edge.keywords_rebuild import read_kept

        kept = read_kept(self.state_dir / ENROLMENT_DIR / f"{_slug(name)}.npz")
        if kept is None:
            return None
        return (kept["clips"], kept["speakers"]) if speakers else kept["clips"]

    # -- carry to a new version ------------------------------------------------------------------
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
        what changed. Returns {"keywords": n, "contexts": n, "rederived": [names enrolled again],
        "voices_dropped": [names]}: a keyword taught other voices (``edgelearn export voices``) keeps
        them when enrolled again on a new negative bank or phone model (``_carry_voices``), and loses
        them on a new encoder (its voices head scored the old encoder's embeddings); ``export voices``
        teaches it again.

        Two files move, each atomically: the adapt pointer first, the keywords last (the agent takes
        keywords bound to ``new`` as "carried", ``Agent._open_device``). A process killed between
        the two leaves the pointer on ``new`` and the keywords on the old version; the next call
        (the agent checks the installed version again on restart) finds the pointer already moved,
        takes it as carried (its basis was checked before it was written) and finishes; a version
        refused after all gets the pointer back with ``unbind_adapted``."""
        import json
        import sys

        from edge.adapt.store import AdaptStore

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
        keywords, rederived, dropped = state.keywords, [], []
        if state.keywords and _basis(old, ENROLMENT_FILES) != _basis(new, ENROLMENT_FILES):
            missing = [k["name"] for k in state.keywords if self.enrolment_clips(k["name"]) is None]
            if missing:
                changed.append(f"the encoder (no kept enrolment clips for {', '.join(missing)})")
            elif not changed:
                keywords, rederived = self._rederive(new, [k["name"] for k in state.keywords]), \
                    [k["name"] for k in state.keywords]
                dropped = self._carry_voices(state.keywords, keywords, old, new)
        if changed:
            raise EdgelearnError(f"{new.model_id} v{new.version} changes {', '.join(sorted(set(changed)))}, which this "
                                 "device's keywords or adapted tail were learned with",
                                 fix="stay on the running version, or enrol and adapt again for the new one")
        if store.meta_path.exists() and not moved:
            _bind_pointer(store, new)
        if HOLD_CARRY_ENV in os.environ:  # test-only: tests/test_device_carry.py kills the process here
            Path(os.environ[HOLD_CARRY_ENV]).write_text("held")
            time.sleep(3600)
        if keywords:  # refused if another command changed the keywords since they were read
            state.rebound(new, keywords).save()
        self._bundle = new
        if dropped:
            print(json.dumps({"warning": f"enrolled again for {new.model_id} v{new.version}, {', '.join(dropped)} no "
                              "longer hear other voices (a new encoder, or their phrase models are gone): run "
                              f"`edgelearn export voices --state {self.state_dir} --keyword NAME` again"}),
                  file=sys.stderr, flush=True)
        return {"keywords": len(keywords), "contexts": len(store.meta["contexts"]), "rederived": rederived,
                "voices_dropped": dropped}

    def _carry_voices(self, before: list[dict], after: list[dict], old, new) -> list[str]:
        """Keywords enrolled again on ``new`` (``after``, in place) keep the other-voices path they had
        (``before``) when ``new``'s encoder is ``old``'s (a new negative bank or phone model: every
        head's threshold is recomputed on the new bank, ``edge.custom_voices.carried``); the names of
        those that lose it."""
        from edge.custom_voices import carried
        from edge.enroll import negative_bank

        had = {k["name"]: k for k in before if "voices" in k}
        if not had:
            return []
        encoder = ("encoder", "encoder-onnx", "encoder-fp32")
        if _basis(old, encoder) != _basis(new, encoder):
            return [k["name"] for k in after if k["name"] in had]
        bank, dropped = negative_bank(new), []
        for i, k in enumerate(after):
            if k["name"] in had:
                after[i], why = carried(had[k["name"]], k, bank, self.state_dir)
                if why is not None:
                    dropped.append(k["name"])
        return dropped

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
