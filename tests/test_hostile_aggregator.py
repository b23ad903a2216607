"""Hostile input to the aggregator (issue 19, items 5-7): signed check-ins with wrong types, non-finite,
out-of-range or nested values are one 400 that changes nothing and never locks the device out; two
aggregators on one state directory cannot both run; every secret-bearing file is 0600 from creation."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edge.errors import EdgelearnError
from host.aggregator.app import Aggregator, build_app
from aggregator_helpers import FakeClock, serve_cmd, snapshot, start
from host.aggregator.config import AggregatorConfig
from host.aggregator.rounds import Reject
from host.aggregator.inprocess import InProcessTransport, make_state
from host.netutil import free_port

ROOT = Path(__file__).resolve().parents[1]
HYP = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
RAW = "@@raw@@"  # placeholder replaced by a raw JSON token (NaN, Infinity, 1e400, deep nesting)
DEV = "dev0"


# --- the contract, stated independently of the implementation ------------------------------------
def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


VALID = {
    "tier": lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,16}", v) is not None,
    "battery": lambda v: _finite(v) and 0 <= v <= 1,
    "charging": lambda v: isinstance(v, bool),
    "network": lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,32}", v) is not None,
    "temperature": lambda v: _finite(v) and -100 <= v <= 200,
    "model_version": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31,
    "time": lambda v: _finite(v) and 0 <= v <= 2**32,
}
NUMERIC = ("battery", "temperature", "model_version", "time")

scalars = (st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=12))
json_values = st.recursive(st.none() | scalars, lambda c: st.lists(c, max_size=3)
                           | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=6)
non_finite = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e999999"])
# deep enough to exhaust the recursion limit of a naive parser, small enough for the 4096-byte limit
deep = (st.integers(2, 1950).map(lambda n: "[" * n + "]" * n)
        | st.integers(2, 600).map(lambda n: '{"a":' * n + "1" + "}" * n))


def hostile(field: str):
    """A raw JSON value that ``field`` must refuse: wrong type, non-finite, out of range or nested."""
    wrong = json_values.filter(lambda v: v is not None and not VALID[field](v)).map(json.dumps)
    extra = [deep]
    if field in NUMERIC:
        extra.append(non_finite)
        edges = ["-1e-9", "-101", "200.5", "1e300", "4294967297", "2147483648", "-0.5", "1.0000001", "0.5",
                 "true", '"0.5"', "[0.5]", '{"v": 0.5}']
        extra.append(st.sampled_from([x for x in edges if not VALID[field](json.loads(x))]))
    return st.one_of(wrong, *extra)


def body_with(t: float, field: str, raw: str) -> bytes:
    state = {"device_id": DEV, "battery": 1.0, "charging": True, "network": "wifi", "time": t}
    state[field] = RAW
    return json.dumps(state).replace(json.dumps(RAW), raw).encode()


def sign(key: bytes, body: bytes) -> dict:
    return {"X-Edgelearn-Device": DEV, "Content-Type": "application/json",
            "X-Edgelearn-Mac": hmac.new(key, body, hashlib.sha256).hexdigest()}


@pytest.fixture(scope="module")
def agg(tmp_path_factory):
    clock = FakeClock(5000.0)
    state, keys = make_state(tmp_path_factory.mktemp("hostile"), AggregatorConfig(clients_per_round=2), n_devices=2)
    app = build_app(state, clock=clock, tick_interval=0)
    with InProcessTransport(app) as t:
        t.key, t.store, t.next = keys[DEV], app.state.aggregator.store, [1.7e9]
        yield t


def refused_then_accepted(agg, body: bytes, want=400):
    """``body`` is refused with one sentence and changes nothing; then a valid check-in dated as the
    refused one was is accepted (the device is not locked out)."""
    t = agg.next[0]
    before = snapshot(agg.store)
    s, raw = agg.request("POST", "/v1/checkin", body, sign(agg.key, body))
    err = json.loads(raw)
    assert s == want, (s, err, body[:120])
    assert set(err) == {"error", "problem", "fix"} and err["problem"] and "\n" not in err["problem"]
    assert snapshot(agg.store) == before
    good = body_with(t, "battery", "1.0")
    s, raw = agg.request("POST", "/v1/checkin", good, sign(agg.key, good))
    assert s == 200, json.loads(raw)
    agg.next[0] = t + 1.5
    return err


@pytest.mark.parametrize("field", sorted(VALID))
@HYP
@given(raw=st.data())
def test_every_field_refuses_wrong_type_non_finite_out_of_range_and_nesting(agg, field, raw):
    value = raw.draw(hostile(field), label=field)
    err = refused_then_accepted(agg, body_with(agg.next[0], field, value))
    assert err["error"] == "BadRequest"
    assert field in err["problem"], err  # the sentence names the field (deep nesting included)


@pytest.mark.parametrize("value", ["Infinity", "1e400", "NaN", '"x"', "[[[[[[[[1]]]]]]]]", "1e300"])
def test_the_reported_cases(agg, value):
    """battery "x" and deep nesting were 500; time Infinity was accepted and locked the device out."""
    for field in ("time", "battery"):
        refused_then_accepted(agg, body_with(agg.next[0], field, value))


@HYP
@given(body=st.integers(900, 2040).map(lambda n: "[" * n + "]" * n)
       | st.integers(300, 680).map(lambda n: '{"a":' * n + "1" + "}" * n))
def test_a_deeply_nested_body_is_a_400(agg, body):
    refused_then_accepted(agg, body.encode())


@HYP
@given(name=st.text(min_size=1, max_size=12).filter(lambda k: k not in VALID and k != "device_id"),
       value=json_values)
def test_unknown_fields_are_refused_by_name(agg, name, value):
    state = {"device_id": DEV, "battery": 1.0, "charging": True, "time": agg.next[0], name: value}
    err = refused_then_accepted(agg, json.dumps(state).encode())
    assert repr(name)[:30] in err["problem"], err  # named (long names shortened)


@HYP
@given(value=json_values.filter(lambda v: not isinstance(v, str)))
def test_device_id_must_be_a_string(agg, value):
    err = refused_then_accepted(agg, body_with(agg.next[0], "device_id", json.dumps(value)))
    assert "device_id" in err["problem"]


def test_another_devices_id_is_still_403(agg):
    refused_then_accepted(agg, body_with(agg.next[0], "device_id", '"dev1"'), want=403)


valid_state = st.fixed_dictionaries({}, optional={
    "tier": st.sampled_from(["linux", "mcu", "pi-4", None]),
    "battery": st.floats(0, 1) | st.sampled_from([0, 1, None]),
    "charging": st.booleans() | st.none(),
    "network": st.sampled_from(["wifi", "ethernet", "cellular", "serial", None]),
    "temperature": st.floats(-100, 200) | st.integers(-100, 200) | st.none(),
    "model_version": st.integers(0, 2**31 - 1) | st.none(),
})


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(state=valid_state, clockless=st.booleans())
@example(state={"tier": "mcu", "battery": 0.9, "charging": None, "temperature": 35.0, "network": "serial",
                "model_version": 3}, clockless=True)   # what the firmware sends (firmware/checkin.py)
@example(state={"tier": "linux", "model_version": None, "battery": 0.9, "charging": True, "network": "wifi"},
         clockless=False)                             # what edge.fl sends
def test_every_valid_checkin_is_accepted(agg, state, clockless):
    body = {"device_id": DEV, **state}
    if not clockless:
        body["time"] = agg.next[0]
        agg.next[0] += 1.5
    b = json.dumps(body).encode()
    s, raw = agg.request("POST", "/v1/checkin", b, sign(agg.key, b))
    assert s == 200, json.loads(raw)
    assert json.loads(raw)["action"] in ("train", "wait")


def test_the_in_process_api_validates_too(agg):
    rm = agg.tc.app.state.aggregator.rounds
    for bad in ({"battery": "x"}, {"time": math.inf}, {"temperature": math.nan}, {"charging": [True]}):
        with pytest.raises(Reject) as e:
            rm.checkin(DEV, bad)
        assert e.value.status == 400
    assert rm.checkin(DEV, {"battery": 1.0, "charging": True})["action"] in ("train", "wait")


# --- one aggregator per state directory ----------------------------------------------------------
def test_a_second_aggregator_on_the_same_state_refuses_naming_the_holder(tmp_path):
    state, _ = make_state(tmp_path, AggregatorConfig(clients_per_round=2), n_devices=1)
    first = start(state, free_port())
    try:
        second = subprocess.run(serve_cmd(state, free_port()), cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
        assert f"pid {first.pid}" in lines[0] and str(state) in lines[0], lines
        assert first.poll() is None  # the holder keeps serving
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # a holder killed with SIGKILL leaves its lock file, not its lock: the next start succeeds
    again = start(state, free_port())
    again.send_signal(signal.SIGTERM)
    again.wait(60)


def test_in_process_aggregators_exclude_each_other_until_closed(tmp_path):
    state, _ = make_state(tmp_path, AggregatorConfig(clients_per_round=2), n_devices=1)
    a = Aggregator(state)
    try:
        with pytest.raises(EdgelearnError, match=f"pid {os.getpid()}"):
            Aggregator(state)
    finally:
        a.close()
    Aggregator(state).close()  # released on close


# --- permissions from creation ---------------------------------------------------------------------
@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_secret_files_are_0600_from_creation(tmp_path, umask022, monkeypatch):
    """No chmod is needed (or allowed) to make them private: they are created 0600."""
    def no_chmod(*a, **k):
        raise AssertionError(f"chmod{a}: secret files must be created 0600, not narrowed afterwards")

    state, _ = make_state(tmp_path, AggregatorConfig(clients_per_round=2), n_devices=0)
    db = state / "state.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(os, "fchmod", no_chmod)
    from host.aggregator.setup import provision
    from host.aggregator.store import Store

    s = Store(db)  # a fresh database, as `aggregator init` creates it
    with s.tx():
        s.set_meta("x", "y")
    assert mode(db) == 0o600
    wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
    assert wal.exists() and shm.exists()
    assert mode(wal) == 0o600 and mode(shm) == 0o600
    s.close()
    provision(state, "pi-001")
    for p in (db, wal, shm):
        if p.exists():
            assert mode(p) == 0o600, p


def test_every_file_the_aggregator_creates_has_its_documented_mode(tmp_path, umask022):
    state = tmp_path / "agg"
    r = subprocess.run([sys.executable, "-c", f"""
import os; os.umask(0o022)
from host.aggregator.config import AggregatorConfig
from host.aggregator.setup import init_state
from host.aggregator.inprocess import small_params
init_state({str(state)!r}, AggregatorConfig(clients_per_round=1), params=small_params())
"""], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    keys = tmp_path / "keys"
    r = subprocess.run([sys.executable, "-m", "edge.cli", "aggregator", "provision", "--state", str(state),
                        "--device", "pi-001", "--out", str(keys)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    a = Aggregator(state)  # serving opens the lock file and WAL
    try:
        secret = [state / "state.sqlite", state / "state.sqlite-wal", state / "state.sqlite-shm",
                  state / "keys" / "aggregator.key", state / "aggregator.lock", state / "config.json",
                  keys / "pi-001.hmac"]
        for p in secret:
            assert p.exists() and mode(p) == 0o600, (p, oct(mode(p)) if p.exists() else None)
        # everything else is public by design (bundles are served to anyone who asks, the public key
        # is given to devices): docs/faults.md lists them
        for p in state.rglob("*"):
            if p.is_file() and p not in secret:
                rel = p.relative_to(state).as_posix()
                assert rel == "keys/aggregator.pub" or rel.startswith(("bundles/", "models/")) \
                    or rel == "heldout.npz", rel
    finally:
        a.close()
    with sqlite3.connect(state / "state.sqlite") as c:  # the key really is in there
        assert c.execute("SELECT COUNT(*) FROM devices").fetchone()[0] == 1


def test_leftovers_of_a_crash_mid_publication_are_swept_under_the_lock(tmp_path):
    state, _ = make_state(tmp_path, AggregatorConfig(clients_per_round=2), n_devices=1)
    published = sorted(p.relative_to(state) for p in state.rglob("*"))
    (state / "models" / ".v3.npz.12345.abcd.tmp").write_bytes(b"half")
    (state / "models" / "v3.onnx.tmp").write_bytes(b"half")
    (state / "bundles" / ".v3.zip.x1y2").write_bytes(b"half")
    (state / "bundles" / ".v3.building-q9").mkdir()
    (state / "bundles" / ".v3.building-q9" / "head.npz").write_bytes(b"half")
    a = Aggregator(state)
    try:
        assert sorted(a.swept) == sorted(["models/.v3.npz.12345.abcd.tmp", "models/v3.onnx.tmp",
                                          "bundles/.v3.zip.x1y2", "bundles/.v3.building-q9"])
        left = {p.relative_to(state) for p in state.rglob("*")} - {Path("aggregator.lock")}
        assert sorted(p for p in left if not p.name.startswith("state.sqlite")) == \
            sorted(p for p in published if not p.name.startswith("state.sqlite"))
    finally:
        a.close()


def test_a_database_left_readable_by_an_older_version_is_narrowed_before_it_is_opened(tmp_path, umask022):
    from host.aggregator.store import Store

    db = tmp_path / "state.sqlite"
    old = sqlite3.connect(db)  # as SQLite creates it: 0644 under umask 022, and so its side files
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE t(x)")
    old.execute("INSERT INTO t VALUES (1)")
    old.commit()
    side = [Path(f"{db}-wal"), Path(f"{db}-shm")]
    assert mode(db) == 0o644 and all(p.exists() and mode(p) == 0o644 for p in side)
    s = Store(db)
    try:
        assert mode(db) == 0o600 and all(mode(p) == 0o600 for p in side)
    finally:
        s.close()
        old.close()
