"""The device agent: one long-running program (``edgelearn device run``) that closes the loop on a Pi.

It streams audio (the microphone through ``arecord``, a WAV file, or raw 16 kHz mono s16le PCM on
stdin) through the device's detector and, between 0.1 s chunks, keeps the rest of the loop going:

- every detection is one JSON line on stdout and, with ``on_detect``, starts a command (the event
  as JSON on its stdin and in ``EDGELEARN_EVENT``; never waited for, so it cannot stall detection);
- confirmed base-keyword detections feed the tail replay buffer (``Device.detect``'s replay);
- with labelled clips (``data``: ``DIR/<label>/*.wav``), it adapts the conv tail when the
  scheduler allows, in a child process (``edgelearn device adapt`` without ``--force``: the
  scheduler decides, pauses and resumes it; ``nice`` 10), so training never holds the detector's
  interpreter or its GIL. While a run is in progress detection does not write the replay buffer
  (the run commits it); when a run commits, detection switches to the adapted model. When a new
  version is used while the active context was adapted against another head, detection hears with
  the new head at once (the context rebased onto it, ``edge.adapt.delta.rebase``) and a run on the
  new version is started at the next tick (``readapt_pending`` in ``agent.json`` until it commits);
- with an aggregator, it checks in on its schedule in a background thread (``edge.fl.FLClient``:
  HMAC-signed check-in; when selected it trains the federated head on its own examples, the
  embedding replay buffer plus its labelled clips, and uploads one compressed, authenticated
  update), and installs each new signed version the aggregator announces (verified and smoke
  checked by ``edge.store.BundleStore``). Before detection moves to a new version it runs the
  deep health check (``health_check``: finite posteriors on known inputs, and on the labelled
  clips no worse than the running version); a version that fails is rolled back.

Every switch hands the audio the detector holds to a detector of the new model
(``Detector.continue_from``), so nothing is dropped and no event is reported twice. What the agent did (version, rounds joined, bytes uploaded, last
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
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from edge.atomic import atomic_write
from edge.device import CHUNK, Device
from edge.errors import EdgelearnError

AGENT_FILE = "agent.json"
FL_DIR = "fl"
# copies of each labelled command clip in a federated round (bench/fl_voices: augment=8). The trainer
# stays FLClient's default (the whole head): the shipped-head task's keep_absent trainer
# (edge.fl.model.shipped_head_trainer) leaves the outputs of labels no device hears as a published
# version had them, so a broken version is never repaired there (tests/test_agent_fleet.py's v5)
FL_AUGMENT = 8
SAMPLE_RATE = 16000
HEALTH_TOLERANCE = 0.05  # a new version may name at most this fraction fewer labelled clips right
STAGE_COUNTS = ("rejected", "asr_decoded", "asr_audio_s")  # agent.json's second_stage
HOLD_ENV = "EDGELEARN_AGENT_HOLD"  # test-only: stop the federated thread at a named point (_HeldTransport)
# while the active context was adapted against an older head (a new version arrived), a run the
# scheduler deferred or paused is asked for again this soon (else every adapt_every_s)
READAPT_RETRY_S = 300.0

UNIT = """[Unit]
Description=edgelearn device agent (keyword detection, on-device adaptation, federated rounds)
After=network-online.target sound.target
Wants=network-online.target

[Service]
ExecStart={exe} device run --state {state} --mic{extra}
Restart=on-failure
RestartSec=5
Nice=0
# logs go to the journal: `journalctl -u edgelearn-agent`
StandardOutput=journal
StandardError=journal

[Install]
WantedBy=multi-user.target
"""


@dataclass
class AgentConfig:
    """What ``edgelearn device run`` was asked to do (one field per option)."""
    source: object = "mic"         # "mic", "stdin", "none" (no local audio: --wyoming alone), a WAV path,
                                   # or (Python) an iterable of int16 chunks
    on_detect: str | None = None   # a shell command run for every detection
    keywords: object = None        # base keywords to report (None: the bundle's commands; "all")
    threshold: object = None
    sensitivity: float | None = None
    confirm: float = 0.9
    asr: bool = False              # PocketSphinx confirms base-keyword detections (edge/confirm.py)
    data: Path | None = None       # labelled clips DIR/<label>/*.wav: adaptation, federated examples, health check
    strategy: str = "bias-only"
    adapt_every_s: float = 3600.0  # how often to ask the scheduler for an adaptation run
    adapt: bool = True             # False: never adapt locally (detect, and federate with --data's clips)
    aggregator: str | None = None  # http://host:port
    device_id: str | None = None
    device_key: Path | None = None
    checkin_every_s: float = 600.0
    status_every_s: float = 10.0
    network: str = "wifi"
    extra_env: dict = field(default_factory=dict)
    wyoming: str | None = None     # also serve the keywords to Home Assistant here (tcp://HOST:PORT)
    zeroconf: object = False       # announce that server on mDNS: True (default name) or a name


def _number(v) -> float:
    """A counter read back from agent.json: a non-negative number, else 0 (an older or damaged file)."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else 0


def read_status(state_dir) -> dict | None:
    """The agent's ``agent.json`` (None if the agent never ran here, or the file is unreadable)."""
    p = Path(state_dir) / AGENT_FILE
    try:
        data = json.loads(p.read_bytes()[: 1 << 20])
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def service_unit(state_dir, cfg: AgentConfig, exe: str | None = None) -> str:
    """A systemd unit that runs the agent from the microphone and restarts it on failure."""
    extra = ""
    if cfg.data:
        extra += f" --data {Path(cfg.data).resolve()}"
    if cfg.aggregator:
        extra += f" --aggregator {cfg.aggregator} --device-id {cfg.device_id} --device-key {Path(cfg.device_key).resolve()}"
    if cfg.wyoming:
        extra += f" --wyoming {cfg.wyoming}"
        if cfg.zeroconf:
            extra += " --zeroconf" + ("" if cfg.zeroconf is True else f" {shlex.quote(str(cfg.zeroconf))}")
    if not cfg.adapt:
        extra += " --no-adapt"
    if exe is None:
        import shutil

        exe = shutil.which("edgelearn") or f"{sys.executable} -m edge.cli"
    return UNIT.format(exe=exe, state=Path(state_dir).resolve(), extra=extra)


def _chunks_of(source):
    """int16 chunks of CHUNK samples from ``"mic"``, ``"stdin"``, a WAV path, or (from Python) any
    iterable of int16 chunks; closed at the end."""
    import numpy as np

    if not isinstance(source, (str, os.PathLike)):
        for chunk in source:
            yield np.asarray(chunk, np.int16)
        return
    if source == "none":  # no local audio (the Wyoming clients bring theirs): the loop still ticks
        while True:
            time.sleep(CHUNK / SAMPLE_RATE)
            yield np.zeros(0, np.int16)
    if source == "stdin":
        f = sys.stdin.buffer
        rest = b""
        while True:
            b = f.read(2 * CHUNK)
            if not b:
                break
            b = rest + b
            n = len(b) // 2 * 2
            rest = b[n:]
            if n:
                yield np.frombuffer(b[:n], "<i2")
        return
    if source == "mic":
        import shutil

        if shutil.which("arecord") is None:
            raise EdgelearnError("--mic needs `arecord` (ALSA utils), which is not installed",
                                 fix="apt install alsa-utils, or pass --wav FILE or --stdin")
        proc = subprocess.Popen(["arecord", "-q", "-f", "S16_LE", "-r", str(SAMPLE_RATE), "-c", "1", "-t", "raw"],
                                stdout=subprocess.PIPE)
        try:
            while b := proc.stdout.read(2 * CHUNK):
                yield np.frombuffer(b[: len(b) // 2 * 2], "<i2")
        finally:
            proc.terminate()
        return
    from edge.audio import open_wav

    with open_wav(source, min_samples=1) as wav:
        yield from wav.chunks(CHUNK)


def health_check(bundle, clips=None, baseline: float | None = None, backend: str = "auto",
                 state_dir=None, adapted_from=None) -> dict:
    """The deep check a new version passes before detection uses it: its keyword model (with a
    federated version's head, as detection scores) loads, gives
    finite posteriors that sum to 1 on silence, noise and (when given) the device's labelled clips
    ``(windows, labels)``, and names at least ``baseline - HEALTH_TOLERANCE`` of those clips right.
    With ``state_dir``, the model is the one detection runs there: the active adapted context on
    ``bundle`` (``edge.device.detection_models``; ``adapted_from``: the version the contexts are
    bound to now, read as they would run on ``bundle`` once carried, nothing moved).
    Returns {"ok", "accuracy", "reason"}."""
    import numpy as np

    from edge.device import base_models, detection_models

    try:  # what detection scores with (a federated head and an adapted context included)
        km, head = (base_models(bundle, backend) if state_dir is None
                    else detection_models(bundle, state_dir, backend, adapted_from=adapted_from))
        probe = np.stack([np.zeros(SAMPLE_RATE, np.int16),
                          np.random.default_rng(0).integers(-3000, 3000, SAMPLE_RATE).astype(np.int16)])
        windows = probe if clips is None else np.concatenate([probe, clips[0]])
        emb, probs = km.infer(km.features(windows))
        if head is not None:
            probs = head.probs(emb)
    except Exception as e:  # noqa: BLE001 - whatever breaks a model is a failed check, reported in one line
        return {"ok": False, "accuracy": None, "reason": f"the model does not run ({e.__class__.__name__}: {e})"}
    if probs.shape != (len(windows), len(km.labels)) or not np.all(np.isfinite(probs)) \
            or not np.allclose(probs.sum(axis=1), 1.0, atol=0.1):  # int8 softmax: 1/256 a class
        return {"ok": False, "accuracy": None, "reason": "posteriors are not finite probabilities over the labels"}
    if clips is None:
        return {"ok": True, "accuracy": None, "reason": "smoke inputs only (no labelled clips)"}
    acc = float(np.mean(np.argmax(probs[2:], axis=1) == clips[1]))
    if baseline is not None and acc < baseline - HEALTH_TOLERANCE:
        return {"ok": False, "accuracy": acc,
                "reason": f"names {acc:.0%} of the labelled clips right, the running version {baseline:.0%}"}
    return {"ok": True, "accuracy": acc, "reason": "labelled clips"}


class Agent:
    """The loop of ``edgelearn device run`` over one state directory; ``run()`` returns when the
    audio ends (a WAV or stdin) or on SIGTERM/SIGINT (``stop()``)."""

    def __init__(self, state_dir, cfg: AgentConfig, bundle=None, *, trusted_keys=None, backend: str = "auto",
                 sysfs_root="/", out=None, clock=time.monotonic):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
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
        self.status = {"pid": os.getpid(), "started": time.time(), "audio_s": 0.0,
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
        self._stage_base = dict(self.status["second_stage"])
        self._check_config()
        self._clips = None
        self.device, unchecked = self._open_device()
        if unchecked is not None:  # installed, never checked (a kill -9 came between): checked before use
            self._switch_version(unchecked)
        self._model_status()
        self._next_adapt = self.clock()  # a re-adaptation a kill -9 interrupted is asked for at once
        self._next_checkin = self.clock()
        self._next_status = self.clock()

    # -- setup -----------------------------------------------------------------------------------
    def _check_config(self) -> None:
        c = self.cfg
        if c.aggregator and not (c.device_id and c.device_key):
            raise EdgelearnError("--aggregator needs --device-id and --device-key",
                                 fix="pass the id and the key file `edgelearn aggregator provision` wrote")
        if c.data is not None and not Path(c.data).is_dir():
            raise EdgelearnError(f"--data {c.data} is not a directory", fix="pass DIR with DIR/<label>/*.wav")
        if c.on_detect is not None and not c.on_detect.strip():
            raise EdgelearnError("--on-detect is empty", fix="pass a shell command, e.g. 'logger -t kws'")

    def _fl_store(self):
        from edge.store import BundleStore

        return BundleStore(self.state_dir / FL_DIR / "store", self.trusted_keys or self._default_keys())

    def _default_keys(self):
        from edge.kws import default_trusted_keys

        return default_trusted_keys()

    def _open_device(self) -> tuple[Device, int | None]:
        """(the device on the federated version it ran last, else the given or shipped bundle; the
        installed version to health-check before detection uses it, or None).

        The federated client installs a version before the agent checks it, so after a kill -9 the
        store's current version may never have passed the check: it is used only when it is the one
        the agent ran (``fl_version`` in agent.json) or the enrolled keywords were already carried
        to it (the check passed and the switch got that far); otherwise the device opens on the
        version it ran and the new one is checked now. A rejected version is never used."""
        bundle, unchecked = self.base_bundle, None
        if self.cfg.aggregator:
            store = self._fl_store()
            ptr = store.pointer()
            cur, prev = (self._installed(store, ptr[k]) for k in ("current", "previous"))
            rejected, ran = self.status["rejected"], self.status["fl_version"]
            if cur is not None and cur.version not in rejected:
                if cur.version == ran or self._carried_to(cur):
                    bundle, ran = cur, cur.version
                else:
                    unchecked = cur.version
            if bundle is self.base_bundle and prev is not None and prev.version == ran and ran not in rejected:
                bundle = prev
                if cur is not None and cur.version in rejected:  # as _drop_rejected: keep the running one
                    try:
                        store.rollback()
                    except EdgelearnError:
                        pass
            if bundle is self.base_bundle:
                ran = None
            self.status["fl_version"] = ran
        dev = Device(self.state_dir, bundle, backend=self.backend, trusted_keys=self.trusted_keys,
                     sysfs_root=self.sysfs_root)
        self.status["version"] = f"{dev.bundle.model_id} v{dev.bundle.version}"
        return dev, unchecked

    @staticmethod
    def _installed(store, name):
        """The verified bundle ``name`` of the store, or None (none, or damaged: not usable)."""
        if name is None:
            return None
        from edge.bundle import load_bundle

        try:
            return load_bundle(store.bundles_dir / name, trusted_keys=store.trusted_keys)
        except EdgelearnError:
            return None

    def _carried_to(self, bundle) -> bool:
        """Whether the enrolled keywords are bound to ``bundle`` already (``Device.carry_to`` ran)."""
        from edge.enroll import DeviceState

        try:
            return bool(DeviceState.open(self.state_dir, bundle).keywords)
        except EdgelearnError:
            return False

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

    def _detector(self):
        return self.device.detector(keywords=self.cfg.keywords, threshold=self.cfg.threshold,
                                    sensitivity=self.cfg.sensitivity, confirm=self.cfg.confirm,
                                    replay=self.child is None, asr=self.cfg.asr)

    def run(self) -> dict:
        source = _chunks_of(self.cfg.source)
        samples = 0
        self.status["state"] = "running"
        self._write_status()
        det, replay = self._detector()
        self._det = det
        try:
            if self.cfg.wyoming:  # inside: a server that cannot start (port taken, mDNS) ends the run cleanly
                self._serve_wyoming()
            for chunk in source:
                for ev in det.push(chunk):
                    self._emit(ev)
                samples += len(chunk)
                self.status["audio_s"] = samples / SAMPLE_RATE
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
        finally:
            if replay is not None:
                replay.flush()
            source.close()
            if self.wyoming is not None:
                self.wyoming.stop()
            self._finish()
        return self.status

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
    def _tick(self) -> None:
        now = self.clock()
        self._poll_adapt(now)
        self._poll_federation(now)
        if now >= self._next_status:
            self._next_status = now + self.cfg.status_every_s
            self._write_status()

    def _adapt_cmd(self) -> list[str]:
        cmd = [sys.executable, "-m", "edge.cli", "device", "adapt", "--state", str(self.state_dir),
               "--data", str(self.cfg.data), "--strategy", self.cfg.strategy, "--backend", self.backend,
               "--sysfs-root", str(self.sysfs_root)]
        root = getattr(self.device.bundle, "root", None)
        if root is not None and Path(root).is_dir():
            cmd += ["--bundle", str(root)]
        if self.trusted_keys is not None:
            cmd += ["--pubkey", str(self.trusted_keys)]
        return cmd

    def _poll_adapt(self, now: float) -> None:
        if self.child is not None:
            rc = self.child.poll()
            if rc is None:
                return
            out, err = self.child.communicate()
            self.child = None
            try:
                res = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            except ValueError:
                res = {}
            if rc != 0:
                res = {"status": "failed", "reason": (err.strip().splitlines() or ["exit %d" % rc])[-1]}
            self.status["last_adapt"] = {"time": time.time(), **{k: res.get(k) for k in
                                                                 ("status", "reason", "version", "steps", "strategy")}}
            self.status["state"] = "running"
            if self._model_status()["readapt_pending"]:  # deferred, paused or failed: asked again soon
                self._next_adapt = min(self._next_adapt, now + READAPT_RETRY_S)
            self._write_status()
            self._restart = True  # the adapted model (when the run committed), and replay back on
            return
        if self.cfg.data is None or not self.cfg.adapt or now < self._next_adapt:
            return
        self._next_adapt = now + self.cfg.adapt_every_s
        self._restart = True  # detection stops writing the replay buffer while the run owns it
        self.child = subprocess.Popen(self._adapt_cmd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      preexec_fn=lambda: os.nice(10))
        self.status["state"] = "adapting"
        self._write_status()  # an event of note: agent.json says a run is in progress

    def _poll_federation(self, now: float) -> None:
        if not self.cfg.aggregator:
            return
        while True:
            try:
                kind, res = self._fl_results.get_nowait()
            except queue.Empty:
                break
            self._after_round(kind, res)
        busy = self._fl_thread is not None and self._fl_thread.is_alive()
        if busy or now < self._next_checkin:
            return
        self._next_checkin = now + self.cfg.checkin_every_s
        self._fl_thread = threading.Thread(target=self._round, name="edgelearn-fl", daemon=True)
        self._fl_thread.start()

    def _fl_client(self):
        if self.fl is None:
            from edge.fl import FLClient
            from edge.keys import load_hmac_key

            server = self.cfg.aggregator
            hold = os.environ.get(HOLD_ENV)
            if hold:
                from edge.fl.transport import HttpTransport

                server = _HeldTransport(HttpTransport(server), hold)
            self.fl = FLClient(server, self.cfg.device_id, load_hmac_key(self.cfg.device_key),
                               self.state_dir / FL_DIR, trusted_keys=self.trusted_keys or self._default_keys(),
                               data=self._fl_examples)
        return self.fl

    def _fl_examples(self):
        """The device's own examples for a federated round (``edge.fl.local.local_examples``, what
        the fleet simulator's devices train on too): embeddings of its labelled clips (each command
        clip ``FL_AUGMENT`` times), of the confident detections ``Device.detect`` kept in the tail
        replay buffer, and of the embedding replay buffer."""
        from edge.fl.local import local_examples

        return local_examples(self.device, self.labelled_clips(), augment=FL_AUGMENT)

    def _checkin_status(self) -> dict:
        from edge.scheduler import read_sysfs

        r, _ = read_sysfs(self.sysfs_root, time.time())
        st = {"network": self.cfg.network}
        if r.battery_pct is not None:
            st["battery"] = r.battery_pct / 100.0
        elif r.has_battery is False:
            st["battery"] = 1.0
        if r.charging is not None or r.on_mains is not None:
            st["charging"] = bool(r.charging or r.on_mains)
        if r.temp_c is not None:
            st["temperature"] = float(r.temp_c)
        return st

    def _round(self) -> None:
        """One check-in (background thread): train and upload when selected; posts what happened,
        with the version the store holds now (a round that fails after its install still posts it)."""
        c = None
        try:
            c = self._fl_client()
            before = c.bytes_up
            ans = c.run_once(self._checkin_status())
            self._fl_results.put(("ok", {"answer": ans, "bytes": c.bytes_up - before,
                                         "version": c.current_version()}))
        except Exception as e:  # noqa: BLE001 - a failed round never ends the agent; the next check-in retries
            if isinstance(e, EdgelearnError):
                why = str(e)
            elif isinstance(e, OSError):
                why = f"aggregator unreachable ({e.__class__.__name__}: {e})"
            else:
                why = f"the round failed ({e.__class__.__name__}: {e})"
            try:
                version = None if c is None else c.current_version()
            except EdgelearnError:
                version = None
            self._fl_results.put(("error", {"error": why, "version": version}))

    def _after_round(self, kind: str, res: dict) -> None:
        now = time.time()
        if kind == "error":
            self.status["last_checkin"] = {"time": now, "error": res["error"]}
        else:
            ans = res["answer"]
            action = ans.get("action")
            self.status["last_checkin"] = {"time": now, "action": action, "round_id": ans.get("round_id"),
                                           "version": res["version"]}
            rid, last = ans.get("round_id"), self.status["last_round"]
            if action in ("uploaded", "secure"):
                self.status["rounds_joined"] += 1
                self.status["bytes_uploaded"] += int(res["bytes"])
                if isinstance(rid, int):
                    self.status["last_round"] = max(rid, last or 0)
            elif action == "wait" and isinstance(ans.get("contributed"), int) and last is not None \
                    and ans["contributed"] > last:
                # the aggregator has this round's update, but a kill -9 came before it was counted here
                self.status["rounds_joined"] += 1
                self.status["last_round"] = ans["contributed"]
        # whatever the round's outcome, what it installed is checked (or dropped) now: the store keeps
        # only its current and previous versions, so the running one must stay one of them
        installed = res.get("version")
        running = self.device.bundle.version
        if installed is not None and installed != running:
            if installed in self.status["rejected"]:  # re-installed to train a round on it: not used again
                self._drop_rejected(installed)
            else:
                self._switch_version(installed)
        self._write_status()

    def _drop_rejected(self, version: int) -> None:
        """The store's current version is one the health check rejected (the client installs what a
        round trains): make the running version current again, so the next install keeps it."""
        store = self._fl_store()
        ptr = store.pointer()
        b = self.device.bundle
        if ptr["previous"] == f"{b.model_id}-v{b.version}" and ptr["current"] == f"{b.model_id}-v{version}":
            try:
                store.rollback()
            except EdgelearnError:
                pass

    def _switch_version(self, version: int) -> None:
        """A newly installed federated version: deep health check, then detection uses it; rolled
        back when it fails (the running version stays)."""
        store = self._fl_store()
        new = store.current()
        clips = self.labelled_clips()
        # the path detection runs (an adapted context, rebased onto the new head): before 2026-12-03 the
        # two versions' base models were compared, so an adaptation the new version breaks went unseen
        run = self.device.bundle
        base = health_check(run, clips, backend=self.backend, state_dir=self.state_dir)["accuracy"] \
            if clips is not None else None
        h = health_check(new, clips, baseline=base, backend=self.backend, state_dir=self.state_dir, adapted_from=run)
        if h["ok"]:
            # a run in progress trains against the running version, and its commit would bind the adapt
            # pointer back to it: stopped first (its checkpoint is not resumed on another head)
            self._stop_child(f"version {version} arrived")
            try:  # the enrolled keywords and adapted tail move with it, or the version is not used
                self.device.carry_to(new)
            except EdgelearnError as e:
                h = {"ok": False, "accuracy": h["accuracy"], "reason": str(e)}
        self.status["last_health"] = {"time": time.time(), "version": version, **h}
        if not h["ok"]:
            self.device.unbind_adapted(new)  # a carry_to killed half-way may have moved the adapt pointer
            try:
                store.rollback()
            except EdgelearnError:  # the first federated version: the running (shipped) bundle stays
                pass
            self.status["rollbacks"] += 1
            self.status["rejected"] = sorted(set(self.status.get("rejected", [])) | {int(version)})
            print(json.dumps({"warning": f"version {version} failed its health check ({h['reason']}); rolled back"}),
                  file=sys.stderr, flush=True)
            return
        self.device = Device(self.state_dir, new, backend=self.backend, trusted_keys=self.trusted_keys,
                             sysfs_root=self.sysfs_root)
        self._clips = None
        if self.wyoming is not None:
            self.wyoming.device = self.device
        self.status["version"] = f"{new.model_id} v{new.version}"
        self.status["fl_version"] = new.version
        if self._model_status()["readapt_pending"]:  # adapted on another head: again on this one, at once
            self._next_adapt = self.clock()
        self._restart = True

    def _stop_child(self, why: str) -> None:
        """End the adaptation run in progress, if any (SIGTERM; every file it writes is old or new)."""
        if self.child is None:
            return
        self.child.terminate()
        try:
            self.child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.communicate()
        self.child = None
        self.status["state"] = "running"
        self.status["last_adapt"] = {"time": time.time(), "status": "stopped", "reason": why, "version": None,
                                     "steps": None, "strategy": self.cfg.strategy}

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
        atomic_write(self.state_dir / AGENT_FILE, json.dumps(st, indent=1).encode())

    def _finish(self) -> None:
        if self.child is not None:  # an interrupted run resumes (or is undone) on the next start
            self.child.terminate()
            try:
                self.child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.child.kill()
            self.child = None
        if self._fl_thread is not None:
            self._fl_thread.join(timeout=30)
            while not self._fl_results.empty():
                self._after_round(*self._fl_results.get_nowait())
        for p in self._hooks:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.status["state"] = "stopped"
        self._write_status()


class _HeldTransport:
    """Test-only, and off unless ``EDGELEARN_AGENT_HOLD`` is set (tests/test_agent_fleet.py): with
    ``before|after,PATH,N,MARKER`` the federated thread stops at its N-th request to PATH (before the
    request is sent, or after its answer arrived), writes MARKER and waits until the process is
    killed. How a test kills -9 an agent at a named point of a round; detection runs on meanwhile."""

    def __init__(self, inner, spec: str):
        try:
            when, self.path, n, self.marker = spec.split(",", 3)
            self.n = int(n)
        except ValueError:
            raise EdgelearnError(f"{HOLD_ENV}={spec!r} is not before|after,PATH,N,MARKER",
                                 fix=f"unset {HOLD_ENV} (it is for tests)") from None
        if when not in ("before", "after"):
            raise EdgelearnError(f"{HOLD_ENV}={spec!r}: {when!r} is not before or after", fix=f"unset {HOLD_ENV}")
        self.inner, self.when, self.seen = inner, when, 0

    def _hold(self, method, path):
        atomic_write(Path(self.marker), json.dumps({"pid": os.getpid(), "at": f"{self.when} {method} {path}"}).encode())
        threading.Event().wait()

    def request(self, method, path, body=b"", headers=None):
        hit = False
        if path == self.path:
            self.seen += 1
            hit = self.seen == self.n
        if hit and self.when == "before":
            self._hold(method, path)
        res = self.inner.request(method, path, body, headers)
        if hit:
            self._hold(method, path)
        return res

    def close(self):
        self.inner.close()
