"""What the PostgreSQL aggregator tests share: a real server from Debian's postgresql package for the
module (``pg``; skipped, or failed under CI, where it is missing), a fresh database per test, update
frames and their FedAvg (``tests/test_aggregator_pg.py``, ``tests/test_aggregator_pg_faults.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from bench._pgserver import PgServer, missing_reason
from ci_helpers import unavailable
from edge.portable.wire import INT8, Header
from host.aggregator.inprocess import small_params
from host.wire_numpy import decode_update, encode_update

AWAKE = {"battery": 1.0, "charging": True}


@pytest.fixture(scope="module")
def pg():
    why = missing_reason()
    if why:
        unavailable(why, "the PostgreSQL tests")
    server = PgServer()
    yield server
    server.stop()


def db_url(pg, request) -> str:
    return pg.database(request.node.name.lower()[:60])


def frame(dev, key, task, seed, seq=1, n=None):
    rng = np.random.default_rng(seed)
    deltas = {k: (rng.standard_normal(v.shape) * 0.05).astype(np.float32) for k, v in small_params().items()}
    n = n or int(rng.integers(1, 30))
    return encode_update(Header(dev, task["round_id"], task["model_version"], seq, n), list(deltas.items()),
                         key, codec=INT8)


def fedavg(base, frames, keys):
    """base + the example-weighted mean of the decoded deltas of ``frames`` {device: frame}."""
    ups = [decode_update(f, keys[d]) for d, f in frames.items()]
    total = sum(u.header.num_examples for u in ups)
    return {k: base[k] + sum(np.asarray(t.values, np.float64).reshape(base[k].shape) * u.header.num_examples
                             for u in ups for t in u.tensors if t.name == k) / total for k in base}
