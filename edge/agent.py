"""The device agent: one long-running program (``edgelearn device run``) that closes the loop on a Pi.

It streams audio (the microphone through ``arecord``, a WAV file, or raw 16 kHz mono s16le PCM on
stdin) through the device's detector and, between 0.1 s chunks, keeps the rest of the loop going:

- every detection is one JSON line on stdout and, with ``on_detect``, starts a command (the event
  as JSON on its stdin and in ``EDGELEARN_EVENT``; never waited for, so it cannot stall detection);
- confirmed base-keyword detections feed the tail replay buffer (``Device.detect``'s replay);
- with labelled clips (``data``: ``DIR/<label>/*.wav``), it adapts the conv tail when the
  scheduler allows and there is something new to learn (``Adaptation._nothing_new``), in a child
  process (``edgelearn device adapt`` without ``--force``: the scheduler decides, pauses and resumes
  it; ``nice`` 10; it dies with the agent), so training never holds the detector's interpreter or
  its GIL. While a run is in progress detection does not write the replay buffer (the run commits
  it); when a run commits, detection switches to the adapted model. When a new version is used
  while the active context was adapted against another head, detection hears with the new head at
  once (the context rebased onto it, ``edge.adapt.delta.rebase``) and a run on the new version is
  started at the next tick (``readapt_pending`` in ``agent.json`` until it commits);
- with an aggregator, it checks in on its schedule in a background thread (``edge.fl.FLClient``:
  HMAC-signed check-in; when selected it trains the federated head on its own examples, the
  embedding replay buffer plus its labelled clips, and uploads one compressed, authenticated
  update), and installs each new signed version the aggregator announces, in a task or in a wait
  answer when not picked for a round (verified and smoke
  checked by ``edge.store.BundleStore``). Before detection moves to a new version it runs the
  deep health check (``health_check``: finite posteriors on known inputs, and on the labelled
  clips no worse than the running version); a version that fails is rolled back.

Every switch hands the audio the detector holds to a detector of the new model
(``Detector.continue_from``), so nothing is dropped and no event is reported twice; a keyword
enrolled on the state while the agent runs (``device enroll``) is such a switch, seen every
``STATE_WATCH_S`` of audio (``edge.wyoming_models.state_signature``, the Wyoming server's check). What the agent did (version, rounds joined, bytes uploaded, last
adaptation, last check-in, detections) is ``agent.json`` in the state directory, written
atomically; ``edgelearn device status`` shows it. A kill -9 at any moment leaves every file old or
new (each is written by ``edge.atomic``; adaptation commits in one step, ``Device.recover``
finishes it on restart), and a federated update is never sent twice (the client's sequence number
is stored before an upload). A version the client installed but the agent never checked (a kill
between the two) is checked at the next start before detection uses it, and an upload that arrived
but was not counted is counted when the aggregator says so ("contributed"). After every round,
whatever its outcome, the store's current version is the running one or the one being checked: the
store keeps two, so the running version is never pruned. Tested with three agents and a real
aggregator (tests/test_agent_fleet.py).

The audio sources are ``edge.agent_audio``; a new version's health check, switch and rollback
``edge.agent_versions``; the federated rounds ``edge.agent_federation``; the adaptation run
``edge.agent_adapt``; the detector and ``--sensitivity`` across switches ``edge.agent_calibration``
(``Agent`` inherits their mixins); its options ``edge.agent_config``; the systemd unit ``edge.agent_unit``; whether the agent that wrote
agent.json still runs ``edge.agent_liveness``; one agent per state ``edge.agent_lock``; all importable here.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

# the audio sources, the versions, the federated rounds and the adaptation run have modules of their
# own; every name stays importable from here
from edge.agent_adapt import READAPT_RETRY_S, Adaptation  # noqa: F401
from edge.agent_config import AgentConfig  # noqa: F401 (re-exported: the CLI and agent_unit import it here)
from edge.agent_audio import SAMPLE_RATE, _chunks_of, _until_stopped
from edge.agent_calibration import Calibration
from edge.agent_federation import FL_AUGMENT, HOLD_ENV, Federation, _HeldTransport, check_federation  # noqa: F401
from edge.agent_liveness import boot_id, settle
from edge.agent_lock import hold
from edge.agent_unit import UNIT, service_unit  # noqa: F401
from edge.agent_versions import FL_DIR, HEALTH_TOLERANCE, Versions, health_check  # noqa: F401
from edge.atomic import atomic_write, no_space
from edge.device import CHUNK, Device  # noqa: F401
from edge.errors import EdgelearnError
from edge.wyoming_models import state_signature

AGENT_FILE = "agent.json"
STATE_WATCH_S = 2.0  # seconds of audio between looks at the state files detection was built from
STAGE_COUNTS = ("rejected", "asr_decoded", "asr_audio_s")  # agent.json's second_stage


def _number(v) -> float:
    """A counter read back from agent.json: a non-negative number, else 0 (an older or damaged file)."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else 0


def read_status(state_dir) -> dict | None:
    """The agent's ``agent.json`` (None if the agent never ran here, or the file is unreadable); a
    live state whose process is gone (kill -9, power cut) reads as "ended" (``edge.agent_liveness``)."""
    p = Path(state_dir) / AGENT_FILE
    try:
        data = json.loads(p.read_bytes()[: 1 << 20])
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return settle(data) if isinstance(data, dict) else None


class Agent(Versions, Federation, Adaptation, Calibration):
    """The loop of ``edgelearn device run`` over one state directory; ``run()`` returns when the
    audio ends (a WAV or stdin) or on SIGTERM/SIGINT (``stop()``)."""

    def __init__(self, state_dir, cfg: AgentConfig, bundle=None, *, trusted_keys=None, backend: str = "auto",
                 sysfs_root="/", out=None, clock=time.monotonic):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # one agent per state for its life (edge.agent_lock): a second is refused before it touches the state
        self._unlock = weakref.finalize(self, hold(self.state_dir))
        self.cfg, self.backend, self.sysfs_root = cfg, backend, Path(sysfs_root)
        self.trusted_keys, self.base_bundle = trusted_keys, bundle
        self.out = out or sys.stdout
        self.clock = clock
        self._stop = threading.Event()
        self._restart = False
        self.child = None          # the adaptation run in progress (subprocess.Popen)
        self.fl = None             # edge.fl.FLClient
        self.wyoming = None        # edge.wyoming.WakeServer (cfg.wyoming)
        self._fl_thread = None
        self._fl_results: queue.Queue = queue.Queue()
        self._hooks: list = []
        prev = read_status(self.state_dir) or {}  # counters carried over; anything unreadable starts afresh

        def count(key):
            v = prev.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

        def record(key):
            v = prev.get(key)
            return v if isinstance(v, dict) else None

        rejected = prev.get("rejected")
        checked = prev.get("fl_version")
        stage = record("second_stage") or {}
        last_round = prev.get("last_round", None if prev else 0)
        self.status = {"pid": os.getpid(), "boot_id": boot_id(), "started": time.time(), "audio_s": 0.0,
                       "detections": count("detections"), "rounds_joined": count("rounds_joined"),
                       "bytes_uploaded": count("bytes_uploaded"), "rollbacks": count("rollbacks"),
                       "last_adapt": record("last_adapt"), "last_checkin": record("last_checkin"),
                       "last_health": record("last_health"), "version": None, "state": "starting",
                       # the federated version detection runs (it passed its health check); None: the given bundle
                       "fl_version": checked if isinstance(checked, int) and not isinstance(checked, bool) else None,
                       # the last round whose upload is counted here (None: unknown, an agent.json of before)
                       "last_round": last_round if isinstance(last_round, int) and not isinstance(last_round, bool)
                       else None,
                       "rejected": [v for v in rejected if isinstance(v, int)] if isinstance(rejected, list) else [],
                       # what the second stages dropped: candidates rejected (a custom keyword's verifier,
                       # an adapted command's, or with --asr the recogniser), the recogniser's decodes
                       # and the seconds of audio it decoded; carried over restarts like the counters above
                       "second_stage": {k: _number(stage.get(k)) for k in STAGE_COUNTS}}
        self._det = None
        self._status_unsaved = False  # agent.json could not be written (a full disk): said once
        self._state_sig = None   # state_signature when the detector was built (``_watch_state``)
        self._stage_base = dict(self.status["second_stage"])
        self._check_config()
        self._clips = None
        try:  # an agent that cannot start says so in agent.json (never "running" from a run before)
            self.device, unchecked = self._open_device()
            if unchecked is not None:  # installed, never checked (a kill -9 came between): checked before use
                self._switch_version(unchecked)
            self._model_status()
        except BaseException as e:
            self._ended_by(e)
            try:
                self._write_status()
            finally:
                self._unlock()
            raise
        self._next_adapt = self.clock()  # a re-adaptation a kill -9 interrupted is asked for at once
        self._next_checkin = self.clock()
        self._next_status = self.clock()

    # -- setup -----------------------------------------------------------------------------------
    def _check_config(self) -> None:
        c = self.cfg
        check_federation(c)  # the URL and the key file, before anything starts
        if c.data is not None and not Path(c.data).is_dir():
            raise EdgelearnError(f"--data {c.data} is not a directory", fix="pass DIR with DIR/<label>/*.wav")
        if c.on_detect is not None and not c.on_detect.strip():
            raise EdgelearnError("--on-detect is empty", fix="pass a shell command, e.g. 'logger -t kws'")

    def _model_status(self) -> dict:
        """``status["model"]``: which model detection runs (``edge.device.detection_info``: version,
        adapted context, the version it was adapted on, rebased or not) and ``readapt_pending``:
        the context was adapted against another head and this agent adapts it again on the running
        version (it has ``data`` and adapts)."""
        from edge.device import detection_info

        info = detection_info(self.device.bundle, self.state_dir)
        info["readapt_pending"] = bool(info["rebased"] and self.cfg.data is not None and self.cfg.adapt)
        self.status["model"] = info
        return info

    def labelled_clips(self):
        """(windows, labels) of the labelled clips in ``data``, or None."""
        if self.cfg.data is None:
            return None
        if self._clips is None:
            from edge.device_data import load_labelled

            try:
                self._clips = load_labelled(self.device.keyword_model(), self.cfg.data)
            except EdgelearnError:
                return None
        return self._clips

    # -- the loop --------------------------------------------------------------------------------
    def stop(self, *_):
        self._stop.set()

    # ``_detector`` (built again at every switch; a stale calibration's fallback): edge.agent_calibration

    def run(self) -> dict:
        """Detect until the audio ends or ``stop()``; whatever ends the run, ``agent.json`` says
        ``stopped`` (or ``failed`` with the ``error``: a microphone that fails, a model that does not
        load), and the error is raised on (``edgelearn device run`` exits non-zero)."""
        source = _chunks_of(self.cfg.source, self.cfg.mic_device)
        samples, replay = 0, None
        next_watch = int(STATE_WATCH_S * SAMPLE_RATE)
        try:
            self.status["state"] = "running"
            self._write_status()
            det, replay = self._detector()
            self._det = det
            if self.cfg.wyoming:  # inside: a server that cannot start (port taken, mDNS) ends the run cleanly
                self._serve_wyoming()
            for chunk in _until_stopped(source, self._stop):
                for ev in det.push(chunk):
                    self._emit(ev)
                samples += len(chunk)
                self.status["audio_s"] = samples / SAMPLE_RATE
                if samples >= next_watch:  # a keyword enrolled (or re-enrolled) meanwhile: heard from now
                    next_watch = samples + int(STATE_WATCH_S * SAMPLE_RATE)
                    self._watch_state()
                self._tick()
                if self._stop.is_set():
                    break
                if self._restart:  # a new model (adapted, or a new version) or replay on/off
                    self._restart = False
                    if replay is not None:
                        replay.flush()
                    new, replay = self._detector()
                    for ev in new.continue_from(det):
                        self._emit(ev)
                    self._stage_base = self._stage_counts()  # the old detector's counts, kept
                    det = self._det = new
            for ev in det.flush():
                self._emit(ev)
        except BaseException as e:
            self._ended_by(e)
            raise
        finally:
            try:
                if replay is not None:
                    replay.flush()
                source.close()
                if self.wyoming is not None:
                    self.wyoming.stop()
            finally:
                self._finish()
        return self.status

    def _ended_by(self, e: BaseException) -> None:
        """What ended the agent, for agent.json: Ctrl-C is a stop; anything else a failure (``error``)."""
        if isinstance(e, KeyboardInterrupt):
            self.status["state"] = "stopped"
            return
        self.status["state"] = "failed"
        self.status["error"] = str(e) if isinstance(e, EdgelearnError) else f"{e.__class__.__name__}: {e}"

    def _serve_wyoming(self) -> None:
        """The Wyoming wake-word server (edge/wyoming.py) in this process, on the agent's device: the
        same keywords, thresholds and model versions as the local detector (a switched version is
        used from the next stream a client starts)."""
        from edge.wyoming import WakeServer

        self.wyoming = WakeServer(self.device, self.cfg.wyoming, keywords=self.cfg.keywords,
                                  threshold=self.cfg.threshold, sensitivity=self.cfg.sensitivity,
                                  zeroconf=self.cfg.zeroconf, asr=self.cfg.asr).start()
        self.status["wyoming"] = self.wyoming.uri
        if self.wyoming.zeroconf is not None:
            self.status["zeroconf"] = self.wyoming.zeroconf.service

    def _emit(self, ev: dict) -> None:
        self.status["detections"] += 1
        line = json.dumps(ev)
        print(line, file=self.out, flush=True)
        if self.cfg.on_detect:
            env = {**os.environ, **self.cfg.extra_env, "EDGELEARN_EVENT": line,
                   "EDGELEARN_KEYWORD": str(ev["keyword"]), "EDGELEARN_SCORE": str(ev["score"]),
                   "EDGELEARN_TIME_S": str(ev["time_s"])}
            try:
                p = subprocess.Popen(self.cfg.on_detect, shell=True, stdin=subprocess.PIPE, env=env,
                                     stdout=subprocess.DEVNULL)
                p.stdin.write(line.encode() + b"\n")
                p.stdin.close()
                self._hooks.append(p)
            except OSError as e:
                print(json.dumps({"warning": f"--on-detect could not start: {e}"}), file=sys.stderr, flush=True)
        self._hooks = [p for p in self._hooks if p.poll() is None]  # reap finished hooks

    # -- between chunks --------------------------------------------------------------------------
    def _watch_state(self) -> None:
        """Restart detection (losslessly, ``Detector.continue_from``) when the state files it was built
        from changed: ``edgelearn device enroll`` on this state while the agent runs, a sensitivity
        set, a calibration. The Wyoming server's check (``state_signature``): a few ``stat`` calls."""
        if state_signature(self.device) != self._state_sig:
            self._restart = True

    def _tick(self) -> None:
        now = self.clock()
        self._poll_adapt(now)
        self._poll_federation(now)
        if now >= self._next_status:
            self._next_status = now + self.cfg.status_every_s
            self._write_status()

    # -- the way out -----------------------------------------------------------------------------
    def _stage_counts(self) -> dict:
        """The second stages' counters: those of the detectors before this one plus this one's."""
        det, out = self._det, dict(self._stage_base)
        if det is not None:
            out["rejected"] += det.rejected
            if det.asr is not None:
                out["asr_decoded"] += det.asr.decoded
                out["asr_audio_s"] = round(out["asr_audio_s"] + det.asr.seconds, 3)
        return out

    def _write_status(self) -> None:
        self.status["second_stage"] = self._stage_counts()
        st = {**self.status, "updated": time.time(), "adapting": self.child is not None}
        if self.wyoming is not None:  # Home Assistant's side: clients served, detections sent, model sets
            st["wyoming_stats"] = self.wyoming.stats()
        try:
            atomic_write(self.state_dir / AGENT_FILE, json.dumps(st, indent=1).encode())
        except OSError as e:  # a full disk must not stop the wake word: said once, tried again each time
            if not no_space(e):
                raise
            if not self._status_unsaved:
                print(f"device run: cannot save {AGENT_FILE} (no space left on the disk); detection goes on",
                      file=sys.stderr, flush=True)
            self._status_unsaved = True
        else:
            self._status_unsaved = False

    def _finish(self) -> None:
        """The way out: the adaptation run stopped, the federated round in flight waited for and
        counted (on record before the version it installed is checked), the hooks waited for; then,
        whatever happened on the way (a second Ctrl-C included), agent.json's final state."""
        try:
            if self.child is not None:  # an interrupted run resumes (or is undone) on the next start
                self.child.terminate()
                try:
                    self.child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.child.kill()
            if self._fl_thread is not None:
                self._fl_thread.join(timeout=30)
                while not self._fl_results.empty():
                    self._after_round(*self._fl_results.get_nowait())
            for p in self._hooks:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            self.child = None
            if self.status["state"] != "failed":
                self.status["state"] = "stopped"
            try:
                self._write_status()
            finally:
                self._unlock()  # the state is free for the next agent

