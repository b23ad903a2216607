"""Secure aggregation (pairwise masking with dropout recovery): the unmasked sum equals the plain
fixed-point sum exactly with devices dropping at each phase, the server never holds an individual
update in the clear, too few survivors fail cleanly, and the sum feeds FedAvg and DP but not median."""

from __future__ import annotations

import numpy as np
import pytest

from edge.secagg import SecAggClient, SecAggError, decode_fixed, encode_fixed, shamir_join, shamir_split
from host.aggregator.inprocess import small_params
from host.fl.strategies import FedAvg, Median
from host.privacy.dp import DPStrategy
from host.privacy.secagg import SecAggSession, client_vector, fold_sum

DIM = 300


def run(n=8, t=5, drop_before_mask=(), drop_before_unmask=(), vectors=None, dim=DIM, seed=0):
    devs = [f"dev{i:02d}" for i in range(n)]
    rng = np.random.default_rng(seed)
    xs = vectors or {d: encode_fixed(rng.standard_normal(dim) * 0.3) for d in devs}
    s = SecAggSession(round_id=3, threshold=t, dim=dim)
    cl = {d: SecAggClient(d, 3) for d in devs}
    for d in devs:
        s.advertise(d, cl[d].advertise())
    s.close_phase()
    for d in devs:
        s.share(d, cl[d].share_keys(s.roster(), t))
    assert s.ready()
    s.close_phase()
    masked = [d for d in devs if d not in drop_before_mask]
    for d in masked:
        s.mask(d, cl[d].masked_input(s.inbox(d), xs[d]))
    s.close_phase()
    for d in masked:
        if d not in drop_before_unmask:
            s.unmask(d, cl[d].unmask(s.survivors()))
    s.close_phase()
    return s, xs, masked, cl


def plain_sum(xs, who):
    return (sum(xs[d].astype(np.uint64) for d in who) % (1 << 32)).astype(np.uint32)


@pytest.mark.parametrize("drop_mask,drop_unmask", [((), ()), (("dev01", "dev05"), ()),
                                                   (("dev00",), ("dev03", "dev07")),
                                                   (("dev02", "dev04", "dev06"), ())])
def test_unmasked_sum_equals_plain_sum_exactly(drop_mask, drop_unmask):
    s, xs, masked, _ = run(drop_before_mask=drop_mask, drop_before_unmask=drop_unmask)
    assert np.array_equal(s.result(), plain_sum(xs, masked))
    assert s.phase == "done"


def test_the_server_never_holds_an_update_in_the_clear():
    s, xs, masked, cl = run(drop_before_mask=("dev01",))
    two32 = float(1 << 32)
    for d in masked:
        y = s.masked[d]
        assert np.mean(y == xs[d]) < 0.01
        # what the server stores looks uniform on [0, 2^32), whatever the update (which sits near 0 mod 2^32)
        u = y.astype(np.float64) / two32
        assert abs(u.mean() - 0.5) < 0.08 and abs(u.std() - 0.2887) < 0.05
    # even with a survivor's self mask rebuilt, its pairwise masks still hide it
    from edge.secagg import prg
    d = masked[0]
    idx = {x: i + 1 for i, x in enumerate(sorted(s.u1))}
    b = shamir_join({idx[u]: m["b"][d] for u, m in s.unmasks.items()})
    assert np.mean((s.masked[d] - prg(b, DIM)) == xs[d]) < 0.01
    # no device ever gave out both kinds of share for one device (that would reveal its update)
    for m in s.unmasks.values():
        assert not set(m["b"]) & set(m["s_sk"])


def test_too_few_survivors_fail_cleanly():
    with pytest.raises(SecAggError, match="below the threshold 5; no sum is revealed"):
        run(n=8, t=5, drop_before_mask=("dev00", "dev01", "dev02", "dev03"))
    with pytest.raises(SecAggError, match="answered 'unmask', below the threshold"):
        run(n=8, t=5, drop_before_unmask=("dev00", "dev01", "dev02", "dev03"))
    s = SecAggSession(1, 3, DIM)
    with pytest.raises(SecAggError, match="no result yet"):
        s.result()


def test_protocol_misuse_is_refused():
    c = SecAggClient("a", 1)
    others = {d: SecAggClient(d, 1) for d in "bcd"}
    roster = {"a": c.advertise(), **{d: o.advertise() for d, o in others.items()}}
    with pytest.raises(SecAggError, match="exceed half"):
        c.share_keys(roster, threshold=2)
    out = {d: o.share_keys(roster, 3) for d, o in others.items()}
    c.share_keys(roster, 3)
    tampered = dict(out["b"])
    ct = bytearray(bytes.fromhex(tampered["a"]))
    ct[-1] ^= 1
    with pytest.raises(SecAggError, match="does not decrypt"):
        c.masked_input({"b": bytes(ct).hex(), "c": out["c"]["a"], "d": out["d"]["a"]}, np.zeros(4, np.uint32))
    s = SecAggSession(1, 3, 4)
    with pytest.raises(SecAggError, match="phase 'advertise', not 'masked'"):
        s.mask("a", np.zeros(4, np.uint32))
    with pytest.raises(SecAggError, match="32-byte X25519"):
        s.advertise("a", {"c_pk": "00", "s_pk": "11"})


def test_shamir_needs_the_threshold():
    secret = bytes(range(32))
    sh = shamir_split(secret, 7, 4)
    assert shamir_join({i: sh[i - 1] for i in (2, 3, 5, 7)}) == secret
    with pytest.raises(SecAggError):  # 3 shares interpolate to garbage (a number far above 2^256)
        shamir_join({i: sh[i - 1] for i in (1, 2, 3)})


def test_fixed_point_overflow_is_an_error():
    with pytest.raises(SecAggError, match="overflows"):
        encode_fixed([40000.0])
    assert np.allclose(decode_fixed(encode_fixed([-1.5, 2.25])), [-1.5, 2.25])


def _deltas(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{k: (rng.standard_normal(v.shape) * 0.05).astype(np.float32) for k, v in small_params().items()}
            for _ in range(n)]


def test_secure_sum_feeds_fedavg_and_dp_but_not_median():
    params = small_params()
    names, shapes = sorted(params), {k: v.shape for k, v in params.items()}
    deltas, counts = _deltas(6), [3, 10, 7, 1, 25, 4]
    dim = sum(v.size for v in params.values()) + 1
    vecs = {f"dev{i:02d}": client_vector(d, n, names, shapes, 16) for i, (d, n) in enumerate(zip(deltas, counts))}
    s, *_ = run(n=6, t=4, vectors=vecs, dim=dim, drop_before_mask=("dev05",))
    acc = FedAvg().begin(params)
    fold_sum(acc, s.result(), names, 16, count=5)
    ref = FedAvg().begin(params)
    for d, n in zip(deltas[:5], counts[:5]):
        ref.add(d, n)
    for k in names:  # fixed point: each weighted value is rounded to 2^-17
        np.testing.assert_allclose(acc.mean()[k], ref.mean()[k], atol=6 * 2 ** -17 / sum(counts[:5]) + 1e-7)
    dp = DPStrategy(FedAvg(), clip_norm=1.0, noise_multiplier=0.5, expected_clients=5, seed=0)
    dacc = dp.begin(params)
    unit = {f"dev{i:02d}": client_vector(d, 1.0, names, shapes, 16) for i, d in enumerate(deltas)}
    s2, *_ = run(n=6, t=4, vectors=unit, dim=dim)
    fold_sum(dacc, s2.result(), names, 16, count=6)
    new = dp.apply(params, dacc)
    assert all(np.all(np.isfinite(v)) for v in new.values()) and dp.accountant.epsilon(1e-5) > 0
    with pytest.raises(SecAggError, match="individual updates"):
        fold_sum(Median().begin(params), s.result(), names, 16, count=5)
