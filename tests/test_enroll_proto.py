"""The portable prototype head: prototypes, outliers, bias-only adaptation, serialisation, MicroPython."""

from __future__ import annotations

import array
import math
from pathlib import Path

import numpy as np
import pytest

from edge.portable import proto as P

ROOT = Path(__file__).resolve().parents[1]


def cluster(rng, centre, n, noise=0.1):
    return [list(np.abs(centre + noise * rng.standard_normal(centre.size))) for _ in range(n)]


def test_prototype_matches_numpy():
    rng = np.random.default_rng(0)
    embs = [rng.random(64) for _ in range(5)]
    got = np.array(P.prototype([list(e) for e in embs]))
    n = np.array([e / np.linalg.norm(e) for e in embs]).mean(0)
    np.testing.assert_allclose(got, n / np.linalg.norm(n), atol=1e-6)


def test_outlier_clip_is_found():
    rng = np.random.default_rng(1)
    a, b = rng.random(64), rng.random(64)
    embs = cluster(rng, a, 5, 0.05) + cluster(rng, b * np.r_[np.zeros(32), np.ones(32)], 1, 0.0)
    assert P.find_outliers(embs) == [5]
    assert P.find_outliers(cluster(rng, a, 6, 0.05)) == []


def test_bias_adaptation_moves_the_decision():
    rng = np.random.default_rng(2)
    centre = rng.random(64)
    head = P.ProtoHead(64, max_classes=2)
    k = head.add(P.prototype(cluster(rng, centre, 5, 0.05)), threshold=0.999)
    near = cluster(rng, centre, 1, 0.15)[0]
    assert head.best(near)[0] == -1  # threshold too strict for this speaker
    losses = [head.adapt_bias(near, k, lr=0.5) for _ in range(20)]
    assert losses[-1] < losses[0] and head.best(near)[0] == k
    far = list(rng.random(64))
    cos = head.cosines(far)[0]
    for _ in range(50):
        head.adapt_bias(far, -1, lr=0.5)
    assert head.probs(far)[0] < 0.5 and cos == head.cosines(far)[0]  # prototype untouched


def test_probs_formula():
    head = P.ProtoHead(4, gain=10.0)
    head.add([1, 0, 0, 0], 0.5)
    head.bias[0] = 0.25
    p = head.probs([1, 1, 0, 0])[0]
    assert p == pytest.approx(1 / (1 + math.exp(-(10 * (math.sqrt(0.5) - 0.5) + 0.25))), rel=1e-6)


def test_serialisation_and_errors():
    head = P.ProtoHead(8, max_classes=2)
    head.add([1.0] * 8, 0.7)
    head.add([0.5, -1] * 4, 0.8)
    head.bias[1] = -0.5
    back = P.ProtoHead.from_bytes(head.to_bytes())
    assert back.to_bytes() == head.to_bytes()
    with pytest.raises(ValueError, match="holds 2"):
        head.add([1.0] * 8, 0.5)
    with pytest.raises(ValueError, match="expected"):
        P.ProtoHead.from_bytes(head.to_bytes()[:-1])
    with pytest.raises(ValueError, match="magic"):
        P.ProtoHead.from_bytes(b"XXXX" + head.to_bytes()[4:])
    with pytest.raises(ValueError):
        P.prototype([])


SCENARIO = """
from edge.portable import proto as P
import gc
gc.collect()
before = gc.mem_alloc()
embs = [[((i * 13 + j * 7) % 17) / 17.0 + (0.5 if j < 8 else 0.0) for j in range(64)] for i in range(5)]
embs.append([((j * 5) % 11) / 11.0 for j in range(64)])
print(P.find_outliers(embs))
head = P.ProtoHead(64, max_classes=4)
k = head.add(P.prototype(embs[:5]), 0.9)
for r in range(10):
    head.adapt_bias(embs[r % 5], k, 0.5)
    head.adapt_bias(embs[5], -1, 0.5)
print(head.best(embs[0])[0], head.best(embs[5])[0])
print(head.to_bytes().hex())
gc.collect()
print('heap', gc.mem_alloc() - before)
"""


@pytest.mark.micropython
def test_micropython_agrees(micropython):
    out = micropython(SCENARIO, heap="100k", path=[ROOT]).splitlines()
    ns: dict = {}
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(SCENARIO.replace("gc.mem_alloc()", "0"), ns)
    here = buf.getvalue().splitlines()
    assert out[:2] == here[:2]
    # float32 storage on both; the double maths may differ in the last bit, so compare values
    a = np.frombuffer(bytes.fromhex(out[2])[12:], np.float32)
    b = np.frombuffer(bytes.fromhex(here[2])[12:], np.float32)
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert int(out[3].split()[1]) < 20000
