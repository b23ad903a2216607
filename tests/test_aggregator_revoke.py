"""`edgelearn aggregator revoke --state ST DEVICE_ID`: a stolen device's key is refused from then on.

Against a live ``aggregator serve`` on loopback (SQLite, and two replicas on one PostgreSQL
database): the revocation, run beside the serving process, is seen by its next request from that
device (check-in, upload, chunk: 403 ``DeviceRevoked``, one sentence with the date); the device's
update already accepted by the open round is taken back (the round closes from the other devices'
updates only, and needs one more to reach its quorum); the other devices carry on; ``aggregator
status`` lists the revoked device; ``provision`` again re-enables it with a new key while the old
key file stays refused; an unknown id is one sentence, rc 2. The Linux client raises
``DeviceRevoked``, which the agent's back-off takes for a refused credential
(``edge.agent_federation.refused_credentials``).
"""

from __future__ import annotations

import http.client
import io
import json
import signal

import numpy as np
import pytest

from aggregator_helpers import FIRST, post, signed_checkin, start
from edge.agent_federation import refused_credentials
from edge.fl import FLClient
from edge.fl.transport import DeviceRevoked, HttpTransport
from edge.keys import load_hmac_key
from edge.portable.chunks import iter_chunks
from host.aggregator.config import AggregatorConfig
from host.aggregator.inprocess import make_state, small_params
from host.aggregator.models import load_params
from host.aggregator.store import open_store
from host.netutil import free_port
from agent_helpers import run_refused_agent
from pg_helpers import db_url, fedavg, frame, pg  # noqa: F401 (pg: the fixture)
from test_aggregator_cli_checks import edgelearn, one_sentence
from test_agent import aggregator  # noqa: F401 (fixture: a real aggregator on loopback, device pi-0)

UP = {"Content-Type": "application/octet-stream"}


def _up(port, dev, body, path="/v1/updates"):
    return post(port, path, body, {**UP, "X-Edgelearn-Device": dev})


def _get_json(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def _revoked_403(status, ans, dev):
    assert status == 403 and ans["error"] == "DeviceRevoked", (status, ans)
    assert ans["problem"].startswith(f"device {dev!r} was revoked on 20") and "UTC" in ans["problem"], ans
    assert "provision it again to rejoin" in ans["problem"] and "aggregator provision" in ans["fix"], ans


def _stop(proc):
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def test_revoking_beside_a_running_serve_refuses_the_device_drops_its_update_and_serves_the_others(tmp_path):
    # quorum 2 from 3 selected: without the revocation dev1's upload would close round 1 with dev0's update
    cfg = AggregatorConfig(clients_per_round=2, overselect=1.5, max_overselect=1.5, round_timeout=3600,
                           chunk_size=256)
    state, keys = make_state(tmp_path, cfg, n_devices=4)
    port = free_port()
    proc = start(state, port)
    try:
        frames = {}
        for i, d in enumerate(["dev0", "dev1", "dev2"]):
            s, ans = post(port, "/v1/checkin", *signed_checkin(d, keys[d]))
            assert s == 200 and ans["action"] == "train", ans
            frames[d] = frame(d, keys[d], ans["task"], seed=i)
        task = ans["task"]
        s, ans = _up(port, "dev0", frames["dev0"])
        assert (s, ans["status"], ans["accepted"]) == (200, "accepted", 1), ans

        res = edgelearn("aggregator", "revoke", "--state", str(state), "dev0", cwd=tmp_path, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "revoked dev0 on 20" in res.stdout and "update in open round 1 was taken back" in res.stdout, res.stdout

        # every request signed with dev0's key is refused: check-in, a resend of its accepted frame, a new
        # frame, a chunk (chunks are refused before anything of a revoked id is stored)
        _revoked_403(*post(port, "/v1/checkin", *signed_checkin("dev0", keys["dev0"])), "dev0")
        _revoked_403(*_up(port, "dev0", frames["dev0"]), "dev0")
        _revoked_403(*_up(port, "dev0", frame("dev0", keys["dev0"], task, seed=7, seq=2)), "dev0")
        big = frame("dev0", keys["dev0"], task, seed=8, seq=3)
        _revoked_403(*_up(port, "dev0", next(iter(iter_chunks(big, 256))), "/v1/chunks"), "dev0")
        # a request not signed with its key is still just unauthenticated (no news for a stranger)
        body, hdrs = signed_checkin("dev0", b"\x01" * 32)
        s, ans = post(port, "/v1/checkin", body, hdrs)
        assert (s, ans["error"]) == (401, "AuthError"), ans

        # the device's own client: DeviceRevoked, which the agent backs off from as a refused key
        http = HttpTransport(f"http://127.0.0.1:{port}")
        c = FLClient(http, "dev0", keys["dev0"], tmp_path / "c0", trusted_keys=state / "keys")
        with pytest.raises(DeviceRevoked, match=r"-> 403: device 'dev0' was revoked on .*provision it again") as ei:
            c.run_once({"battery": 1.0, "charging": True, "network": "wifi"})
        assert refused_credentials(ei.value) and ei.value.status == 403 and ei.value.reason == "DeviceRevoked"
        http.close()

        # `status` (beside serve) lists it; the open round no longer counts its update
        res = edgelearn("aggregator", "status", "--state", str(state), cwd=tmp_path, timeout=120)
        st = json.loads(res.stdout)
        assert [r["device_id"] for r in st["revoked"]] == ["dev0"] and st["revoked"][0]["revoked"].endswith("UTC")
        assert st["round"]["round_id"] == 1 and st["round"]["accepted"] == 0, st["round"]

        # the others carry on: dev1 is the round's first update now, dev2 its quorum
        s, ans = _up(port, "dev1", frames["dev1"])
        assert (s, ans["status"], ans["accepted"]) == (200, "accepted", 1), ans
        assert _get_json(port, "/v1/status")[1]["current_version"] == FIRST  # not closed by dev0's update
        s, ans = _up(port, "dev2", frames["dev2"])
        assert (s, ans["status"], ans["accepted"]) == (200, "accepted", 2), ans
        st = _get_json(port, "/v1/status")[1]
        r1 = next(r for r in st["rounds"] if r["round_id"] == 1)
        assert (r1["status"], r1["accepted"], r1["result_version"]) == ("closed", 2, FIRST + 1), r1
        assert "revoked" not in st  # the unauthenticated HTTP status names no device
        s, ans = post(port, "/v1/checkin", *signed_checkin("dev3", keys["dev3"]))
        assert s == 200 and ans["action"] == "train", ans
    finally:
        _stop(proc)
    head = load_params(state / "models" / f"v{FIRST + 1}.npz")
    want = fedavg(small_params(), {d: frames[d] for d in ("dev1", "dev2")}, keys)
    for k in want:  # exactly dev1's and dev2's updates: dev0's was taken back
        np.testing.assert_allclose(head[k], want[k], atol=1e-5)
    store = open_store(None, state)
    try:
        assert store.one("SELECT rounds_joined, revoked IS NOT NULL FROM devices WHERE device_id='dev0'") == (0, 1)
        assert store.one("SELECT COUNT(*) FROM contributions WHERE device_id='dev0'")[0] == 0
    finally:
        store.close()


def test_provisioning_a_revoked_device_again_gives_it_a_new_key_and_the_old_one_stays_refused(tmp_path):
    cfg = AggregatorConfig(clients_per_round=2, overselect=1.0, max_overselect=1.0, round_timeout=3600)
    state, keys = make_state(tmp_path, cfg, n_devices=3)
    # revoked while nothing serves the state; `serve` starts with it revoked
    res = edgelearn("aggregator", "revoke", "--state", str(state), "dev0", cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and "revoked dev0" in res.stdout and "taken back" not in res.stdout, res.stdout
    res = edgelearn("aggregator", "revoke", "--state", str(state), "dev0", cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and "dev0 was already revoked on" in res.stdout, res.stdout + res.stderr
    one_sentence(edgelearn("aggregator", "revoke", "--state", str(state), "pi-nobody", cwd=tmp_path, timeout=120),
                 "device 'pi-nobody' is not provisioned", "aggregator provision")
    one_sentence(edgelearn("aggregator", "provision", "--state", str(state), "--device", "dev1", "--out",
                           str(tmp_path / "k"), cwd=tmp_path, timeout=120), "already provisioned", "revoke")
    port = free_port()
    proc = start(state, port)
    try:
        _revoked_403(*post(port, "/v1/checkin", *signed_checkin("dev0", keys["dev0"])), "dev0")
        # dev1 uploads with its key cached by the serving process (uploads use the cache)...
        s, ans = post(port, "/v1/checkin", *signed_checkin("dev1", keys["dev1"]))
        assert s == 200 and ans["action"] == "train", ans
        task = ans["task"]
        s, ans = _up(port, "dev1", frame("dev1", keys["dev1"], task, seed=1))
        assert (s, ans["status"]) == (200, "accepted"), ans
        # ... then is revoked and provisioned again by other processes while it serves: a frame signed
        # with the cached old key is refused inside the accepting transaction
        assert edgelearn("aggregator", "revoke", "--state", str(state), "dev1", cwd=tmp_path,
                         timeout=120).returncode == 0
        res = edgelearn("aggregator", "provision", "--state", str(state), "--device", "dev1", "--out",
                        str(tmp_path / "k"), cwd=tmp_path, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        s, ans = _up(port, "dev1", frame("dev1", keys["dev1"], task, seed=2, seq=5))
        assert (s, ans["error"]) == (401, "AuthError") and "no longer this device's" in ans["problem"], ans

        res = edgelearn("aggregator", "provision", "--state", str(state), "--device", "dev0", "--out",
                        str(tmp_path / "k"), cwd=tmp_path, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        new = load_hmac_key(tmp_path / "k" / "dev0.hmac")
        assert new != keys["dev0"]
        s, ans = post(port, "/v1/checkin", *signed_checkin("dev0", keys["dev0"]))  # the old key file
        assert (s, ans["error"]) == (401, "AuthError"), ans
        st = json.loads(edgelearn("aggregator", "status", "--state", str(state), cwd=tmp_path, timeout=120).stdout)
        assert st["revoked"] == []
        # the new key works at once: a check-in, a task, an accepted update, counted by the round
        s, ans = post(port, "/v1/checkin", *signed_checkin("dev0", new))
        assert s == 200 and ans["action"] == "train", ans
        s, ans = _up(port, "dev0", frame("dev0", new, ans["task"], seed=3))
        assert (s, ans["status"]) == (200, "accepted"), ans
        new1 = load_hmac_key(tmp_path / "k" / "dev1.hmac")
        s, ans = post(port, "/v1/checkin", *signed_checkin("dev1", new1))
        assert s == 200 and ans["action"] == "train", ans
        s, ans = _up(port, "dev1", frame("dev1", new1, ans["task"], seed=4))
        assert (s, ans["status"], ans["accepted"]) == (200, "accepted", 2), ans
        st = _get_json(port, "/v1/status")[1]
        r1 = next(r for r in st["rounds"] if r["round_id"] == 1)
        assert (r1["status"], r1["accepted"], r1["result_version"]) == ("closed", 2, FIRST + 1), r1
    finally:
        _stop(proc)


def test_two_postgresql_replicas_refuse_a_revoked_device_and_close_the_round_without_its_update(pg, request,
                                                                                                 tmp_path):
    url = db_url(pg, request)
    cfg = AggregatorConfig(clients_per_round=2, overselect=1.5, max_overselect=1.5, round_timeout=3600)
    state, keys = make_state(tmp_path, cfg, n_devices=4, db=url)
    key = next((state / "keys").glob("*.key"))
    ports = [free_port(), free_port()]
    procs = [start(state, ports[0], "--db", url, "--signing-key", key),
             start(tmp_path / "replica-b", ports[1], "--db", url, "--signing-key", key)]
    a, b = ports
    try:
        frames = {}
        for i, d in enumerate(["dev0", "dev1", "dev2"]):
            s, ans = post(ports[i % 2], "/v1/checkin", *signed_checkin(d, keys[d]))
            assert s == 200 and ans["action"] == "train", ans
            frames[d] = frame(d, keys[d], ans["task"], seed=10 + i)
        task = ans["task"]
        s, ans = _up(a, "dev0", frames["dev0"])  # replica A holds dev0's update in its running sum
        assert (s, ans["status"], ans["accepted"]) == (200, "accepted", 1), ans
        # dev3's key is cached by A (a check-in) before it is revoked and provisioned again
        assert post(a, "/v1/checkin", *signed_checkin("dev3", keys["dev3"]))[0] == 200

        res = edgelearn("aggregator", "revoke", "--state", str(tmp_path / "cli"), "--db", url, "dev0",
                        cwd=tmp_path, timeout=120)
        assert res.returncode == 0 and "update in open round 1 was taken back" in res.stdout, res.stdout + res.stderr
        for port in ports:
            _revoked_403(*post(port, "/v1/checkin", *signed_checkin("dev0", keys["dev0"])), "dev0")
        # A had dev0's key cached as valid: the upload is refused inside its accepting transaction
        _revoked_403(*_up(a, "dev0", frame("dev0", keys["dev0"], task, seed=20, seq=2)), "dev0")
        st = json.loads(edgelearn("aggregator", "status", "--state", str(tmp_path / "cli"), "--db", url,
                                  cwd=tmp_path, timeout=120).stdout)
        assert [r["device_id"] for r in st["revoked"]] == ["dev0"] and st["round"]["accepted"] == 0, st

        s, ans = _up(b, "dev1", frames["dev1"])
        assert (s, ans["status"], ans["accepted"]) == (200, "accepted", 1), ans
        s, ans = _up(a, "dev2", frames["dev2"])  # A closes the round: its sum is rebuilt without dev0
        assert (s, ans["status"], ans["accepted"]) == (200, "accepted", 2), ans
        for port in ports:
            st = _get_json(port, "/v1/status")[1]
            r1 = next(r for r in st["rounds"] if r["round_id"] == 1)
            assert (r1["status"], r1["accepted"], r1["result_version"]) == ("closed", 2, FIRST + 1), r1

        assert edgelearn("aggregator", "revoke", "--state", str(tmp_path / "cli"), "--db", url, "dev3",
                         cwd=tmp_path, timeout=120).returncode == 0
        res = edgelearn("aggregator", "provision", "--state", str(tmp_path / "cli"), "--db", url, "--device",
                        "dev3", "--out", str(tmp_path / "k"), cwd=tmp_path, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        t2 = {"round_id": 2, "model_version": FIRST + 1}
        s, ans = _up(a, "dev3", frame("dev3", keys["dev3"], t2, seed=21))  # A's cache: the old key, valid
        assert (s, ans["error"]) == (401, "AuthError"), ans
        s, ans = post(b, "/v1/checkin", *signed_checkin("dev3", load_hmac_key(tmp_path / "k" / "dev3.hmac")))
        assert s == 200 and ans["action"] == "train", ans
    finally:
        for p in procs:
            _stop(p)
    store = open_store(url, tmp_path)
    try:
        head = load_params(io.BytesIO(store.get_file(f"models/v{FIRST + 1}.npz")))
        assert store.one("SELECT rounds_joined FROM devices WHERE device_id='dev0'")[0] == 0
    finally:
        store.close()
    want = fedavg(small_params(), {d: frames[d] for d in ("dev1", "dev2")}, keys)
    for k in want:
        np.testing.assert_allclose(head[k], want[k], atol=1e-5)


def test_revoke_refuses_a_state_without_an_aggregator(tmp_path):
    one_sentence(edgelearn("aggregator", "revoke", "--state", str(tmp_path / "nope"), "dev0", cwd=tmp_path,
                           timeout=120), "no aggregator here", "aggregator init")
    assert not (tmp_path / "nope").exists()



def test_the_agent_of_a_revoked_device_records_it_and_backs_off(tmp_path, aggregator):  # noqa: F811
    """The device agent (edge/agent_federation.py, unchanged) against a live aggregator that revoked
    its key: agent.json's ``federation`` records the revocation and check-ins back off exponentially
    (capped at 10 intervals), as for any refused key; detection goes on. A simulated clock, one
    second per chunk, each check-in awaited (tests/test_qa4_agent.py's refused-key test)."""
    from edge.device import Device

    res = edgelearn("aggregator", "revoke", "--state", str(aggregator["state"]), "pi-0", cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    state = tmp_path / "st"
    Device(state)
    pcm = (np.random.default_rng(0).standard_normal(1600) * 100).astype(np.int16)
    agent, tries, mid = run_refused_agent(state, aggregator, aggregator["key"], pcm)
    fed = mid["federation"]
    assert "-> 403: device 'pi-0' was revoked on 20" in fed["error"] and fed["refusals"] >= 3, fed
    gaps = np.diff(tries)
    assert len(tries) <= 12, tries  # every second without the back-off: 80
    assert list(gaps) == sorted(gaps) and gaps.max() <= 11, tries
    assert agent.status["state"] == "stopped"
