"""A Wyoming wake-word server (``edgelearn wyoming``): the device's keywords for Home Assistant.

Home Assistant's Wyoming integration (and any other Wyoming client) connects over TCP (or a Unix
socket), asks ``describe`` and gets ``info`` with one wake program, ``edgelearn``, whose models are
the device's enrolled custom keywords and the bundle's base keywords (each a ``WakeModel``: name =
the keyword, phrase, languages ``["en"]``, version, attribution edgelearn, installed). A stream is

    detect (names: only those keywords; none: all) -> audio-start -> audio-chunk ... -> audio-stop

and the server answers one ``detection`` (name, ``timestamp``: milliseconds from the stream's start
to the end of the keyword, the Detector's ``time_s``) per hit while the audio comes, and
``not-detected`` after ``audio-stop`` when nothing fired. Audio of any rate, width and channel
count is converted to 16 kHz 16-bit mono: width and rate by wyoming's own ``AudioChunkConverter``
(``audioop.ratecv``, linear interpolation), channels averaged (its ``tomono`` sums them).

The models are loaded once per server and shared by every connection (``ModelSet``): for each
keyword selection a stream asks for (``detect``'s names, resolved to base and enrolled keywords),
``Device.detector(replay=False)`` builds the keyword model (its LiteRT interpreter), the enrolled
keywords' scorer and second-stage verifier (their interpreters) and the operating thresholds
once; each stream gets its own copy of the Detector's stream state (front end, frame ring, score
history, open candidate, refractory period: ``Detector.reset``) over those shared models. A LiteRT
interpreter is not thread-safe and the pushes run in worker threads (one client's encoder never
holds up another's socket), so every push and flush through one set holds that set's lock (why a
lock and not a pool: ``ModelSet``). Which models detection runs is read from the state on every
``audio-start`` (a few ``stat`` calls: ``state_signature``): a keyword enrolled with ``edgelearn
device enroll``, a sensitivity or calibration changed, an adapted context committed, or (inside
the agent) a new version installed, loads a new set for the next stream, without a restart; a
stream in flight keeps the set it started on to its end, untouched (sets are never changed, only
replaced). ``keywords.json`` is also looked at on every ``describe``: an enrolled keyword is in the
next ``info``. A state that cannot be loaded at ``audio-start`` (a keywords file broken by hand)
is one ``error`` for that stream, whose audio is then dropped until its ``audio-stop``
(``not-detected``); the next stream tries again.

A bad event (a line that is not JSON, an event type this server does not handle, audio before
``audio-start``, a chunk without its format) gets one ``error`` event (``text``, ``code``) and the
connection goes on; a client that goes away mid-stream only ends its own connection.

    >>> server = WakeServer(Device("state/"), "tcp://0.0.0.0:10400")
    >>> server.start()          # a thread with its own event loop; returns once it listens
    >>> server.uri              # the bound address (port 0 in the URI: the one the OS chose)
    >>> server.stop()

``WakeServer.serve()`` is the same server as a coroutine (for a program with its own loop: the
agent), ``serve_forever()`` blocks until SIGTERM or Ctrl-C.

With ``zeroconf`` (``--zeroconf [NAME]``) a TCP server is announced on mDNS as
``NAME._wyoming._tcp.local.`` so Home Assistant discovers it (``edge/wyoming_mdns.py``), and
unregistered when it stops.
"""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import threading
import time
from collections import OrderedDict
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from edge.errors import EdgelearnError

SAMPLE_RATE, WIDTH = 16000, 2
PROGRAM = "edgelearn"
ATTRIBUTION = ("edgelearn", "")  # name, url (the project has no public address to give)
FAILED = "failed"  # _Connection.streaming of a stream whose audio-start was refused
LINE_LIMIT = 1 << 20  # bytes of one event's header line; a longer one is refused and the connection closed
MAX_SETS = 8  # model sets kept loaded at once (distinct keyword selections); the least recently used goes
# files in the state directory whose change means detection runs other models (``Device.detector`` reads
# them): the enrolled keywords, the adapt pointer (an adapted context committed, rolled back or carried
# to a new version), the calibrated operating points
STATE_FILES = ("keywords.json", "adapt/active.json", "operating.json")


def _wyoming():
    """The wyoming modules this server uses (imported on first use: an optional package)."""
    from wyoming import audio, error, event, info, ping, wake

    return audio, error, event, info, ping, wake


def parse_uri(uri: str):
    """("tcp", host, port) or ("unix", path, None) from ``tcp://HOST:PORT`` / ``unix://PATH``."""
    u = urlparse(uri)
    if u.scheme == "tcp":
        try:
            port = u.port
        except ValueError:
            port = None
        if not u.hostname or port is None:
            raise EdgelearnError(f"--uri {uri!r} needs a host and a port", fix="pass e.g. tcp://0.0.0.0:10400")
        return "tcp", u.hostname, port
    if u.scheme == "unix" and (u.path or u.netloc):
        return "unix", u.netloc + u.path, None
    raise EdgelearnError(f"--uri {uri!r} is not tcp://HOST:PORT or unix://PATH",
                         fix="pass e.g. tcp://0.0.0.0:10400 (the port Home Assistant's Wyoming integration is told)")


def state_signature(device) -> tuple:
    """What decides the models ``device`` detects with, cheaply: (mtime, size, inode) of each of
    ``STATE_FILES`` (``edge.atomic`` replaces a file, so a rewrite is a new inode even within one
    mtime tick). The Device itself is compared by identity beside it (the agent swaps in a new
    Device, on the new bundle, when a version is installed)."""
    root = Path(device.state_dir)
    out = []
    for name in STATE_FILES:
        try:
            st = (root / name).stat()
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except FileNotFoundError:
            out.append(None)
    return tuple(out)


class ModelSet:
    """One keyword selection's loaded models, shared by every stream that detects it.

    ``template``: a Detector built once (``Device.detector``); ``detector()`` gives each stream a
    copy of it whose stream state is its own (``Detector.reset`` makes every per-stream field
    anew; the copy shares only what never changes once built: the keyword model, the custom
    keywords and their verifier, the adapted head, the keyword indices and thresholds).

    ``lock`` is held around every push and flush of those detectors: LiteRT interpreters are not
    thread-safe (``set_tensor``/``invoke``/``get_tensor`` of two threads interleave), and the
    verifier's and an adapted tail's interpreters are reached from inside ``push`` too, so the
    whole push is the unit that is safe by construction (without it, threads pushing through one
    set fail with LiteRT's RuntimeError "There is at least 1 reference to internal data in the
    interpreter", and tests/test_wyoming_shared.py's threads test fails). A lock and not a pool
    of interpreters or one per worker thread, by measurement (bench/wyoming_latency.py,
    2026-12-02, 2 shared cores): eight streams pushed from eight threads at real time, every
    thread's chunk due at the same moment (the worst case for a lock), return from their pushes as
    soon through one shared set as through a set each (p50 1.64 vs 1.63 ms after the chunk is
    due, p99 12.0 vs 12.9 ms: the GIL already serialises most of a push, and a push is short, the
    encoder invoke 0.04 ms), at the same CPU (5.3 vs 5.5 ms per second of audio); a set per
    thread or per connection would load the models again for each (3.9 ms of CPU and 0.4 MB per
    set; per connection, what this server did before, it was 6.3 ms of set-up per stream and 44 MB
    more RSS with 32 connections). ``waits`` / ``wait_s`` count the pushes that found the lock
    held and how long they waited."""

    def __init__(self, template, signature=None):
        self.template, self.signature = template, signature
        self.lock = threading.Lock()
        self.streams = 0               # detectors handed out
        self.pushes = self.waits = 0   # lock acquisitions, and those that found it held
        self.wait_s = 0.0              # time spent waiting for it

    def detector(self):
        """A Detector for one stream: the shared models, its own stream state. Push through it
        with ``push`` / ``flush`` (the lock held), never directly."""
        det = copy.copy(self.template)  # the template itself is never pushed: nothing of it changes
        det.reset()
        with self.lock:
            self.streams += 1
        return det

    def _run(self, fn, *args):
        lock = self.lock
        if not lock.acquire(blocking=False):
            t = time.perf_counter()
            lock.acquire()
            self.waits += 1  # counted while holding the lock
            self.wait_s += time.perf_counter() - t
        try:
            self.pushes += 1
            return fn(*args)
        finally:
            lock.release()

    def push(self, det, pcm) -> list[dict]:
        return self._run(det.push, pcm)

    def flush(self, det) -> list[dict]:
        return self._run(det.flush)


class WakeServer:
    """The Wyoming wake-word service of ``device`` (an ``edge.Device``) at ``uri``.

    ``keywords``: the base keywords offered (None: the bundle's commands, as ``device detect``);
    ``threshold`` / ``sensitivity`` / ``asr``: as ``Device.detect`` (``asr``: PocketSphinx confirms
    each base-keyword detection, ``edge.confirm``). The enrolled keywords are always offered.
    ``zeroconf``: False (default), True (announce under the default name) or a name (an
    ``edge.wyoming_mdns.Announcement``; while serving its ``service`` is ``NAME._wyoming._tcp.local.``)."""

    def __init__(self, device, uri: str = "tcp://0.0.0.0:10400", *, keywords=None, threshold=None,
                 sensitivity: float | None = None, zeroconf=False, asr: bool = False):
        if threshold is not None and sensitivity is not None:
            raise EdgelearnError("the server takes a threshold or a sensitivity, not both",
                                 fix="pass --threshold T, or --sensitivity FA_PER_HOUR after `device calibrate`")
        self.device, self.scheme_addr = device, parse_uri(uri)
        _wyoming()  # a missing package is found here (one sentence from the CLI), not by the first client
        self.zeroconf = None
        if zeroconf:  # checked (and the zeroconf package imported) before any model loads
            from edge.wyoming_mdns import Announcement
            self.zeroconf = Announcement(uri, self.scheme_addr, None if zeroconf is True else zeroconf)
        self.keywords, self.threshold, self.sensitivity, self.asr = keywords, threshold, sensitivity, asr
        if asr:  # a missing PocketSphinx is one sentence here, not at the first stream
            from edge.confirm import require
            require()
        self._server = None
        self._loop = None
        self._thread = None
        self._handlers: set[asyncio.Task] = set()
        self._stopped = None
        self._kw_lock, self._build_lock, self._sets_lock = threading.Lock(), threading.Lock(), threading.Lock()
        self._kw_sig, self._enrolled = None, []
        self.connections = 0  # served so far (tests and status)
        self.open = 0         # connected now
        self.detections = 0   # detection events sent, every client
        self.loads = 0        # model sets loaded (``ModelSet``): one per keyword selection and state
        self._base = None
        self._sets: OrderedDict = OrderedDict()  # (base, enrolled) -> ModelSet, for ``_sets_for``
        self._sets_for = None                    # (device, state_signature) the sets were loaded for

    # -- what is offered -------------------------------------------------------------------------
    def _signature(self):
        try:
            st = (Path(self.device.state_dir) / "keywords.json").stat()
            return st.st_mtime_ns, st.st_size, st.st_ino
        except FileNotFoundError:
            return None

    def enrolled(self) -> tuple[object, list[str]]:
        """(signature of keywords.json, the enrolled keywords' names): re-read only when the file
        changed (mtime, size, inode: ``edge.atomic`` replaces it, so a new enrolment is a new inode)."""
        sig = self._signature()
        with self._kw_lock:
            if sig != self._kw_sig or self._kw_sig is None:
                self._enrolled = self.device.enrolled().names()
                self._kw_sig = sig
            return self._kw_sig, list(self._enrolled)

    def base_keywords(self) -> list[str]:
        if self._base is None:
            from edge.detect import NON_KEYWORDS, default_keywords

            labels = list(self.device.bundle.labels)
            if self.keywords == "all":
                self._base = [w for w in labels if not w.startswith("_")]
            elif self.keywords is not None:
                self._base = [self.keywords] if isinstance(self.keywords, str) else list(self.keywords)
                unknown = [w for w in self._base if w not in labels]
                if unknown:
                    raise EdgelearnError(f"keywords {unknown} are not labels of this bundle",
                                         fix=f"choose from {[w for w in labels if w not in NON_KEYWORDS]}")
            else:
                self._base = default_keywords(self.device.bundle)
        return list(self._base)

    def models(self) -> list[str]:
        """Every wake model name offered now: the enrolled keywords first, then the base keywords."""
        return self.enrolled()[1] + [w for w in self.base_keywords() if w not in self.enrolled()[1]]

    def info(self):
        """The ``info`` event answering ``describe``."""
        _, _, _, info, _, _ = _wyoming()
        from edge import __version__ as edge_version

        b = self.device.bundle
        version = f"{b.model_id} v{b.version}"
        attribution = info.Attribution(name=ATTRIBUTION[0], url=ATTRIBUTION[1])
        enrolled = self.enrolled()[1]
        models = [info.WakeModel(name=w, phrase=w, languages=["en"], version=version, attribution=attribution,
                                 installed=True,
                                 description=("custom keyword enrolled on this device" if w in enrolled
                                              else "base keyword of the shipped model"))
                  for w in self.models()]
        program = info.WakeProgram(name=PROGRAM, description="edgelearn keyword spotting (few-shot custom keywords)",
                                   attribution=attribution, installed=True, version=edge_version, models=models)
        return info.Info(wake=[program]).event()

    def selection(self, names=None) -> tuple[list[str], list[str]]:
        """``names`` (None: every model offered) as (base keywords, enrolled keywords), in the
        order asked; names not offered are left out (``detect`` has said so already)."""
        enrolled = self.enrolled()[1]
        base = self.base_keywords()
        wanted = self.models() if names is None else [n for n in names if n in enrolled or n in base]
        return [w for w in wanted if w in base and w not in enrolled], [w for w in wanted if w in enrolled]

    def model_set(self, names=None) -> ModelSet | None:
        """The loaded models for a stream detecting ``names`` (None: every model offered), or None
        when none of them is offered. Loaded on the first stream that asks for this selection
        after the state changed (``state_signature``), then shared; called in a worker thread."""
        device = self.device  # the agent may swap it (a new version): one Device for all of this
        sig = (device, state_signature(device))  # before the state is read: a change after it loads again
        b, c = self.selection(names)
        if not b and not c:
            return None
        key = (tuple(b), tuple(c))
        ms = self._loaded(sig, key)
        if ms is not None:
            return ms
        with self._build_lock:  # Device.detector reads and recovers the state: one build at a time
            ms = self._loaded(sig, key)  # another stream may have loaded it while this one waited
            if ms is not None:
                return ms
            thr = self.threshold
            if isinstance(thr, dict):
                thr = {w: t for w, t in thr.items() if w in b}
            det, _ = device.detector(keywords=b, threshold=thr, sensitivity=self.sensitivity, replay=False,
                                     enrolled=c, asr=self.asr)
            ms = ModelSet(det, sig[1])
            with self._sets_lock:
                if not self._current(sig):  # the state changed: the old sets go (streams in flight keep theirs)
                    self._sets, self._sets_for = OrderedDict(), sig
                self._sets[key] = ms
                while len(self._sets) > MAX_SETS:
                    self._sets.popitem(last=False)
                self.loads += 1
            return ms

    def _current(self, sig) -> bool:
        return self._sets_for is not None and self._sets_for[0] is sig[0] and self._sets_for[1] == sig[1]

    def _loaded(self, sig, key) -> ModelSet | None:
        with self._sets_lock:
            if self._current(sig) and key in self._sets:
                self._sets.move_to_end(key)
                return self._sets[key]
        return None

    def stats(self) -> dict:
        """Clients and the loaded sets: {"connections" (served so far), "open" (now), "detections"
        (events sent), "loads", "sets", "streams", "pushes", "waits", "wait_s"} (the sets' lock use)."""
        with self._sets_lock:
            sets = list(self._sets.values())
        return {"connections": self.connections, "open": self.open, "detections": self.detections,
                "loads": self.loads, "sets": len(sets), "streams": sum(m.streams for m in sets),
                "pushes": sum(m.pushes for m in sets), "waits": sum(m.waits for m in sets),
                "wait_s": sum(m.wait_s for m in sets)}

    # -- running ---------------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        """The address clients connect to (with the port the OS chose when the URI said 0)."""
        kind, host, port = self.scheme_addr
        if kind == "unix":
            return f"unix://{host}"
        if self._server is not None and self._server.sockets:
            port = self._server.sockets[0].getsockname()[1]
        return f"tcp://{host}:{port}"

    async def serve(self, ready=None) -> None:
        """Listen and serve until ``stop()``; ``ready()`` is called once listening."""
        self.device.bundle  # noqa: B018 - verified once, here, not by the first client's thread
        self.base_keywords()
        self.enrolled()
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        kind, host, port = self.scheme_addr
        if kind == "unix":
            Path(host).unlink(missing_ok=True)
            self._server = await asyncio.start_unix_server(self._accept, path=host, limit=LINE_LIMIT)
        else:
            self._server = await asyncio.start_server(self._accept, host=host, port=port, limit=LINE_LIMIT)
        try:
            if self.zeroconf is not None:
                await self.zeroconf.register(self._server.sockets[0].getsockname()[1])
            if ready is not None:
                ready()
            await self._stopped.wait()
        finally:
            if self.zeroconf is not None:
                await self.zeroconf.withdraw()
            self._server.close()
            for t in list(self._handlers):
                t.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()
            if kind == "unix":
                Path(host).unlink(missing_ok=True)

    def start(self, timeout: float = 120.0) -> "WakeServer":
        """Serve in a background thread with its own event loop; returns once it listens."""
        if self._thread is not None:
            raise EdgelearnError("this server is already running", fix="stop() it first")
        up, failed = threading.Event(), []

        def main():
            try:
                asyncio.run(self.serve(ready=up.set))
            except BaseException as e:  # noqa: BLE001 - handed to start()'s caller
                failed.append(e)
                up.set()

        self._thread = threading.Thread(target=main, name="wyoming-server", daemon=True)
        self._thread.start()
        if not up.wait(timeout):
            raise EdgelearnError(f"the Wyoming server did not start within {timeout} s")
        if failed:
            self._thread = None
            raise failed[0]
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop listening, end every connection, and (when ``start`` ran it) join the thread."""
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopped.set)
            except RuntimeError:  # the loop has just closed
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            self._thread = None

    def serve_forever(self, on_ready=None) -> None:
        """Serve in this thread until SIGTERM or Ctrl-C (``edgelearn wyoming``)."""

        async def main():
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self.stop)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass
            await self.serve(ready=on_ready)

        asyncio.run(main())

    async def _accept(self, reader, writer) -> None:
        task = asyncio.current_task()
        self._handlers.add(task)
        self.connections += 1
        self.open += 1
        try:
            await _Connection(self, reader, writer).run()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: only this connection ends
        finally:
            self.open -= 1
            self._handlers.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass


class _Connection:
    """One client: its event loop of describe / detect / audio-start / audio-chunk / audio-stop."""

    def __init__(self, server: WakeServer, reader, writer):
        self.server, self.reader, self.writer = server, reader, writer
        self.names = None          # the last detect's names (None: every model)
        self.models, self.det = None, None  # this stream's ModelSet (shared) and Detector (its own)
        self.streaming = False     # True, False, or FAILED: a start refused, its audio dropped until audio-stop
        self.converter = None
        self.fired = 0
        self.context = None

    async def send(self, event) -> None:
        _, _, ev, _, _, _ = _wyoming()
        await ev.async_write_event(event, self.writer)

    async def error(self, text: str, code: str) -> None:
        _, error, _, _, _, _ = _wyoming()
        await self.send(error.Error(text=text, code=code).event())

    async def read(self):
        """The next event, None at the end of the connection, or a str: why the line was refused."""
        _, _, ev, _, _, _ = _wyoming()
        try:
            line = await self.reader.readline()
        except ValueError:  # a line over LINE_LIMIT: the stream cannot be resynchronised
            await self.error(f"an event line longer than {LINE_LIMIT} bytes; closing", "line-too-long")
            return None
        if not line:
            return None
        try:
            head = json.loads(line)
            if not isinstance(head, dict) or not isinstance(head.get("type"), str):
                raise ValueError("no 'type'")
            data = head.get("data") or {}
            if not isinstance(data, dict):
                raise ValueError("'data' is not an object")
            n_data, n_payload = head.get("data_length") or 0, head.get("payload_length") or 0
            if not isinstance(n_data, int) or not isinstance(n_payload, int) or n_data < 0 or n_payload < 0:
                raise ValueError("bad data_length / payload_length")
        except ValueError as e:
            return f"not a Wyoming event line ({e}): {line[:80]!r}"
        if n_data:
            extra = await self.reader.readexactly(n_data)
            try:
                more = json.loads(extra)
                if not isinstance(more, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                if n_payload:
                    await self.reader.readexactly(n_payload)  # skipped with its event
                return f"event {head['type']!r}: its data is not a JSON object ({e})"
            data = {**data, **more}
        payload = await self.reader.readexactly(n_payload) if n_payload else None
        return ev.Event(type=head["type"], data=data, payload=payload)

    async def run(self) -> None:
        while True:
            event = await self.read()
            if event is None:
                return
            if isinstance(event, str):
                await self.error(event, "bad-event")
                continue
            try:
                await self.handle(event)
            except EdgelearnError as e:
                await self.error(str(e), "device-error")
            except (KeyError, TypeError, ValueError) as e:
                await self.error(f"event {event.type!r} is malformed ({type(e).__name__}: {e})", "bad-event")

    async def handle(self, event) -> None:
        audio, _, _, info, ping, wake = _wyoming()
        loop = asyncio.get_running_loop()
        t = event.type
        if info.Describe.is_type(t):
            await self.send(await loop.run_in_executor(None, self.server.info))
        elif ping.Ping.is_type(t):
            await self.send(ping.Pong(text=ping.Ping.from_event(event).text).event())
        elif wake.Detect.is_type(t):
            d = wake.Detect.from_event(event)
            if d.names is not None and (not isinstance(d.names, list) or not all(isinstance(n, str) for n in d.names)):
                raise ValueError("'names' is not a list of strings")
            self.names, self.context = d.names or None, d.context
            if d.names:
                try:
                    offered = await loop.run_in_executor(None, self.server.models)
                except EdgelearnError:  # a state that cannot be read: said once, by the stream's audio-start
                    return
                unknown = [n for n in d.names if n not in offered]
                if unknown:
                    await self.error(f"no wake model named {unknown}; this server has {offered}", "unknown-model")
        elif audio.AudioStart.is_type(t):
            self.streaming = FAILED  # until it has started: a refused start drops its stream quietly
            self.fired = 0
            start = audio.AudioStart.from_event(event)  # the format must be there
            if start.width not in (1, 2, 3, 4) or start.channels < 1 or start.rate < 1:
                raise ValueError(f"unsupported audio format {start.rate} Hz, {start.width} B, {start.channels} ch")
            await loop.run_in_executor(None, self._begin)
            self.streaming = True
        elif audio.AudioChunk.is_type(t):
            if self.streaming is FAILED:
                return  # its audio-start had its one error
            if not self.streaming:
                await self.error("audio-chunk before audio-start", "not-streaming")
                return
            chunk = audio.AudioChunk.from_event(event)
            if chunk.width not in (1, 2, 3, 4) or chunk.channels < 1 or chunk.rate < 1:
                raise ValueError(f"unsupported audio format {chunk.rate} Hz, {chunk.width} B, {chunk.channels} ch")
            if len(chunk.audio or b"") % (chunk.width * chunk.channels):
                raise ValueError(f"{len(chunk.audio)} bytes is not a whole number of "
                                 f"{chunk.width * chunk.channels}-byte frames")
            pcm = np.frombuffer(self.converter.convert(chunk).audio, "<i2")
            if chunk.channels > 1:  # the mean of the channels (wyoming's tomono sums them, and clips)
                pcm = pcm[: len(pcm) // chunk.channels * chunk.channels].reshape(-1, chunk.channels)
                pcm = pcm.mean(axis=1).round().astype(np.int16)
            for ev in await loop.run_in_executor(None, self._push, pcm):
                await self.send(self._detection(ev))
        elif audio.AudioStop.is_type(t):
            if not self.streaming:
                await self.error("audio-stop before audio-start", "not-streaming")
                return
            failed, self.streaming = self.streaming is FAILED, False
            if not failed:
                for ev in await loop.run_in_executor(None, self._flush):
                    await self.send(self._detection(ev))
            self.models = self.det = None  # a set replaced meanwhile is freed with its last stream
            if not self.fired:
                await self.send(wake.NotDetected(context=self.context).event())
        else:
            await self.error(f"event type {t!r} is not handled by this wake-word server "
                             "(it handles describe, detect, audio-start, audio-chunk, audio-stop, ping)",
                             "unknown-event")

    # -- in the worker thread ----------------------------------------------------------------------
    def _begin(self) -> None:
        audio = _wyoming()[0]
        # the models the state holds now, loaded once and shared (a stream already running keeps its
        # own set to its end); this stream's own front end, history and refractory period
        self.models = self.server.model_set(self.names)
        self.det = None if self.models is None else self.models.detector()
        # width and rate by wyoming's converter (audioop: linear interpolation, keeping its state
        # across chunks); channels are averaged here
        self.converter = audio.AudioChunkConverter(rate=SAMPLE_RATE, width=WIDTH, channels=None)
        self.fired = 0

    def _push(self, pcm):
        return self.models.push(self.det, pcm) if self.det is not None and len(pcm) else []

    def _flush(self):
        return self.models.flush(self.det) if self.det is not None else []

    def _detection(self, ev):
        wake = _wyoming()[5]
        self.fired += 1
        self.server.detections += 1
        return wake.Detection(name=ev["keyword"], timestamp=int(round(ev["time_s"] * 1000)),
                              context=self.context).event()
