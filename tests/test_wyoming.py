"""The Wyoming wake-word server (edge/wyoming.py, `edgelearn wyoming`) against the `wyoming`
library's own async TCP client on loopback, with the events Home Assistant sends: describe, then
per stream detect(names), audio-start, 1,024-sample audio-chunks, audio-stop.

A ``ping`` after ``audio-stop`` is the tests' barrier: the server answers events in order, so every
detection of the stream has arrived once its ``pong`` has."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from devstate_helpers import make_keyword_clips

wyoming = pytest.importorskip("wyoming")

from wyoming.audio import AudioChunk, AudioStart, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.event import Event, async_read_event, async_write_event  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.ping import Ping  # noqa: E402
from wyoming.wake import Detect, Detection  # noqa: E402

from edge.audio import read_wav  # noqa: E402
from edge.device import Device  # noqa: E402
from edge.wyoming import WakeServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "edge.cli"]
KW = "hey edge"
TIMEOUT = 120


def keyword_stream(clips, seed: int = 8) -> np.ndarray:
    """Noise with the buzz keyword said three times (its ends at 1.625, 4.875 and 8.125 s)."""
    rng = np.random.default_rng(seed)
    kw = read_wav(clips[0])
    noise = lambda n: rng.standard_normal(n) * 100  # noqa: E731
    return np.concatenate([noise(16000), kw, noise(40000), kw, noise(40000), kw, noise(16000)]).astype(np.int16)


def noise_stream(seconds: float = 3.0, seed: int = 9) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 100).astype(np.int16)


def to_format(pcm: np.ndarray, rate: int, channels: int) -> np.ndarray:
    """16 kHz mono int16 -> ``rate`` Hz, ``channels`` interleaved int16 (band-limited: the whole
    stream's spectrum, zero-padded)."""
    if rate != 16000:
        n = int(round(len(pcm) * rate / 16000))
        spec = np.fft.rfft(pcm.astype(np.float64))
        pcm = np.clip(np.fft.irfft(spec, n) * n / len(pcm), -32768, 32767).round().astype(np.int16)
    return np.repeat(pcm, channels) if channels > 1 else pcm


@pytest.fixture(scope="module")
def enrolled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wyoming")
    clips = make_keyword_clips(tmp / "kwclips")
    Device(tmp / "st").enroll(KW, clips)
    pcm = keyword_stream(clips)
    want = list(Device(tmp / "st").detect(pcm, replay=False))
    assert [e["keyword"] for e in want] == [KW] * 3
    assert [e["time_s"] for e in want] == pytest.approx([1.625, 4.875, 8.125], abs=0.05)
    return tmp / "st", pcm, want


@pytest.fixture(scope="module")
def server(enrolled):
    srv = WakeServer(Device(enrolled[0]), "tcp://127.0.0.1:0").start()
    yield srv
    srv.stop()


def port_of(uri: str) -> int:
    return int(uri.rsplit(":", 1)[1])


async def describe(client) -> Info:
    await client.write_event(Describe().event())
    ev = await client.read_event()
    assert Info.is_type(ev.type), ev
    return Info.from_event(ev)


async def send_stream(client, pcm, rate=16000, channels=1, names=None, chunk=1024, stop=True):
    """Home Assistant's stream: detect, audio-start, chunks of ``chunk`` samples, audio-stop."""
    await client.write_event(Detect(names=names).event())
    await client.write_event(AudioStart(rate=rate, width=2, channels=channels).event())
    data = to_format(pcm, rate, channels)
    step = chunk * channels
    for i in range(0, len(data), step):
        await client.write_event(AudioChunk(rate=rate, width=2, channels=channels,
                                            audio=data[i:i + step].tobytes()).event())
    if stop:
        await client.write_event(AudioStop().event())


async def until_pong(client) -> list[Event]:
    """Every event up to the answer to a ping sent now."""
    await client.write_event(Ping(text="barrier").event())
    out = []
    while True:
        ev = await asyncio.wait_for(client.read_event(), TIMEOUT)
        assert ev is not None, "the server closed the connection"
        if ev.type == "pong":
            return out
        out.append(ev)


async def one_stream(port, pcm, **kw) -> list[Event]:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await describe(client)
        await send_stream(client, pcm, **kw)
        return await until_pong(client)


def detections(events):
    return [(Detection.from_event(e).name, Detection.from_event(e).timestamp) for e in events
            if Detection.is_type(e.type)]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 4 * TIMEOUT))


def test_describe_lists_the_enrolled_and_the_base_keywords_as_wake_models(server):
    async def main():
        async with AsyncTcpClient("127.0.0.1", port_of(server.uri)) as client:
            return await describe(client)

    info = run(main())
    (program,) = info.wake
    assert program.name == "edgelearn" and program.installed
    names = [m.name for m in program.models]
    assert names[0] == KW and "yes" in names and "_silence_" not in names and "_unknown_" not in names
    for m in program.models:
        assert m.phrase == m.name and m.languages == ["en"] and m.installed
        assert m.attribution.name == "edgelearn" and m.version


def test_home_assistants_flow_gives_one_detection_per_keyword_at_its_end(server, enrolled):
    _, pcm, want = enrolled
    events = run(one_stream(port_of(server.uri), pcm, names=[KW]))
    assert detections(events) == [(KW, int(round(e["time_s"] * 1000))) for e in want]
    assert not [e for e in events if e.type == "not-detected"]  # something fired
    assert not [e for e in events if e.type == "error"], events


def test_22khz_stereo_gives_the_same_detections(server, enrolled):
    _, pcm, want = enrolled
    events = run(one_stream(port_of(server.uri), pcm, rate=22050, channels=2, names=[KW]))
    got = detections(events)
    assert [n for n, _ in got] == [KW] * len(want)
    assert [t for _, t in got] == pytest.approx([e["time_s"] * 1000 for e in want], abs=60)


def test_a_stream_without_the_keyword_ends_in_not_detected(server):
    events = run(one_stream(port_of(server.uri), noise_stream(), names=[KW]))
    assert [e.type for e in events] == ["not-detected"]


def test_detect_names_limit_what_is_reported(server, enrolled):
    _, pcm, _ = enrolled
    events = run(one_stream(port_of(server.uri), pcm, names=["yes"]))  # a base keyword only: the buzz is not it
    assert [e.type for e in events] == ["not-detected"]
    events = run(one_stream(port_of(server.uri), pcm, names=["no such word", KW]))
    assert [e.type for e in events][0] == "error" and "no such word" in events[0].data["text"]
    assert [n for n, _ in detections(events)] == [KW] * 3


def test_several_clients_at_once_each_get_their_own_detections(server, enrolled):
    _, pcm, want = enrolled
    quiet = noise_stream(len(pcm) / 16000)

    async def main():
        return await asyncio.gather(one_stream(port_of(server.uri), pcm, names=[KW]),
                                    one_stream(port_of(server.uri), quiet, names=[KW]),
                                    one_stream(port_of(server.uri), pcm, rate=22050, channels=2))

    a, b, c = run(main())
    assert detections(a) == [(KW, int(round(e["time_s"] * 1000))) for e in want]
    assert [e.type for e in b] == ["not-detected"]
    assert [n for n, _ in detections(c)] == [KW] * 3


def test_a_client_that_disconnects_mid_stream_leaves_the_server_serving(server, enrolled):
    _, pcm, want = enrolled

    async def main():
        async with AsyncTcpClient("127.0.0.1", port_of(server.uri)) as client:
            await send_stream(client, pcm[: len(pcm) // 2], names=[KW], stop=False)
        # gone without audio-stop; a half-written event too
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server.uri))
        writer.write(b'{"type": "audio-chunk", "data_length": 40, "payload_length": 2048}\n{"rate": 16')
        await writer.drain()
        writer.close()
        return await one_stream(port_of(server.uri), pcm, names=[KW])

    events = run(main())
    assert detections(events) == [(KW, int(round(e["time_s"] * 1000))) for e in want]


def test_malformed_events_get_one_error_each_and_the_connection_goes_on(server, enrolled):
    _, pcm, want = enrolled

    async def main():
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server.uri))
        got = []
        for bad in (b"this is not json\n", b'{"no": "type"}\n'):
            writer.write(bad)
            await writer.drain()
            got.append(await asyncio.wait_for(async_read_event(reader), TIMEOUT))
        for ev in (Event(type="transcribe", data={}),  # an event of another service
                   AudioChunk(rate=16000, width=2, channels=1, audio=pcm[:1024].tobytes()).event(),
                   AudioStop().event()):
            await async_write_event(ev, writer)
            got.append(await asyncio.wait_for(async_read_event(reader), TIMEOUT))
        writer.close()
        return got

    errors = run(main())
    assert [e.type for e in errors] == ["error"] * 5
    assert [e.data["code"] for e in errors] == ["bad-event", "bad-event", "unknown-event", "not-streaming",
                                                "not-streaming"]
    assert "audio-chunk before audio-start" in errors[3].data["text"]
    # the same server (and a connection that had errors) still detects
    events = run(one_stream(port_of(server.uri), pcm, names=[KW]))
    assert detections(events) == [(KW, int(round(e["time_s"] * 1000))) for e in want]

    async def same_connection():
        async with AsyncTcpClient("127.0.0.1", port_of(server.uri)) as client:
            await client.write_event(Event(type="nonsense"))
            first = await client.read_event()
            await send_stream(client, pcm, names=[KW])
            return first, await until_pong(client)

    first, events = run(same_connection())
    assert first.type == "error" and [n for n, _ in detections(events)] == [KW] * 3


def test_a_keyword_enrolled_while_the_server_runs_is_offered_and_detected(tmp_path):
    """`edgelearn device enroll` writes keywords.json; the running server offers the keyword from
    the next describe and detects it from the next stream on."""
    state = tmp_path / "st"
    clips = make_keyword_clips(tmp_path / "kwclips")
    pcm = keyword_stream(clips)
    srv = WakeServer(Device(state), "tcp://127.0.0.1:0").start()
    try:
        async def before():
            async with AsyncTcpClient("127.0.0.1", port_of(srv.uri)) as client:
                info = await describe(client)
                await send_stream(client, pcm)
                return info, await until_pong(client)

        info, events = run(before())
        assert KW not in [m.name for m in info.wake[0].models]
        assert not [n for n, _ in detections(events) if n == KW]
        Device(state).enroll(KW, clips)  # another Device: as the CLI would, beside the server

        async def after():
            async with AsyncTcpClient("127.0.0.1", port_of(srv.uri)) as client:
                info = await describe(client)
                await send_stream(client, pcm, names=[KW])
                return info, await until_pong(client)

        info, events = run(after())
        assert KW in [m.name for m in info.wake[0].models]
        assert [n for n, _ in detections(events)] == [KW] * 3
    finally:
        srv.stop()


def test_edgelearn_wyoming_serves_home_assistants_flow(enrolled):
    state, pcm, want = enrolled
    proc = subprocess.Popen(CLI + ["wyoming", "--uri", "tcp://127.0.0.1:0", "--state", str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        ready = json.loads(line)
        assert ready["models"][0] == KW
        events = run(one_stream(port_of(ready["uri"]), pcm, names=[KW]))
        assert detections(events) == [(KW, int(round(e["time_s"] * 1000))) for e in want]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_bad_uri_is_one_sentence(tmp_path):
    r = subprocess.run(CLI + ["wyoming", "--uri", "http://x", "--state", str(tmp_path / "st")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "tcp://HOST:PORT" in r.stderr


def test_without_the_wyoming_package_it_is_one_sentence(tmp_path):
    code = ("import sys; sys.modules['wyoming'] = None\n"
            "from edge.cli import main\n"
            f"sys.exit(main(['wyoming', '--uri', 'tcp://127.0.0.1:0', '--state', {str(tmp_path / 'st')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "edgelearn[wyoming]" in r.stderr


def test_the_agent_serves_wyoming_in_its_own_process(enrolled, tmp_path, capsys):
    """`device run --wyoming URI` without local audio: the agent's loop runs (status, ticks) and its
    Wyoming server answers Home Assistant's event flow with the state's keywords; stopping the
    agent stops the server. Without any audio source or --wyoming the command says what to pass."""
    import shutil
    import threading
    import time

    from edge.agent import Agent, AgentConfig, read_status
    from edge.cli import main

    st = tmp_path / "st"
    shutil.copytree(enrolled[0], st)
    agent = Agent(st, AgentConfig(source="none", wyoming="tcp://127.0.0.1:0", status_every_s=0.2),
                  out=open(os.devnull, "w"))
    th = threading.Thread(target=agent.run, daemon=True)
    th.start()
    deadline = time.monotonic() + TIMEOUT
    while agent.wyoming is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert agent.wyoming is not None, "the agent did not start its Wyoming server"
    uri = agent.wyoming.uri
    events = run(one_stream(port_of(uri), enrolled[1]))
    got = detections(events)
    assert [n for n, _ in got] == [KW] * 3
    assert [t / 1000 for _, t in got] == pytest.approx([e["time_s"] for e in enrolled[2]], abs=0.05)
    def served():
        ws = (read_status(st) or {}).get("wyoming_stats") or {}
        return ws.get("detections") == 3 and ws.get("open") == 0

    while time.monotonic() < deadline and not served():
        time.sleep(0.05)   # agent.json says what Home Assistant's side got (the client has gone)
    ws = read_status(st)["wyoming_stats"]
    assert ws["connections"] == 1 and ws["open"] == 0 and ws["detections"] == 3 and ws["streams"] == 1
    agent.stop()
    th.join(TIMEOUT)
    assert not th.is_alive()
    assert read_status(st)["wyoming"] == uri and read_status(st)["state"] != "running"
    with pytest.raises(OSError):  # the server went with the agent
        import socket

        socket.create_connection(("127.0.0.1", port_of(uri)), timeout=2).close()
    assert main(["device", "run", "--state", str(st)]) == 2
    assert "--wyoming URI" in capsys.readouterr().err


def test_an_address_it_cannot_listen_at_is_one_sentence(enrolled, tmp_path, capsys):
    """A port another server holds, a unix socket in a directory that does not exist, an address
    that is not this machine's: `edgelearn wyoming` and `device run --wyoming` each say so in one
    sentence (exit 2), and the server already on the port keeps serving."""
    import shutil

    from edge.cli import main

    state = tmp_path / "st"
    shutil.copytree(enrolled[0], state)
    held = WakeServer(Device(state), "tcp://127.0.0.1:0").start()
    try:
        busy = held.uri
        for uri, says in ((busy, "already in use"), (f"unix://{tmp_path}/no/such/dir/sock", "cannot listen at"),
                          ("tcp://192.0.2.1:10400", "not one of this machine's")):
            assert main(["wyoming", "--uri", uri, "--state", str(state)]) == 2, uri
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and says in err and uri in err, err
        assert main(["device", "run", "--state", str(state), "--wyoming", busy]) == 2
        err = capsys.readouterr().err
        assert "already in use" in err and "Traceback" not in err, err
        events = run(one_stream(port_of(busy), enrolled[1]))
        assert [n for n, _ in detections(events)] == [KW] * 3
    finally:
        held.stop()
