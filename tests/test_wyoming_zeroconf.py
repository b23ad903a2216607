"""``--zeroconf [NAME]``: the Wyoming server announced on mDNS as Home Assistant discovers it, for real.

mDNS needs multicast, which this machine's loopback lacks, so the tests build their own network:
two network namespaces (``ip netns``; root), "board" and "home-assistant", joined by a veth pair
with 10.77.0.1 and 10.77.0.2 and a route for 224.0.0.0/4. ``edgelearn wyoming --zeroconf`` (and
``edgelearn device run --wyoming --zeroconf``) runs in the board's; in Home Assistant's, the
``zeroconf`` library's browser (``AsyncServiceBrowser``, then ``AsyncServiceInfo.async_request``,
what Home Assistant's zeroconf integration does) must find ``NAME._wyoming._tcp.local.`` with the
server's port and address, the ``wyoming`` library's ``AsyncTcpClient`` connects to that address
and ``describe`` answers the device's keywords; when the server stops the browser sees the service
removed (mDNS goodbye). Without root or ``ip`` the namespace tests skip here and fail when CI=true.
The refusals (unix://, a bad name, no multicast route, no zeroconf package) are one sentence each.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from ci_helpers import unavailable

pytest.importorskip("wyoming")
pytest.importorskip("zeroconf")

from devstate_helpers import make_keyword_clips  # noqa: E402
from edge.device import Device  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "edge.cli"]
KW = "hey edge"
BOARD_IP, HA_IP = "10.77.0.1", "10.77.0.2"
TIMEOUT = 120  # seconds any one step may take on a loaded machine before the test gives up

# Home Assistant's side: browse _wyoming._tcp.local., resolve the wanted instance (argv[1]; "*": the
# first one), print it, ask it `describe` over TCP at the announced address, print the wake models,
# then wait for the service to be removed and print that.
BROWSER = r'''
import asyncio, json, sys
from zeroconf import ServiceStateChange
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info

TYPE = "_wyoming._tcp.local."

async def main(wanted):
    azc = AsyncZeroconf()
    seen = asyncio.Queue()
    def on_change(zeroconf, service_type, name, state_change):
        seen.put_nowait((name, state_change))
    browser = AsyncServiceBrowser(azc.zeroconf, TYPE, handlers=[on_change])
    name = None
    while name is None:
        n, change = await seen.get()
        if change is ServiceStateChange.Added and wanted in ("*", n):
            name = n
    info = AsyncServiceInfo(TYPE, name)
    while not await info.async_request(azc.zeroconf, 3000):
        pass
    addrs = info.parsed_addresses()
    print(json.dumps({"name": name, "port": info.port, "addresses": addrs}), flush=True)
    async with AsyncTcpClient(addrs[0], info.port) as client:
        await client.write_event(Describe().event())
        ev = await client.read_event()
        while not Info.is_type(ev.type):
            ev = await client.read_event()
    models = [m.name for p in Info.from_event(ev).wake for m in p.models]
    print(json.dumps({"models": models}), flush=True)
    while True:
        n, change = await seen.get()
        if n == name and change is ServiceStateChange.Removed:
            print(json.dumps({"removed": n}), flush=True)
            break
    await browser.async_cancel()
    await azc.async_close()

asyncio.run(asyncio.wait_for(main(sys.argv[1]), float(sys.argv[2])))
'''


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _no_netns_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    return None


@pytest.fixture(scope="module")
def netns():
    """(board namespace, Home Assistant namespace), joined by a veth pair with multicast routes."""
    why = _no_netns_reason()
    if why:
        unavailable(why, "the zeroconf tests")
    tag = uuid.uuid4().hex[:8]
    board, ha = f"el-board-{tag}", f"el-ha-{tag}"
    made = []
    try:
        for ns in (board, ha):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("-n", board, "link", "add", "elv0", "type", "veth", "peer", "name", "elv1", "netns", ha)
        for ns, dev, addr in ((board, "elv0", BOARD_IP), (ha, "elv1", HA_IP)):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "multicast", "on", "up")
            _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", dev)
    except (subprocess.CalledProcessError, OSError) as e:
        for ns in made:
            _ip("netns", "del", ns, check=False)
        msg = f"cannot build the test network ({getattr(e, 'stderr', '') or e})".strip()
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    yield board, ha
    for ns in made:
        _ip("netns", "del", ns, check=False)


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zc")
    Device(tmp / "st").enroll(KW, make_keyword_clips(tmp / "clips"))
    return tmp / "st"


def _in(ns, argv, **kw):
    return subprocess.Popen(["ip", "netns", "exec", ns, *argv], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _line(proc, what: str) -> dict:
    """The next JSON line ``proc`` prints (fails, with its stderr, if it exits or says nothing in time)."""
    ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        raise AssertionError(f"{what}: no answer; stderr: {proc.stderr.read()[-3000:]}")
    return json.loads(line)


def _kill(*procs):
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()


def _port(uri: str) -> int:
    return int(uri.rsplit(":", 1)[1])


def _discover(ha, wanted, server, port, models):
    """Home Assistant's side, until the server stops: returns what the browser printed."""
    browser = _in(ha, [sys.executable, "-c", BROWSER, wanted, str(3 * TIMEOUT)])
    try:
        found = _line(browser, "browser (discovery)")
        assert found["port"] == port and found["addresses"] == [BOARD_IP], found
        assert _line(browser, "browser (describe)")["models"] == models
        server.send_signal(signal.SIGTERM)
        assert server.wait(TIMEOUT) == 0, server.stderr.read()
        assert _line(browser, "browser (goodbye)") == {"removed": found["name"]}
        assert browser.wait(TIMEOUT) == 0, browser.stderr.read()
        return found
    finally:
        _kill(browser)


def test_edgelearn_wyoming_zeroconf_is_discovered_described_and_withdrawn(netns, state):
    board, ha = netns
    server = _in(board, CLI + ["wyoming", "--uri", "tcp://0.0.0.0:0", "--state", str(state),
                               "--zeroconf", "kitchen-edge"])
    try:
        ready = _line(server, "edgelearn wyoming")
        assert ready["zeroconf"] == "kitchen-edge._wyoming._tcp.local."
        assert ready["models"][0] == KW
        found = _discover(ha, "kitchen-edge._wyoming._tcp.local.", server, _port(ready["uri"]), ready["models"])
        assert found["name"] == ready["zeroconf"]
    finally:
        _kill(server)


def test_device_run_wyoming_zeroconf_announces_under_the_mac_derived_default_name(netns, state, tmp_path):
    board, ha = netns
    st = tmp_path / "st"
    shutil.copytree(state, st)
    agent = _in(board, CLI + ["device", "run", "--state", str(st), "--wyoming", f"tcp://{BOARD_IP}:0",
                              "--zeroconf", "--no-adapt"])
    try:
        status, deadline = {}, time.monotonic() + TIMEOUT
        while "zeroconf" not in status and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                status = json.loads((st / "agent.json").read_text())
            except (OSError, ValueError):
                pass
        assert "zeroconf" in status, agent.stderr.read() if agent.poll() is not None else status
        # HomeAssistantZeroconf's default: the MAC address (here the board's veth) as 12 hex digits
        assert re.fullmatch(r"[0-9a-f]{12}\._wyoming\._tcp\.local\.", status["zeroconf"]), status
        found = _discover(ha, "*", agent, _port(status["wyoming"]), _models(st))
        assert found["name"] == status["zeroconf"]
    finally:
        _kill(agent)


def _models(st):
    from edge.wyoming import WakeServer

    return WakeServer(Device(st), "tcp://127.0.0.1:0").models()


def test_without_a_multicast_route_it_is_one_sentence(netns, state, tmp_path):
    bare = f"el-bare-{uuid.uuid4().hex[:8]}"
    _ip("netns", "add", bare)
    try:
        _ip("-n", bare, "link", "set", "lo", "up")
        r = subprocess.run(["ip", "netns", "exec", bare, *CLI, "wyoming", "--uri", "tcp://0.0.0.0:0",
                            "--state", str(state), "--zeroconf"], cwd=ROOT, capture_output=True, text=True,
                           timeout=TIMEOUT)
    finally:
        _ip("netns", "del", bare, check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "multicast" in r.stderr, r.stderr


@pytest.mark.parametrize("argv, says", [
    (["wyoming", "--uri", "unix:///tmp/el-zc.sock", "--zeroconf"], "tcp://HOST:PORT"),
    (["wyoming", "--uri", "tcp://127.0.0.1:0", "--zeroconf", "a.b"], "without dots"),
    (["wyoming", "--uri", "tcp://[::1]:0", "--zeroconf"], "IPv6"),
    (["device", "run", "--mic", "--zeroconf"], "--wyoming tcp://HOST:PORT"),
])
def test_what_cannot_be_announced_is_one_sentence(tmp_path, argv, says):
    r = subprocess.run(CLI + argv + ["--state", str(tmp_path / "st")], cwd=ROOT, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr, r.stderr


def test_without_the_zeroconf_package_it_is_one_sentence(tmp_path):
    code = ("import sys; sys.modules['zeroconf'] = None\n"
            "from edge.cli import main\n"
            "sys.exit(main(['wyoming', '--uri', 'tcp://127.0.0.1:0', '--zeroconf', "
            f"'--state', {str(tmp_path / 'st')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "zeroconf" in r.stderr and "edgelearn[wyoming]" in r.stderr


def test_the_service_unit_keeps_the_announcement(tmp_path):
    from edge.agent import AgentConfig, service_unit

    unit = service_unit(tmp_path, AgentConfig(wyoming="tcp://0.0.0.0:10400", zeroconf="kitchen edge"), exe="edgelearn")
    assert "--wyoming tcp://0.0.0.0:10400 --zeroconf 'kitchen edge'" in unit
    assert "--zeroconf" not in service_unit(tmp_path, AgentConfig(wyoming="tcp://0.0.0.0:10400"), exe="edgelearn")
