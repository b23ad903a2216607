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
(``audioop.ratecv``, linear interpolation), channels averaged (its ``tomono`` sums them). A chunk
may hold any number of bytes: a sample frame split between two chunks is joined (a client's
power-of-two buffers of 24-bit or 6-channel audio split frames), and a part of a frame left at
``audio-stop`` is dropped.

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

One client's event loop is ``edge/wyoming_connection.py`` (``_Connection``); the shared model sets
and the state signature are ``edge/wyoming_models.py`` (``ModelSet``, ``state_signature``).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections import OrderedDict
from pathlib import Path

from edge.errors import EdgelearnError
# one client's events and the shared models have modules of their own; every name stays importable here
from edge.wyoming_connection import LINE_LIMIT, _Connection, _wyoming
from edge.wyoming_connection import FAILED, SAMPLE_RATE, WIDTH  # noqa: F401 (re-exported)
from edge.wyoming_models import STATE_FILES, ModelSet, state_signature  # noqa: F401 (STATE_FILES: re-exported)
from edge.wyoming_uri import _listen_error, parse_uri  # noqa: F401 (parse_uri: re-exported)

PROGRAM = "edgelearn"
ATTRIBUTION = ("edgelearn", "")  # name, url (the project has no public address to give)
MAX_SETS = 8  # model sets kept loaded at once (distinct keyword selections); the least recently used goes


class WakeServer:
    """The Wyoming wake-word service of ``device`` (an ``edge.Device``) at ``uri``.

    ``keywords``: the base keywords offered (None: the bundle's commands, as ``device detect``);
    ``threshold`` / ``sensitivity`` / ``asr``: as ``Device.detect`` (``asr``: a second stage confirms
    each base-keyword detection: "auto", the default's; True, PocketSphinx; "phrase", the bundle's
    phrase models; False, none). The enrolled keywords are always offered.
    ``zeroconf``: False (default), True (announce under the default name) or a name (an
    ``edge.wyoming_mdns.Announcement``; while serving its ``service`` is ``NAME._wyoming._tcp.local.``)."""

    def __init__(self, device, uri: str = "tcp://0.0.0.0:10400", *, keywords=None, threshold=None,
                 sensitivity: float | None = None, zeroconf=False, asr: bool | str = "auto"):
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
        self._stale_said = False  # a stale calibration said, until one matches again (``_build``)
        if asr == "phrase":  # a missing front end or phrase models: one sentence here, not at the first stream
            from edge.phrase_stage import config, require
            require()
            config(device.bundle)
        elif asr and asr != "auto":  # a missing PocketSphinx is one sentence here, not at the first stream
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
            det = self._build(device, b, c, thr)
            ms = ModelSet(det, sig[1])
            with self._sets_lock:
                if not self._current(sig):  # the state changed: the old sets go (streams in flight keep theirs)
                    self._sets, self._sets_for = OrderedDict(), sig
                self._sets[key] = ms
                while len(self._sets) > MAX_SETS:
                    self._sets.popitem(last=False)
                self.loads += 1
            return ms

    def _build(self, device, b, c, thr):
        """The detector of one selection; with a stale calibration (for another model or context) at the
        model's default thresholds, said once, as the agent does (edge/agent_calibration.py)."""
        from edge.operating import StaleCalibration

        try:
            det = device.detector(keywords=b, threshold=thr, sensitivity=self.sensitivity, replay=False,
                                  enrolled=c, asr=self.asr)[0]
            self._stale_said = False
            return det
        except StaleCalibration as e:
            if not self._stale_said:
                self._stale_said = True
                print(f"wyoming: --sensitivity {self.sensitivity:g} is not used: {e.problem}; detecting at the "
                      "model's default thresholds until `edgelearn device calibrate` runs again",
                      file=sys.stderr, flush=True)
            return device.detector(keywords=b, threshold=thr, replay=False, enrolled=c, asr=self.asr)[0]

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
        try:
            if kind == "unix":
                Path(host).unlink(missing_ok=True)
                self._server = await asyncio.start_unix_server(self._accept, path=host, limit=LINE_LIMIT)
            else:
                self._server = await asyncio.start_server(self._accept, host=host, port=port, limit=LINE_LIMIT)
        except OSError as e:
            raise _listen_error(self.uri, e) from None
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
