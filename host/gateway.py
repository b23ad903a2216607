"""The serial gateway: talk to a board over the framed link and relay its updates to the aggregator.

``BoardLink`` speaks edge/portable/link.py over a pyserial port: every command
waits for its ACK or NAK, and is resent with the *same* sequence number when
the reply is lost or the frame was corrupted on the way (the board answers a
resend without applying it twice). Update frames arrive as ELCK chunks
(edge/portable/chunks.py) and are reassembled; a missing chunk is asked for
again with ``update`` (the board re-sends the same bytes). ``Gateway``
carries the board's signed check-ins and updates to the aggregator; it holds
no key (the aggregator does) and only checks that a frame is whole.

    from host.gateway import BoardLink
    link = BoardLink.open("/dev/ttyUSB0")           # or a serial object (hil rigs)
    print(link.command("status"))
    link.send_audio(pcm_int16)                       # numpy int16 / bytes
    frame = link.collect_update(round_id=3, seq=1)   # bytes of one ELUP frame
"""

from __future__ import annotations

import json
import struct
import time

from edge.errors import EdgelearnError
from edge.portable.chunks import Reassembler
from edge.portable.wire_errors import WireError
from edge.portable import link as L


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

    def collect_update(self, round_id: int, seq: int | None = None, max_tries: int = 3) -> bytes:
        """Ask the board to encode an update and reassemble its chunks into one frame.

        Without ``seq`` the board numbers the update itself (one above the last
        it sent) and a retry asks for that same number, so the bytes repeat.
        """
        rs = Reassembler()
        for _ in range(max_tries):
            self.chunks = []
            reply = self.command(f"update {round_id}" + ("" if seq is None else f" {seq}"))
            if seq is None and "seq=" in reply:
                seq = int(reply.split("seq=")[1].split()[0])
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


class RelayRefused(LinkFailed):
    """The aggregator refused the board's check-in or update (4xx): final for that frame; ``status`` and ``error`` say why."""

    def __init__(self, status: int, error: str, problem: str, fix: str | None = None):
        super().__init__(f"the aggregator refused it ({status} {error}): {problem}", fix=fix)
        self.status, self.error = status, error


class Gateway:
    """Carries one board's check-ins and updates to the aggregator (docs/protocol.md) over HTTP.

    The board signs its check-in and its update frames with its own key; the
    gateway holds no key and verifies nothing itself, it only checks a frame
    is whole (the chunk CRCs) before sending it. ``relay()`` = check in, and
    when the aggregator hands out a task, have the board encode the update for
    that round (the board numbers it, ``state/seq.bin``), collect its chunks and
    POST the frame: to ``/v1/updates`` whole, or as ELCK chunks to
    ``/v1/chunks`` when it is larger than the task's ``chunk_size``. Network
    faults and 5xx are retried with the *same* bytes (the aggregator answers a
    resend as ``duplicate``); a 4xx is final and raised as ``RelayRefused``.

        gw = Gateway(BoardLink.open("/dev/ttyUSB0"), "http://127.0.0.1:8470")
        gw.relay()       # {"status": "accepted", "round_id": 3, ...} or {"action": "wait", ...}
    """

    def __init__(self, link: BoardLink, url: str, client=None, retries: int = 3, backoff: float = 0.5):
        self.link = link
        self.url = url.rstrip("/")
        self.client = client
        self.retries = retries
        self.backoff = backoff

    def _client(self):
        if self.client is None:
            import httpx
            self.client = httpx.Client(timeout=10)
        return self.client

    def _post(self, path: str, body: bytes, headers: dict) -> tuple[int, dict]:
        import httpx
        last = ""
        for attempt in range(self.retries):
            try:
                r = self._client().post(self.url + path, content=body, headers=headers)
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            else:
                try:
                    ans = r.json()
                except ValueError:
                    ans = {"problem": r.text[:200]}
                if r.status_code < 500:
                    if r.status_code >= 400:
                        raise RelayRefused(r.status_code, ans.get("error", "?"), ans.get("problem", ""), ans.get("fix"))
                    return r.status_code, ans
                last = f"HTTP {r.status_code}: {ans.get('problem', '')}"
            time.sleep(self.backoff * (attempt + 1))
        raise LinkFailed(f"the aggregator at {self.url} did not answer {path} ({last})",
                         fix="check that it runs; relay() again sends the same bytes (safe to resend)")

    def checkin(self) -> dict:
        """The board's signed state to ``/v1/checkin``; the aggregator's answer (task or wait)."""
        reply = self.link.command("checkin")
        try:
            mac = reply.split("mac=", 1)[1].split()[0]
            body = reply.split(" body=", 1)[1].encode()
            device = json.loads(body)["device_id"]
        except (IndexError, ValueError, KeyError):
            raise LinkFailed(f"the board's check-in reply is not understood: {reply[:80]!r}",
                             fix="flash firmware that matches this gateway (edgelearn flash)") from None
        _, ans = self._post("/v1/checkin", body, {"X-Edgelearn-Device": device, "X-Edgelearn-Mac": mac,
                                                  "Content-Type": "application/json"})
        return ans

    def relay(self, round_id: int | None = None, seq: int | None = None) -> dict:
        """Check in; on a task, relay one update. Returns the aggregator's answer (a wait answer when no task).

        ``round_id``/``seq`` skip the check-in and re-send a known update
        (the board re-encodes the same bytes for the same round and seq).
        """
        task = {}
        if round_id is None:
            ans = self.checkin()
            if ans.get("action") != "train":
                return ans
            task = ans["task"]
            round_id = task["round_id"]
        frame = self.link.collect_update(round_id, seq)
        hdr_device = _frame_device(frame)
        headers = {"X-Edgelearn-Device": hdr_device, "Content-Type": "application/octet-stream"}
        chunk = int(task.get("chunk_size", 0) or 0)
        if chunk and len(frame) > chunk:
            from edge.portable.chunks import split_chunks
            ans: dict = {}
            for c in split_chunks(frame, chunk):
                _, ans = self._post("/v1/chunks", c, headers)
            return ans
        return self._post("/v1/updates", frame, headers)[1]


def _frame_device(frame: bytes) -> str:
    """The device id in an update frame's header (docs/wire-format.md), for the X-Edgelearn-Device header."""
    from edge.portable.wire_decode import parse_header
    try:
        return parse_header(frame)[0].device_id
    except WireError as e:
        raise LinkFailed(f"the board's update frame is malformed: {e.problem}",
                         fix="the board keeps its state; ask it again (relay) or re-flash it") from None
