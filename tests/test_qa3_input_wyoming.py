"""Wyoming audio chunks that split a sample frame (QA3 item 1): a client may send any byte count
per chunk (power-of-two buffers of 24-bit or 6-channel audio split frames); the server joins a
frame split between chunks, drops a part-frame left at ``audio-stop``, and never answers an
``error`` for either. Against the ``wyoming`` library's own AsyncTcpClient on loopback."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from devstate_helpers import make_keyword_clips

pytest.importorskip("wyoming")

from wyoming.audio import AudioChunk, AudioStart, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.ping import Ping  # noqa: E402
from wyoming.wake import Detect, Detection  # noqa: E402

from edge.audio import read_wav  # noqa: E402
from edge.device import Device  # noqa: E402
from edge.wyoming import WakeServer  # noqa: E402

KW = "hey edge"
TIMEOUT = 120


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server with KW enrolled, the 16 kHz stream saying it twice, and its detections' times (ms)."""
    tmp = tmp_path_factory.mktemp("qa3wyoming")
    clips = make_keyword_clips(tmp / "kwclips")
    Device(tmp / "st").enroll(KW, clips)
    rng = np.random.default_rng(8)
    kw = read_wav(clips[0])
    noise = lambda n: rng.standard_normal(n) * 100  # noqa: E731
    pcm = np.concatenate([noise(16000), kw, noise(40000), kw, noise(16000)]).astype(np.int16)
    want = [int(round(e["time_s"] * 1000)) for e in Device(tmp / "st").detect(pcm, replay=False)]
    assert len(want) == 2
    srv = WakeServer(Device(tmp / "st"), "tcp://127.0.0.1:0").start()
    yield int(srv.uri.rsplit(":", 1)[1]), pcm, want
    srv.stop()


def encode(pcm: np.ndarray, rate: int, width: int, channels: int) -> bytes:
    """16 kHz mono int16 -> ``rate`` Hz (band-limited), ``width``-byte little-endian samples,
    ``channels`` interleaved copies."""
    if rate != 16000:
        n = int(round(len(pcm) * rate / 16000))
        pcm = np.clip(np.fft.irfft(np.fft.rfft(pcm.astype(np.float64)), n) * n / len(pcm), -32768, 32767)
    assert width in (2, 3)
    x = np.round(np.asarray(pcm, np.float64) * 256 ** (width - 2)).astype("<i4")  # scaled to the width
    raw = x.view(np.uint8).reshape(-1, 4)[:, :width]  # the low ``width`` bytes, little-endian
    return np.repeat(raw, channels, axis=0).tobytes()


async def stream(port, data: bytes, rate, width, channels, chunk_bytes, tail: bytes = b""):
    """detect, audio-start, ``data`` (+ ``tail``) in ``chunk_bytes`` pieces, audio-stop, then every
    event up to the answer to a ping (the server answers in order). Events are read while they are
    written: a server that answered every chunk would otherwise fill the socket and stall both."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        async def answers():
            out = []
            while True:
                ev = await client.read_event()
                assert ev is not None, "the server closed the connection"
                if ev.type == "pong":
                    return out
                out.append(ev)

        reading = asyncio.create_task(answers())
        await client.write_event(Detect(names=[KW]).event())
        await client.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
        data += tail
        for i in range(0, len(data), chunk_bytes):
            await client.write_event(AudioChunk(rate=rate, width=width, channels=channels,
                                                audio=data[i:i + chunk_bytes]).event())
        await client.write_event(AudioStop().event())
        await client.write_event(Ping(text="barrier").event())
        return await asyncio.wait_for(reading, TIMEOUT)


@pytest.mark.parametrize("rate,width,channels,chunk_bytes", [
    (16000, 2, 1, 2047),   # every chunk but a few splits a 2-byte frame
    (16000, 3, 1, 2048),   # 24-bit: 2048 is no multiple of 3
    (48000, 2, 6, 2048),   # 6 channels: 2048 is no multiple of 12
    (16000, 2, 1, 1),      # one byte at a time: no chunk holds a whole frame
])
def test_chunks_that_split_frames_give_the_same_detections_and_no_error(served, rate, width, channels,
                                                                        chunk_bytes):
    port, pcm, want = served
    if chunk_bytes == 1:
        pcm = pcm[: 16000 + 2 * 16000]  # the first keyword only: a byte per event is slow
        want = want[:1]
    data = encode(pcm, rate, width, channels)
    # a part-frame left at audio-stop is dropped, not an error
    events = asyncio.run(stream(port, data, rate, width, channels, chunk_bytes, tail=b"\x01"))
    assert not [e for e in events if e.type == "error"], [e.data for e in events if e.type == "error"]
    got = [(Detection.from_event(e).name, Detection.from_event(e).timestamp) for e in events
           if Detection.is_type(e.type)]
    assert [n for n, _ in got] == [KW] * len(want)
    assert [t for _, t in got] == pytest.approx(want, abs=60)


def test_a_stream_of_less_than_one_frame_ends_in_not_detected(served):
    port, _, _ = served
    events = asyncio.run(stream(port, b"\x00\x00\x00\x00\x00", 16000, 3, 2, 5))
    assert [e.type for e in events] == ["not-detected"]
