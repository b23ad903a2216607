"""One client of the Wyoming server (``_Connection``): its events read and checked, answered, and
its audio converted and pushed through the server's shared models.

``edge.wyoming.WakeServer`` runs one ``_Connection`` per client it accepts; the protocol it speaks
(describe, detect, audio-start, audio-chunk, audio-stop, ping; an ``error`` for a bad event) is
``edge/wyoming.py``'s docstring. ``_wyoming()`` imports the optional ``wyoming`` package on first use.

    >>> await _Connection(server, reader, writer).run()   # until the client goes away
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import numpy as np

from edge.errors import EdgelearnError

if TYPE_CHECKING:
    from edge.wyoming import WakeServer

SAMPLE_RATE, WIDTH = 16000, 2
FAILED = "failed"  # _Connection.streaming of a stream whose audio-start was refused
LINE_LIMIT = 1 << 20  # bytes of one event's header line; a longer one is refused and the connection closed


def _wyoming():
    """The wyoming modules this server uses (imported on first use: an optional package)."""
    from wyoming import audio, error, event, info, ping, wake

    return audio, error, event, info, ping, wake


class _Connection:
    """One client: its event loop of describe / detect / audio-start / audio-chunk / audio-stop."""

    def __init__(self, server: WakeServer, reader, writer):
        self.server, self.reader, self.writer = server, reader, writer
        self.names = None          # the last detect's names (None: every model)
        self.models, self.det = None, None  # this stream's ModelSet (shared) and Detector (its own)
        self.streaming = False     # True, False, or FAILED: a start refused, its audio dropped until audio-stop
        self.converter = None
        self.partial, self.partial_format = b"", None  # a chunk's trailing bytes short of a whole frame
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
            self.partial, self.partial_format = b"", None
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
            chunk = self._whole_frames(chunk)
            if chunk is None:
                return  # less than one frame so far: it waits for the next chunk
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
            self.partial = b""  # a last partial frame is not a sample: dropped, the stream answered as usual
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

    def _whole_frames(self, chunk):
        """``chunk`` cut to whole sample frames, after the bytes of a frame the previous chunk split;
        its own trailing part-frame kept for the next (None: no whole frame yet). A client may send
        any byte count per chunk (power-of-two buffers of 24-bit or 6-channel audio split frames):
        the stream's bytes are frames whatever the chunking."""
        audio = _wyoming()[0]
        fmt = (chunk.rate, chunk.width, chunk.channels)
        data = chunk.audio or b""
        if self.partial and self.partial_format == fmt:
            data = self.partial + data
        # (a part-frame of another format cannot start this chunk's frames: it is dropped)
        frame = chunk.width * chunk.channels
        whole = len(data) - len(data) % frame
        self.partial, self.partial_format = data[whole:], fmt
        if not whole:
            return None
        return audio.AudioChunk(rate=chunk.rate, width=chunk.width, channels=chunk.channels,
                                audio=data[:whole], timestamp=chunk.timestamp)

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
