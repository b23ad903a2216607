"""The serial gateway: talk to a board over the framed link and relay its updates to the aggregator.

``BoardLink`` speaks firmware/link.py over a pyserial port: every command
waits for its ACK or NAK, and is resent with the *same* sequence number when
the reply is lost or the frame was corrupted on the way (the board answers a
resend without applying it twice). Update frames arrive as ELCK chunks
(edge/portable/chunks.py) and are reassembled; a missing chunk is asked for
again with ``update`` (the board re-sends the same bytes). ``Gateway.relay``
verifies nothing itself (the aggregator holds the device keys) but checks the
frame is whole before POSTing it.

    from host.gateway import BoardLink
    link = BoardLink.open("/dev/ttyUSB0")           # or a serial object (hil rigs)
    print(link.command("status"))
    link.send_audio(pcm_int16)                       # numpy int16 / bytes
    frame = link.collect_update(round_id=3, seq=1)   # bytes of one ELUP frame
"""

from __future__ import annotations

import struct
import time

from edge.errors import EdgelearnError
from edge.portable.chunks import Reassembler
from edge.portable.wire_errors import WireError
from firmware import link as L


class LinkFailed(EdgelearnError):
    """The board did not answer, or answered with a NAK."""


class BoardLink:
    def __init__(self, ser, timeout: float = 10.0, retries: int = 3, on_event=None):
        self.ser = ser
        if getattr(ser, "timeout", 0) is None:
            ser.timeout = 0.05  # reads must return so resends can happen (mpremote opens without a timeout)
        self.timeout = timeout
        self.retries = retries
        self.seq = int(time.time()) & 0x7FFF  # a fresh range after a host restart, so seqs do not collide
        self.dec = L.Decoder()
        self.events: list[str] = []
        self.chunks: list[bytes] = []
        self.link_errors = 0
        self.on_event = on_event

    @classmethod
    def open(cls, port: str, baudrate: int = 115200, **kw) -> "BoardLink":
        import serial
        return cls(serial.serial_for_url(port, baudrate=baudrate, timeout=0.05), **kw)

    def _read_frames(self, deadline: float):
        while time.time() < deadline:
            try:
                fr = self.dec.next()
            except L.LinkError:
                self.link_errors += 1
                continue
            if fr is not None:
                yield fr
                continue
            data = self.ser.read(max(1, getattr(self.ser, "in_waiting", 0) or 1))
            if data:
                self.dec.feed(data)

    def request(self, kind: int, payload: bytes, corrupt=None, drain: bool = True) -> str:
        """Send one frame and wait for its reply; resend on timeout or a NAK for a damaged frame."""
        self.seq = (self.seq + 1) & 0xFFFF
        wire = L.encode(kind, self.seq, payload)
        last = "no reply"
        for attempt in range(self.retries + 1):
            self.ser.write(corrupt(wire, attempt) if corrupt else wire)
            for k, seq, p in self._read_frames(time.time() + self.timeout):
                if k == L.EVENT:
                    self._event(bytes(p).decode(errors="replace"))
                elif k == L.UPDATE:
                    self.chunks.append(bytes(p))
                elif k in (L.ACK, L.NAK):
                    rseq = struct.unpack_from("<H", p, 0)[0]
                    text = bytes(p[2:]).decode(errors="replace")
                    if k == L.NAK and rseq == 0xFFFF:   # the board saw a damaged frame: resend
                        last = text
                        self.link_errors += 1
                        break
                    if rseq != self.seq:
                        continue  # a late reply to an earlier resend
                    if k == L.NAK:
                        raise LinkFailed(f"board refused {payload[:40]!r}: {text}",
                                         fix="see the reason; the board kept its previous state")
                    if drain:
                        self._drain()
                    return text
        raise LinkFailed(f"no reply from the board after {self.retries + 1} tries ({last})",
                         fix="check the cable/port and that the firmware loop is running (edgelearn flash)")

    def _drain(self, quiet: float = 0.05) -> None:
        # events sent right after the ACK (detections, bundle notices)
        for k, _seq, p in self._read_frames(time.time() + quiet):
            if k == L.EVENT:
                self._event(bytes(p).decode(errors="replace"))
            elif k == L.UPDATE:
                self.chunks.append(bytes(p))

    def _event(self, text: str) -> None:
        self.events.append(text)
        if self.on_event:
            self.on_event(text)

    def leftover(self) -> bytes:
        """Bytes read past the last frame (e.g. the raw REPL's end markers after ``quit``)."""
        return bytes(self.dec.buf[:self.dec.n])

    def command(self, text: str, **kw) -> str:
        return self.request(L.CMD, text.encode(), **kw)

    def send_audio(self, pcm, samples_per_frame: int = 1024) -> int:
        """Stream int16 audio (numpy array or bytes); returns MFCC frames the board computed."""
        raw = pcm.astype("<i2").tobytes() if hasattr(pcm, "astype") else bytes(pcm)
        frames = 0
        step = 2 * samples_per_frame
        for a in range(0, len(raw), step):
            reply = self.request(L.AUDIO, raw[a:a + step])
            frames += int(reply.split("frames=")[1].split()[0])
        return frames

    def collect_update(self, round_id: int, seq: int, max_tries: int = 3) -> bytes:
        """Ask the board to encode an update and reassemble its chunks into one frame."""
        rs = Reassembler()
        for _ in range(max_tries):
            self.chunks = []
            self.command(f"update {round_id} {seq}")
            for c in self.chunks:
                try:
                    done = rs.add(c)
                except WireError:  # ChunkError and the size/CRC checks
                    self.link_errors += 1
                    continue
                if done is not None:
                    return bytes(done)
        raise LinkFailed("the update never arrived whole", fix="check the link; the board keeps the update and re-sends it")

    def close(self) -> None:
        self.ser.close()


class Gateway:
    """Relays board updates to the aggregator (HTTP POST of the raw frame)."""

    def __init__(self, link: BoardLink, url: str, client=None):
        self.link = link
        self.url = url
        self.client = client

    def relay(self, round_id: int, seq: int) -> int:
        frame = self.link.collect_update(round_id, seq)
        import httpx
        client = self.client or httpx.Client(timeout=10)
        for attempt in range(3):
            try:
                r = client.post(self.url, content=frame, headers={"content-type": "application/octet-stream"})
            except httpx.HTTPError:
                time.sleep(0.5 * (attempt + 1))
                continue
            if r.status_code < 500:
                return r.status_code
        raise LinkFailed(f"the aggregator at {self.url} did not accept the update",
                         fix="check that it runs; the frame is safe to resend (same seq)")
