"""Hostile device state: every file a state directory can hold, truncated, emptied, garbled or retyped.

``device status``, ``device detect`` and ``device adapt`` on such a directory either work or stop with
one ``EdgelearnError`` that names the damaged file (never a traceback), and a command that stops
leaves the damaged file as it found it (nothing the user might still recover is deleted; only
redundant caches and temp files are recomputed or removed).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from devstate_helpers import make_data, make_keyword_clips, make_sysfs, run_device
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from edge.errors import EdgelearnError

# relative paths of the state files the fixture creates (features-*.npy: its one feature cache)
FILES = ("keywords.json", "adapt/active.json", "adapt/default/v1.npz", "adapt/default/v2.npz",
         "adapt/checkpoint.npz", "adapt/features-*.npy", "replay.bin", "replay_tail.bin",
         "scheduler.state", "scheduler.log")
# caches: a command may recompute or replace them whatever they hold
REDUNDANT = ("adapt/checkpoint.npz", "adapt/features-*.npy")
ADAPT_ARGS = ("--steps", "3")
SETTINGS = settings(max_examples=int(os.environ.get("EDGELEARN_HOSTILE_EXAMPLES", "60")), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                    database=None)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A state directory holding one of every file kind, and the inputs the commands take."""
    from edge.replay import ReplayStore

    base = tmp_path_factory.mktemp("hostile")
    data, sysfs, state = make_data(base / "data"), make_sysfs(base / "sysfs"), base / "state"
    clips = make_keyword_clips(base / "kw")
    run_device(["enroll", "--state", state, "--keyword", "hey edge", "--wav", *clips])
    adapt = ["adapt", "--state", state, "--data", data, "--sysfs-root", sysfs, *ADAPT_ARGS]
    run_device(adapt)  # v1
    run_device(adapt)  # v2 (v1 previous)
    answers = iter([True, False])  # a third run pauses after one step: checkpoint.npz
    with mock.patch("edge.scheduler.Scheduler.should_continue", lambda self: next(answers, False)):
        assert json.loads(run_device(adapt))["status"] == "paused"
    rs = ReplayStore(state, dim=64)
    for i in range(5):
        rs.add(np.linspace(-1, 1, 64) * (i + 1), i % 3)
    rs.flush()
    wav = base / "clip.wav"
    from edge.audio import write_wav
    write_wav(wav, (np.random.default_rng(5).standard_normal(24000) * 2000).astype(np.int16))
    for rel in FILES:
        assert list(state.glob(rel)), rel
    return {"state": state, "data": data, "sysfs": sysfs, "wav": wav}


def commands(w, state):
    return {
        "status": ["status", "--state", state],
        "detect": ["detect", "--state", state, "--wav", w["wav"], "--json"],
        "adapt": ["adapt", "--state", state, "--data", w["data"], "--sysfs-root", w["sysfs"], *ADAPT_ARGS],
    }


# --- mutations ---------------------------------------------------------------------------------
# (rel, op, arg): a plain value, so the issue's cases can be given as @example

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 40, 2 ** 40) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6)


def _paths(obj, prefix=()):
    """Every path into a JSON document (lists sampled sparsely: the first 3 items)."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value):
    if not path:
        return value
    obj[path[0]] = _set(obj[path[0]], path[1:], value)
    return obj


ARRAYS = st.sampled_from(["int", "str", "bool", "scalar", "empty", "nan", "inf", "shape", "huge"])


def _array(kind, like):
    like = np.asarray(like)
    return {"int": like.astype(np.int64) if like.dtype.kind != "U" else np.arange(3),
            "str": np.array(["x"] * max(1, min(like.size, 4))),
            "bool": np.ones(like.shape, bool), "scalar": np.float32(1.5), "empty": np.zeros(0, np.float32),
            "nan": np.full(like.shape, np.nan, np.float32), "inf": np.full(like.shape, np.inf, np.float32),
            "shape": np.zeros(like.shape + (2,), np.float32),
            "huge": np.full(like.shape, 3e38, np.float32)}[kind]


@st.composite
def mutations(draw, w):
    rel = draw(st.sampled_from(FILES))
    data = _read(w["state"], rel)
    op = draw(st.sampled_from(["empty", "truncate", "garble", "retype"]))
    if op == "truncate":
        return rel, op, draw(st.integers(0, max(0, len(data) - 1)))
    if op == "garble":
        n = draw(st.integers(1, 8))
        pos = draw(st.lists(st.integers(0, max(0, len(data) - 1)), min_size=n, max_size=n))
        return rel, op, [(p, draw(st.integers(0, 255))) for p in pos]
    if op == "empty":
        return rel, op, None
    if rel.endswith(".json"):
        doc = json.loads(data)
        path = draw(st.sampled_from(list(_paths(doc))))
        return rel, "json", (path, draw(JSON_VALUES))
    if rel.endswith(".npz"):
        with np.load(io.BytesIO(data)) as z:
            keys = list(z.files)
        return rel, "npz", (draw(st.sampled_from(keys + ["<new>", "<drop>"])), draw(st.sampled_from(keys)),
                            draw(ARRAYS))
    if rel.endswith(".npy"):
        return rel, "npy", draw(ARRAYS)
    if rel == "scheduler.log":
        return rel, "log", draw(st.sampled_from(["torn", "null", "list", "text", "binary"]))
    # binary formats: rewrite a header field (replay: magic, dim, capacity, next_seq, crc)
    field = draw(st.sampled_from([(0, "<I"), (4, "<H"), (6, "<I"), (10, "<I"), (14, "<I"), (4, "<I"),
                                  (8, "<d")]))
    return rel, "field", (field, draw(st.integers(0, 2 ** 32 - 1)))


def _resolve(state, rel) -> Path:
    [p] = state.glob(rel)
    return p


def _read(state, rel) -> bytes:
    return _resolve(state, rel).read_bytes()


def mutate(data: bytes, op, arg) -> bytes:
    if op == "empty":
        return b""
    if op == "set":
        return arg
    if op == "truncate":
        return data[: arg if isinstance(arg, int) else int(len(data) * arg)]
    if op == "garble":
        b = bytearray(data)
        for p, v in arg:
            if p < len(b):
                b[p] = v
        return bytes(b)
    if op == "json":
        path, value = arg
        return json.dumps(_set(json.loads(data), list(path), value)).encode()
    if op == "npz":
        key, like, kind = arg
        with np.load(io.BytesIO(data)) as z:
            arrays = {k: z[k] for k in z.files}
        if key == "<drop>":
            arrays.pop(like)
        else:
            arrays["extra_tensor" if key == "<new>" else key] = _array(kind, arrays[like])
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()
    if op == "npy":
        buf = io.BytesIO()
        np.save(buf, _array(arg, np.load(io.BytesIO(data))))
        return buf.getvalue()
    if op == "log":
        lines = data.decode().splitlines(keepends=True)
        extra = {"torn": lines[-1][: len(lines[-1]) // 2], "null": "null\n", "list": "[1, 2]\n",
                 "text": "not json at all\n"}.get(arg)
        return data + b"\x00\xff\xfe{\n" if arg == "binary" else data + extra.encode()
    if op == "field":
        (off, fmt), v = arg
        b = bytearray(data)
        if off + struct.calcsize(fmt) <= len(b):
            struct.pack_into(fmt, b, off, float(v) if fmt == "<d" else v % (1 << 8 * struct.calcsize(fmt)))
        return bytes(b)
    raise AssertionError(op)


def check(w, command, mutation):
    """Apply ``mutation`` to a copy of the state and run ``command``: it works, or raises one
    EdgelearnError naming the damaged file and leaves that file as it was."""
    rel, op, arg = mutation
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        shutil.copytree(w["state"], state)
        path = _resolve(state, rel)
        bad = mutate(path.read_bytes(), op, arg)
        path.write_bytes(bad)
        try:
            out = run_device(commands(w, state)[command])
        except EdgelearnError as e:
            assert path.name in str(e), f"{command} on {rel} ({op}): the error does not name the file: {e}"
            assert "\n" not in str(e)
            if not any(Path(rel).match(r) for r in REDUNDANT):
                assert path.exists() and path.read_bytes() == bad, f"{command} changed {rel} and then failed"
            return "error"
        if command == "status":
            json.loads(out)
        return "ok"


def _property(command, issue_cases):
    def test(world, data):
        m = data.draw(mutations(world), label="mutation")
        event(f"{m[0]} {m[1]}: {check(world, command, m)}")

    @pytest.mark.parametrize("case", issue_cases, ids=[f"{c[0]}:{c[1]}" for c in issue_cases])
    def test_issue_case(world, case):
        check(world, command, case)

    return SETTINGS(given(data=st.data())(test)), test_issue_case


# The issue's cases (issue 19, item 3), always run; the strategies add their neighbours.
ACTIVE_LIST = ("adapt/active.json", "set", b"[]")
ACTIVE_NULL = ("adapt/active.json", "set", b"null")
TRUNCATED_VERSION = ("adapt/default/v2.npz", "truncate", 0.5)
EMPTY_REPLAY = ("replay_tail.bin", "empty", None)
TRUNCATED_REPLAY = ("replay_tail.bin", "truncate", 0.5)
TRUNCATED_EMB_REPLAY = ("replay.bin", "truncate", 30)
TORN_LOG = ("scheduler.log", "log", "torn")
EMPTY_CACHE = ("adapt/features-*.npy", "empty", None)
KEYWORD_STR = ("keywords.json", "json", (("keywords", 0), "hey edge"))
KEYWORD_W = ("keywords.json", "json", (("keywords", 0, "w"), "x"))
KEYWORD_NAME = ("keywords.json", "json", (("keywords", 0, "name"), 7))
KEYWORD_VERIFY = ("keywords.json", "json", (("keywords", 0, "verify"), [1]))
REPLAY_CAPACITY = ("replay_tail.bin", "field", ((6, "<I"), 2 ** 32 - 1))

test_status_on_hostile_state, test_status_issue_cases = _property(
    "status", [ACTIVE_LIST, ACTIVE_NULL, EMPTY_REPLAY, TRUNCATED_REPLAY, TRUNCATED_EMB_REPLAY, TORN_LOG,
               KEYWORD_STR, KEYWORD_W, KEYWORD_NAME, KEYWORD_VERIFY, REPLAY_CAPACITY])
test_detect_on_hostile_state, test_detect_issue_cases = _property(
    "detect", [ACTIVE_LIST, ACTIVE_NULL, TRUNCATED_VERSION, KEYWORD_STR, KEYWORD_W, KEYWORD_NAME,
               KEYWORD_VERIFY, TRUNCATED_REPLAY])
test_adapt_on_hostile_state, test_adapt_issue_cases = _property(
    "adapt", [TRUNCATED_VERSION, EMPTY_CACHE, ACTIVE_LIST, TRUNCATED_REPLAY])


def test_a_torn_log_line_is_skipped_and_the_log_is_private_and_bounded(world, tmp_path):
    """status reads the last whole record; the log is 0600, each append starts on its own line,
    and it is rotated, so it never grows past two files of LOG_MAX_BYTES."""
    from edge.scheduler import LOG_MAX_BYTES, Scheduler

    state = tmp_path / "st"
    shutil.copytree(world["state"], state)
    log = state / "scheduler.log"
    last = json.loads(log.read_text().splitlines()[-1])
    log.write_bytes(log.read_bytes() + b'{"t": 12, "act')  # a torn last line
    status = json.loads(run_device(["status", "--state", state]))
    assert status["last_schedule"] == last
    sch = Scheduler(state, sysfs_root=world["sysfs"], idle_s=lambda: 10 ** 6)
    sch.decide()
    lines = log.read_text().splitlines()
    assert json.loads(lines[-1])["action"] == "train" and lines[-2].endswith('"act')
    assert log.stat().st_mode & 0o777 == 0o600
    for _ in range(3 * LOG_MAX_BYTES // 200):
        sch.decide()
    logs = sorted(state.glob("scheduler.log*"))
    assert [p.name for p in logs] == ["scheduler.log", "scheduler.log.1"]
    assert all(p.stat().st_size <= LOG_MAX_BYTES for p in logs)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in logs)
    assert json.loads(run_device(["status", "--state", state]))["last_schedule"]["action"] == "train"


def test_every_state_file_is_private(world):
    for p in world["state"].rglob("*"):
        if p.is_file():
            assert p.stat().st_mode & 0o777 == 0o600, p
