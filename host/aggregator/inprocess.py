"""An aggregator in-process: a state directory with provisioned devices, and a transport to it
without sockets. The fleet simulator (``host/fleet``), benchmarks and tests drive one this way.

    state, keys = make_state(out_dir, AggregatorConfig(clients_per_round=3), n_devices=4)
    with InProcessTransport(build_app(state, tick_interval=0)) as t:
        status, body = t.request("GET", "/v1/status")       # what edge.fl's HttpTransport answers
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from host.aggregator.config import AggregatorConfig
from host.aggregator.setup import init_state, provision


def small_params(seed: int = 0, dim: int = 64, classes: int = 37) -> dict:
    """A fresh federated head: identity projection, a small random classifier (``--fresh-head``)."""
    rng = np.random.default_rng(seed)
    return {"proj.w": np.eye(dim, dtype=np.float32), "proj.b": np.zeros(dim, np.float32),
            "classifier.w": (rng.standard_normal((dim, classes)) * 0.1).astype(np.float32),
            "classifier.b": np.zeros(classes, np.float32)}


def make_state(tmp, cfg: AggregatorConfig, n_devices: int = 4, params=None, heldout=None,
               prefix: str = "dev", db=None, negatives=None, rehearsal=None) -> tuple[Path, dict]:
    """An initialised state directory ``tmp/agg`` with ``n_devices`` provisioned devices; (state dir, {id: key}).
    With ``db`` (a ``postgresql://`` URL) the state lives in that database (``tmp/agg`` holds the keys);
    ``negatives`` and ``rehearsal``: ``init_state``'s (the operating point's keyword-free speech; the
    training voices every version ships for devices to rehearse)."""
    state = Path(tmp) / "agg"
    init_state(state, cfg, params=params if params is not None else small_params(), heldout=heldout, db=db,
               negatives=negatives, rehearsal=rehearsal)
    keys = {f"{prefix}{i}": provision(state, f"{prefix}{i}", db=db) for i in range(n_devices)}
    return state, keys


class InProcessTransport:
    """``FLClient``'s transport over Starlette's in-process TestClient (no sockets)."""

    def __init__(self, app):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from starlette.testclient import TestClient
        self.tc = TestClient(app)

    def __enter__(self):
        self.tc.__enter__()
        return self

    def __exit__(self, *exc):
        self.tc.__exit__(*exc)

    def request(self, method, path, body=b"", headers=None):
        r = self.tc.request(method, path, content=body, headers=headers or {})
        return r.status_code, r.content
