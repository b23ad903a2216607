"""The Wyoming server's models are loaded once and shared between connections (edge/wyoming.py,
``ModelSet``): each stream still gets exactly the events it would get alone, a change of the state
loads new models for the next stream without touching a stream in flight, and a state that cannot
be loaded is one sentence for that stream.

Two enrolled keywords that sound different (a rising chirp, "hey edge", and a falling, warbling
one, "hey other") so that streams asking for different keywords get different events."""

from __future__ import annotations

import asyncio
import shutil
import threading

import numpy as np
import pytest
from devstate_helpers import make_keyword_clips

pytest.importorskip("wyoming")

from test_wyoming import describe, detections, noise_stream, port_of, run, send_stream, until_pong  # noqa: E402
from wyoming.audio import AudioChunk, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402

from edge.audio import read_wav, write_wav  # noqa: E402
from edge.device import Device  # noqa: E402
from edge.wyoming import WakeServer  # noqa: E402

A, B = "hey edge", "hey other"


def other_clips(root, n: int = 5, seed: int = 3):
    """A falling chirp (1.5 -> 0.8 kHz) with a 6 Hz warble: not the rising chirp of ``A``."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    t = np.arange(9600) / 16000
    out = []
    for i in range(n):
        f = 1500 - 700 * t / t[-1]
        env = 0.5 + 0.5 * np.sin(2 * np.pi * 6 * t) ** 2
        x = np.sin(2 * np.pi * np.cumsum(f) / 16000) * 7000 * env * (1 + 0.05 * i)
        x = np.r_[np.zeros(2000), x, np.zeros(2000)] + rng.standard_normal(len(x) + 4000) * 50
        out.append(write_wav(root / f"o{i}.wav", x.astype(np.int16)))
    return out


def stream_of(clip, seed: int) -> np.ndarray:
    """Noise with ``clip`` said three times."""
    rng = np.random.default_rng(seed)
    kw = read_wav(clip)
    noise = lambda n: rng.standard_normal(n) * 100  # noqa: E731
    return np.concatenate([noise(16000), kw, noise(40000), kw, noise(40000), kw, noise(16000)]).astype(np.int16)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """(clips of A, clips of B, {stream name: pcm}): the state is made by each test."""
    tmp = tmp_path_factory.mktemp("wyoming-shared")
    a, b = make_keyword_clips(tmp / "a"), other_clips(tmp / "b")
    sa, sb = stream_of(a[0], 8), stream_of(b[0], 9)
    pcm = {"a": sa, "b": sb, "mixed": np.concatenate([sa[:60000], sb[20000:]]), "noise": noise_stream(6.0)}
    return a, b, pcm


def alone(state, pcm, names=None):
    """The events of ``pcm`` from a detector of its own (no server, nothing shared), as the server
    reports them: (name, milliseconds)."""
    enrolled = None if names is None else [n for n in names if n in (A, B)]
    keywords = None if names is None else [n for n in names if n not in (A, B)]
    det, _ = Device(state).detector(keywords=keywords, enrolled=enrolled, replay=False)
    evs = []
    for i in range(0, len(pcm), 1024):
        evs += det.push(pcm[i:i + 1024])
    return [(e["keyword"], int(round(e["time_s"] * 1000))) for e in evs + det.flush()]


async def stream(port, pcm, **kw):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await send_stream(client, pcm, **kw)
        return await until_pong(client)


def test_concurrent_connections_get_exactly_their_own_events_from_models_loaded_once(tmp_path, two):
    a, b, pcm = two
    state = tmp_path / "st"
    Device(state).enroll(A, a)
    Device(state).enroll(B, b)
    # (stream, detect names, rate, channels): three keyword selections, six connections
    plan = [("a", [A], 16000, 1), ("b", None, 16000, 1), ("mixed", None, 16000, 1), ("mixed", [B], 16000, 1),
            ("noise", None, 16000, 1), ("a", None, 22050, 2)]
    want = {"a": {(A,): alone(state, pcm["a"], [A]), None: alone(state, pcm["a"])},
            "b": {None: alone(state, pcm["b"])}, "mixed": {None: alone(state, pcm["mixed"]),
                                                          (B,): alone(state, pcm["mixed"], [B])},
            "noise": {None: alone(state, pcm["noise"])}}
    # the streams differ, so a stream given another's events (or state) shows
    assert {n for n, _ in want["a"][None]} == {A} and {n for n, _ in want["b"][None]} == {B}
    assert {n for n, _ in want["mixed"][None]} == {A, B} and {n for n, _ in want["mixed"][(B,)]} == {B}
    assert want["noise"][None] == []
    srv = WakeServer(Device(state), "tcp://127.0.0.1:0").start()
    try:
        port = port_of(srv.uri)

        async def together():
            return await asyncio.gather(*(stream(port, pcm[s], names=names, rate=rate, channels=ch)
                                          for s, names, rate, ch in plan))

        got = run(together())
        for (s, names, rate, _), events in zip(plan, got):
            assert not [e for e in events if e.type == "error"], events
            if rate == 16000:
                expect = want[s][tuple(names) if names else None]
                assert detections(events) == expect, (s, names)
                assert bool([e for e in events if e.type == "not-detected"]) == (not expect)
        # 22.05 kHz stereo: the same keywords at the same places (resampled audio is not the same samples)
        t22 = detections(got[5])
        assert [n for n, _ in t22] == [n for n, _ in want["a"][None]]
        assert [t for _, t in t22] == pytest.approx([t for _, t in want["a"][None]], abs=60)
        assert srv.loads == 3  # one model set per keyword selection, not one per connection
        st = srv.stats()
        assert st["sets"] == 3 and st["streams"] == len(plan)
        assert st["connections"] == len(plan)
        assert st["detections"] == sum(len(detections(e)) for e in got)
        again = run(together())  # and a second round of streams uses the same sets
        assert [detections(e) for e in again] == [detections(e) for e in got]
        assert srv.loads == 3 and srv.stats()["streams"] == 2 * len(plan)
    finally:
        srv.stop()


def test_pushes_from_many_threads_through_one_model_set_give_each_streams_own_events(tmp_path, two):
    """The shared interpreter under its lock: eight threads pushing at once, as fast as they can,
    get the events (keyword, time, score) each stream gets pushed alone."""
    a, b, pcm = two
    state = tmp_path / "st"
    Device(state).enroll(A, a)
    Device(state).enroll(B, b)
    srv = WakeServer(Device(state), "tcp://127.0.0.1:0")
    ms = srv.model_set(None)
    streams = [pcm[k] for k in ("a", "b", "mixed", "noise")] * 2
    streams = [s if i < 4 else np.roll(s, 7919 * i) for i, s in enumerate(streams)]  # eight different streams

    def events_of(pcm_):
        det, out = ms.detector(), []
        for i in range(0, len(pcm_), 1024):
            out += ms.push(det, pcm_[i:i + 1024])
        return out + ms.flush(det)

    want = [events_of(s) for s in streams]
    assert sum(map(len, want)) >= 8
    got = [None] * len(streams)
    go = threading.Barrier(len(streams))

    def worker(i):
        go.wait()
        got[i] = events_of(streams[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == want
    assert srv.loads == 1 and ms.streams == 2 * len(streams)
    assert ms.pushes == 2 * sum(-(-len(s) // 1024) + 1 for s in streams)  # every push and flush held the lock


def test_a_state_change_loads_new_models_for_the_next_stream_and_leaves_one_in_flight_alone(tmp_path, two):
    """A keyword enrolled while a stream runs: that stream ends on the models it started with
    (exactly its events from before), a stream started after it, on another connection or the
    same one, detects the new keyword; a sensitivity changed, a new Device (the agent's version
    switch) or the adapt pointer rewritten loads again; nothing changed, nothing is loaded."""
    a, b, pcm = two
    state = tmp_path / "st"
    Device(state).enroll(A, a)
    before = alone(state, pcm["mixed"])
    assert {n for n, _ in before} == {A}
    srv = WakeServer(Device(state), "tcp://127.0.0.1:0").start()
    try:
        port = port_of(srv.uri)
        half = len(pcm["mixed"]) // 2

        async def main():
            async with AsyncTcpClient("127.0.0.1", port) as slow:
                await send_stream(slow, pcm["mixed"][:half], stop=False)  # in flight, on the old models
                early = await until_pong(slow)  # its chunks so far have been pushed
                loads = srv.loads
                await asyncio.get_running_loop().run_in_executor(None, lambda: Device(state).enroll(B, b))
                other = await stream(port, pcm["mixed"])  # a new stream: the new keyword
                for i in range(half, len(pcm["mixed"]), 1024):
                    await slow.write_event(AudioChunk(rate=16000, width=2, channels=1,
                                                      audio=pcm["mixed"][i:i + 1024].tobytes()).event())
                await slow.write_event(AudioStop().event())
                first = early + await until_pong(slow)
                await send_stream(slow, pcm["mixed"])  # the same connection's next stream
                second = await until_pong(slow)
                return loads, first, other, second

        loads, first, other, second = run(main())
        after = alone(state, pcm["mixed"])
        assert {n for n, _ in after} == {A, B}
        assert detections(first) == before  # the stream in flight: untouched by the reload
        assert detections(other) == after and detections(second) == after
        assert srv.loads == loads + 1

        n = srv.loads
        assert detections(run(stream(port, pcm["mixed"]))) == after and srv.loads == n  # unchanged: shared
        Device(state).sensitivity(B, "high")  # rewrites keywords.json
        assert detections(run(stream(port, pcm["mixed"]))) == alone(state, pcm["mixed"])
        assert srv.loads == n + 1
        srv.device = Device(state)  # what the agent does when it switches to a new version
        assert detections(run(stream(port, pcm["mixed"]))) == alone(state, pcm["mixed"])
        assert srv.loads == n + 2
        Device(state).use(None)  # the adapt pointer rewritten (`device use`: the base model)
        assert (state / "adapt" / "active.json").is_file()
        assert detections(run(stream(port, pcm["mixed"]))) == alone(state, pcm["mixed"])
        assert srv.loads == n + 3
    finally:
        srv.stop()


def test_a_state_that_cannot_be_loaded_is_one_sentence_for_that_stream(tmp_path, two):
    """keywords.json broken while the server runs: a stream starting then gets one error, a
    sentence naming the file and the fix, and not-detected at its end (its chunks no more errors);
    the connection goes on, and once the file is back the next stream detects again."""
    a, _, pcm = two
    state = tmp_path / "st"
    Device(state).enroll(A, a)
    want = alone(state, pcm["a"], [A])
    srv = WakeServer(Device(state), "tcp://127.0.0.1:0").start()
    try:
        port = port_of(srv.uri)
        kw = state / "keywords.json"
        good = tmp_path / "keywords.good"
        shutil.copy(kw, good)

        async def main():
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await describe(client)
                # a hand edit that parses (bytes that are not JSON are rebuilt from the kept clips:
                # tests/test_keywords_rebuild.py)
                kw.write_text('{"format": 99, "keywords": []}')
                await send_stream(client, pcm["a"], names=[A])
                broken = await until_pong(client)
                shutil.copy(good, kw)
                await send_stream(client, pcm["a"], names=[A])
                return broken, await until_pong(client)

        broken, fixed = run(main())
        assert [e.type for e in broken] == ["error", "not-detected"], broken
        text = broken[0].data["text"]
        assert "keywords.json" in text and "enrol" in text and "\n" not in text and "Traceback" not in text
        assert broken[0].data["code"] == "device-error"
        assert detections(fixed) == want
    finally:
        srv.stop()
