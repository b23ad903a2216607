"""DP noise on the SQLite store is not predictable from the config: it is drawn from a secret the
database keeps (meta ``dp_seed``, made at init), per round id, so two aggregators with one config
add different noise, a restart keeps the secret and the per-round stream (no round's noise is ever
drawn twice), and ``dp_reproducible`` asks, explicitly, for the config's public seed instead."""

from __future__ import annotations

import json
import shutil

import numpy as np

from aggregator_helpers import FakeClock
from edge.portable.wire import INT8, Header
from host.aggregator.app import Aggregator, status_of
from host.aggregator.config import AggregatorConfig
from host.aggregator.inprocess import small_params
from host.aggregator.setup import init_state, provision
from host.wire_numpy import encode_update

AWAKE = {"battery": 1.0, "charging": True}
DEVICES = [f"dev{i}" for i in range(4)]


def _cfg(**kw):
    return AggregatorConfig(clients_per_round=2, overselect=1.0, max_overselect=1.0, round_timeout=600,
                            eval_tolerance=1.0, dp_clip=1.0, **{"dp_noise": 1.0, **kw})


def _init(path, cfg):
    init_state(path, cfg, params=small_params())
    for i, d in enumerate(DEVICES):  # fixed keys: two aggregators receive byte-identical frames
        provision(path, d, key=bytes([i + 1]) * 32)
    return path


def _round(agg, rnd):
    """Two devices upload fixed deltas to the open round; it closes at quorum. Returns the new head."""
    rm = agg.rounds
    for j, d in enumerate(DEVICES[2 * (rnd % 2):2 * (rnd % 2) + 2]):
        t = rm.checkin(d, AWAKE)["task"]
        rng = np.random.default_rng([rnd, j])
        deltas = [(k, (rng.standard_normal(v.shape) * 0.05).astype(np.float32)) for k, v in small_params().items()]
        rm.submit(encode_update(Header(d, t["round_id"], t["model_version"], rnd + 1, 10), deltas,
                                bytes([DEVICES.index(d) + 1]) * 32, codec=INT8), d)
    assert rm.round["round_id"] == rnd + 2, "the round did not close"
    return agg.registry.params()


def _run(path, rounds, restart_after=None):
    clock, heads = FakeClock(), []
    agg = Aggregator(path, clock)
    try:
        for rnd in range(rounds):
            if rnd == restart_after:
                agg.close()
                agg = Aggregator(path, clock)
            heads.append(_round(agg, rnd))
    finally:
        agg.close()
    return heads


def _differ(a, b):
    return any(not np.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)


def test_two_aggregators_with_one_config_draw_different_noise(tmp_path):
    a, b = (_init(tmp_path / n, _cfg(seed=3)) for n in "ab")  # the public seed does not decide it
    assert _differ(_run(a, 1)[0], _run(b, 1)[0])


def test_dp_reproducible_draws_the_same_noise_from_the_public_seed(tmp_path):
    a, b, c = (_init(tmp_path / n, _cfg(dp_reproducible=True, seed=s)) for n, s in (("a", 7), ("b", 7), ("c", 8)))
    ha, hb, hc = _run(a, 2), _run(b, 2), _run(c, 1)
    for x, y in zip(ha, hb):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    assert _differ(ha[0], hc[0])  # another seed, other noise
    assert AggregatorConfig.load(a / "config.json").dp_reproducible


def test_the_secret_survives_a_restart_and_no_round_reuses_noise(tmp_path):
    a = _init(tmp_path / "a", _cfg())
    b = tmp_path / "b"
    shutil.copytree(a, b)                       # the same database, so the same secret
    straight = _run(a, 3)
    restarted = _run(b, 3, restart_after=1)     # stopped and served again between rounds 1 and 2
    for x, y in zip(straight, restarted):
        for k in x:
            np.testing.assert_allclose(x[k], y[k], rtol=0, atol=1e-6)
    # the noise itself: the same rounds without noise (same clipping) give each round's step
    clean = _run(_init(tmp_path / "c", _cfg(dp_noise=0.0)), 3)
    base = small_params()
    noise = [{k: (h[k] - p[k]) - (c[k] - q[k]) for k in base}
             for h, p, c, q in zip(restarted, [base] + restarted[:-1], clean, [base] + clean[:-1])]
    assert all(np.abs(n["classifier.w"]).max() > 1e-3 for n in noise)   # there is noise ...
    assert all(_differ(noise[i], noise[j]) for i, j in ((0, 1), (0, 2), (1, 2)))  # ... a restart replays none


def test_the_secret_is_in_the_private_database_only(tmp_path):
    a = _init(tmp_path / "a", _cfg())
    agg = Aggregator(a, FakeClock())
    try:
        secret = agg.store.get_meta("dp_seed")
        assert secret is not None and int(secret) > 0
        assert secret not in json.dumps(status_of(agg), default=str)
        assert secret not in (a / "config.json").read_text()
        assert (a / "state.sqlite").stat().st_mode & 0o077 == 0
    finally:
        agg.close()


def test_a_database_made_before_the_secret_gets_one_when_it_first_adds_noise(tmp_path):
    a = _init(tmp_path / "a", _cfg())
    agg = Aggregator(a, FakeClock())
    with agg.store.tx() as c:
        c.execute("DELETE FROM meta WHERE key='dp_seed'")
    try:
        _round(agg, 0)
        made = agg.store.get_meta("dp_seed")
    finally:
        agg.close()
    assert made is not None
    agg = Aggregator(a, FakeClock())
    try:
        assert agg.store.get_meta("dp_seed") == made
    finally:
        agg.close()

