"""Helpers for driving an aggregator in-process (tests, benchmarks, the simulator).

    state, keys = make_state(tmp_path, AggregatorConfig(clients_per_round=3), n_devices=4)
    with TestTransport(build_app(state, tick_interval=0)) as t:
        status, body = t.request("GET", "/v1/status")
"""

from __future__ import annotations

import hashlib
import hmac
import json
import warnings
from pathlib import Path

import numpy as np

from host.aggregator.config import AggregatorConfig
from host.aggregator.setup import init_state, provision

TABLES = ("meta", "devices", "rounds", "selections", "updates", "chunks", "models")


class FakeClock:
    """A settable clock for ``build_app(..., clock=)``: tests move time instead of sleeping."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self):
        return self.t


def small_params(seed: int = 0, dim: int = 64, classes: int = 37) -> dict:
    rng = np.random.default_rng(seed)
    return {"proj.w": np.eye(dim, dtype=np.float32), "proj.b": np.zeros(dim, np.float32),
            "classifier.w": (rng.standard_normal((dim, classes)) * 0.1).astype(np.float32),
            "classifier.b": np.zeros(classes, np.float32)}


def make_state(tmp, cfg: AggregatorConfig, n_devices: int = 4, params=None, heldout=None,
               prefix: str = "dev") -> tuple[Path, dict]:
    """An initialised state directory with ``n_devices`` provisioned devices; (state dir, {id: key})."""
    state = Path(tmp) / "agg"
    init_state(state, cfg, params=params if params is not None else small_params(), heldout=heldout)
    keys = {f"{prefix}{i}": provision(state, f"{prefix}{i}") for i in range(n_devices)}
    return state, keys


def snapshot(store) -> dict:
    """Every row of every table: compare before/after to prove a request changed nothing."""
    return {t: store.all(f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES}


def signed_checkin(device_id: str, key: bytes, state: dict | None = None) -> tuple[bytes, dict]:
    body = json.dumps({"device_id": device_id, "battery": 1.0, "charging": True, "network": "wifi",
                       **(state or {})}).encode()
    return body, {"X-Edgelearn-Device": device_id, "Content-Type": "application/json",
                  "X-Edgelearn-Mac": hmac.new(key, body, hashlib.sha256).hexdigest()}


class TestTransport:
    """``FLClient``'s transport over Starlette's in-process TestClient (no sockets)."""
    __test__ = False  # not a pytest class

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
