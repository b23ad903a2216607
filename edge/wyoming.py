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

Each connection has its own ``Detector`` (``Device.detector(replay=False)``: the device's active
model, its enrolled keywords, its operating points), run in a worker thread so one client's
encoder never holds up another's socket. The state's ``keywords.json`` is looked at (its mtime) on
every ``describe`` and ``audio-start``: a keyword enrolled with ``edgelearn device enroll`` while
the server runs is in the next ``info`` and is detected from the next stream on, without a
restart.

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
import json
import signal
import threading
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from edge.errors import EdgelearnError

SAMPLE_RATE, WIDTH = 16000, 2
PROGRAM = "edgelearn"
ATTRIBUTION = ("edgelearn", "")  # name, url (the project has no public address to give)
LINE_LIMIT = 1 << 20  # bytes of one event's header line; a longer one is refused and the connection closed


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


class WakeServer:
    """The Wyoming wake-word service of ``device`` (an ``edge.Device``) at ``uri``.

    ``keywords``: the base keywords offered (None: the bundle's commands, as ``device detect``);
    ``threshold`` / ``sensitivity``: as ``Device.detect``. The enrolled keywords are always offered.
    ``zeroconf``: False (default), True (announce under the default name) or a name (an
    ``edge.wyoming_mdns.Announcement``; while serving its ``service`` is ``NAME._wyoming._tcp.local.``)."""

    def __init__(self, device, uri: str = "tcp://0.0.0.0:10400", *, keywords=None, threshold=None,
                 sensitivity: float | None = None, zeroconf=False):
        if threshold is not None and sensitivity is not None:
            raise EdgelearnError("the server takes a threshold or a sensitivity, not both",
                                 fix="pass --threshold T, or --sensitivity FA_PER_HOUR after `device calibrate`")
        self.device, self.scheme_addr = device, parse_uri(uri)
        _wyoming()  # a missing package is found here (one sentence from the CLI), not by the first client
        self.zeroconf = None
        if zeroconf:  # checked (and the zeroconf package imported) before any model loads
            from edge.wyoming_mdns import Announcement
            self.zeroconf = Announcement(uri, self.scheme_addr, None if zeroconf is True else zeroconf)
        self.keywords, self.threshold, self.sensitivity = keywords, threshold, sensitivity
        self._server = None
        self._loop = None
        self._thread = None
        self._handlers: set[asyncio.Task] = set()
        self._stopped = None
        self._kw_lock, self._build_lock = threading.Lock(), threading.Lock()
        self._kw_sig, self._enrolled = None, []
        self.connections = 0  # served so far (tests and status)
        self._base = None

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

    def make_detector(self, names=None):
        """A fresh Detector for one stream: ``names`` (None: every model offered) split into the
        base keywords and the enrolled ones; returns (detector or None when nothing is left)."""
        enrolled = self.enrolled()[1]
        base = self.base_keywords()
        wanted = self.models() if names is None else [n for n in names if n in enrolled or n in base]
        b = [w for w in wanted if w in base and w not in enrolled]
        c = [w for w in wanted if w in enrolled]
        if not b and not c:
            return None
        thr = self.threshold
        if isinstance(thr, dict):
            thr = {w: t for w, t in thr.items() if w in b}
        det, _ = self.device.detector(keywords=b, threshold=thr, sensitivity=self.sensitivity, replay=False,
                                      enrolled=c)
        return det

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
        try:
            await _Connection(self, reader, writer).run()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: only this connection ends
        finally:
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
        self.det, self.det_key = None, None
        self.streaming = False
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
                offered = await loop.run_in_executor(None, self.server.models)
                unknown = [n for n in d.names if n not in offered]
                if unknown:
                    await self.error(f"no wake model named {unknown}; this server has {offered}", "unknown-model")
        elif audio.AudioStart.is_type(t):
            start = audio.AudioStart.from_event(event)  # the format must be there
            if start.width not in (1, 2, 3, 4) or start.channels < 1 or start.rate < 1:
                raise ValueError(f"unsupported audio format {start.rate} Hz, {start.width} B, {start.channels} ch")
            await loop.run_in_executor(None, self._begin)
            self.streaming = True
        elif audio.AudioChunk.is_type(t):
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
            self.streaming = False
            for ev in await loop.run_in_executor(None, self._flush):
                await self.send(self._detection(ev))
            if not self.fired:
                await self.send(wake.NotDetected(context=self.context).event())
        else:
            await self.error(f"event type {t!r} is not handled by this wake-word server "
                             "(it handles describe, detect, audio-start, audio-chunk, audio-stop, ping)",
                             "unknown-event")

    # -- in the worker thread ----------------------------------------------------------------------
    def _begin(self) -> None:
        audio = _wyoming()[0]
        key = (self.server.enrolled()[0], tuple(self.names) if self.names is not None else None)
        if key != self.det_key:
            with self.server._build_lock:  # Device.detector reads and recovers the state: one at a time
                self.det = self.server.make_detector(self.names)
            self.det_key = key
        elif self.det is not None:
            self.det.reset()
        # width and rate by wyoming's converter (audioop: linear interpolation, keeping its state
        # across chunks); channels are averaged here
        self.converter = audio.AudioChunkConverter(rate=SAMPLE_RATE, width=WIDTH, channels=None)
        self.fired = 0

    def _push(self, pcm):
        return self.det.push(pcm) if self.det is not None and len(pcm) else []

    def _flush(self):
        return self.det.flush() if self.det is not None else []

    def _detection(self, ev):
        wake = _wyoming()[5]
        self.fired += 1
        return wake.Detection(name=ev["keyword"], timestamp=int(round(ev["time_s"] * 1000)),
                              context=self.context).event()
