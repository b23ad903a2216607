"""Staged rollouts on a live server: a broken canary rolls back, a good one is promoted,
and no request is lost either way; bad bundles are refused and change nothing."""

from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from host.keys import generate_keypair
from host.serve.app import Server
from host.serve.background import BackgroundServer
from host.serve.config import ServeConfig
from bench._toymodels import make_toy_bundle

MODEL = "kws-toy"
# Row mean 1.0 > 0.5: the broken model answers NaN for this input (see toymodels).
ONES = {"inputs": [{"name": "features", "shape": [1, 49, 10, 1], "datatype": "FP32", "data": [1.0] * 490}]}


@pytest.fixture()
def env(tmp_path):
    priv, pub = generate_keypair(tmp_path / "keys")
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    v1 = make_toy_bundle(tmp_path / "v1", priv, version=1, cloud_half=False)
    # The p99 rule is off here: on a loaded 2-core CI box one scheduler stall made a
    # good canary's p99 64x the stable one's. The rule itself is tested with a fake
    # clock in test_serve_policy; this file tests the stage walk and the error-rate rollback.
    cfg = ServeConfig(replicas=2, canary_min_requests=3, canary_min_step_seconds=0.2, breaker_open=0.3,
                      canary_p99_factor=1e9)
    return type("Env", (), {"tmp": tmp_path, "priv": priv, "pub": pub, "rollouts": rollouts, "v1": v1,
                            "server": lambda: BackgroundServer(Server(cfg, trusted_keys=pub, rollout_dir=rollouts),
                                                               bundle=v1)})


class Traffic:
    """Unversioned requests from a few threads until stopped; keeps every response."""

    def __init__(self, url, threads=4):
        self.url, self.threads, self.responses, self._stop = url, threads, [], threading.Event()
        self._lock = threading.Lock()

    def _run(self):
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                r = c.post(f"{self.url}/v2/models/{MODEL}/infer", json=ONES)
                with self._lock:
                    self.responses.append(r)

    def __enter__(self):
        self._pool = ThreadPoolExecutor(self.threads)
        self._futs = [self._pool.submit(self._run) for _ in range(self.threads)]
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for f in self._futs:
            f.result()
        self._pool.shutdown()


def status(url):
    return httpx.get(f"{url}/v2/models/{MODEL}/rollout").json()


def wait_for(pred, timeout=60.0, what="condition", detail=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} {detail()}")


def load(url, bundle):
    return httpx.post(f"{url}/v2/repository/models/{MODEL}/load", json={"parameters": {"bundle": bundle}},
                      timeout=60)


def test_broken_canary_rolls_back_without_losing_requests(env):
    make_toy_bundle(env.rollouts / "v2", env.priv, version=2, broken=True, cloud_half=False)
    with env.server() as url:
        r = load(url, "v2")
        assert r.status_code == 200, r.text
        assert {"model": MODEL, "version": "2", "kind": "full", "role": "canary"} in r.json()["models"]
        assert status(url)["canary"] == "2"
        with Traffic(url) as t:
            wait_for(lambda: status(url)["canary"] is None, what="rollback")
        codes = {x.status_code for x in t.responses}
        assert codes == {200}, codes  # canary failures were answered by the stable version
        assert {x.json()["model_version"] for x in t.responses} == {"1"}
        s = status(url)
        assert s["stable"] == "1"
        event = [h for h in s["history"] if h["event"] == "rolled back"]
        assert event and event[0]["version"] == "2" and "error rate" in event[0]["detail"]
        assert "rolled back: error rate" in s["retired"]["2"]
        wait_for(lambda: list(status(url)["versions"]) == ["1"], what="canary drained")
        r = httpx.post(f"{url}/v2/models/{MODEL}/versions/2/infer", json=ONES)
        assert r.status_code == 404 and "rolled back" in r.json()["error"]
        assert 'edgelearn_serve_rollouts_total{model="kws-toy",outcome="rolled_back",version="2"} 1.0' \
            in httpx.get(f"{url}/metrics").text


def test_good_canary_walks_1_10_50_100_and_is_promoted(env):
    make_toy_bundle(env.rollouts / "v2", env.priv, version=2, cloud_half=False)
    with env.server() as url:
        for _ in range(5):  # stable traffic first: an idle model would advance on time alone
            assert httpx.post(f"{url}/v2/models/{MODEL}/infer", json=ONES).status_code == 200
        assert load(url, str(env.rollouts / "v2")).status_code == 200
        with Traffic(url) as t:
            wait_for(lambda: status(url)["stable"] == "2", what="promotion",
                     detail=lambda: status(url)["history"])
            time.sleep(0.2)  # some traffic after the switch
        assert {x.status_code for x in t.responses} == {200}
        versions = [x.json()["model_version"] for x in t.responses]
        assert versions[-1] == "2" and "1" in versions and "2" in versions
        steps = [h["detail"] for h in status(url)["history"] if h["event"] == "canary"]
        assert steps == ["1%", "10%", "50%", "100%"]
        wait_for(lambda: list(status(url)["versions"]) == ["2"], what="old version drained")
        meta = httpx.get(f"{url}/v2/models/{MODEL}").json()
        assert meta["versions"] == ["2"]


def test_bad_bundles_are_refused_and_change_nothing(env):
    make_toy_bundle(env.rollouts / "v2", env.priv, version=2, cloud_half=False)
    tampered = shutil.copytree(env.rollouts / "v2", env.rollouts / "tampered")
    (tampered / "model.onnx").write_bytes((tampered / "model.onnx").read_bytes()[:-1] + b"\0")
    other_priv, _ = generate_keypair(env.tmp / "other", name="other")
    make_toy_bundle(env.rollouts / "foreign", other_priv, version=3, cloud_half=False)
    shutil.copytree(env.v1, env.rollouts / "old")
    outside = make_toy_bundle(env.tmp / "outside", env.priv, version=4, cloud_half=False)
    make_toy_bundle(env.rollouts / "dead", env.priv, version=5, dead=True)  # with a (healthy) cloud half
    with env.server() as url:
        r = load(url, "tampered")
        assert r.status_code == 400 and "model.onnx" in r.json()["error"]
        r = load(url, "foreign")
        assert r.status_code == 400 and "not among the trusted keys" in r.json()["error"]
        r = load(url, "old")
        assert r.status_code == 409 and "not newer than the stable version 1" in r.json()["error"]
        r = load(url, str(outside))
        assert r.status_code == 400 and "outside the rollout directory" in r.json()["error"]
        r = load(url, "dead")
        assert r.status_code == 400 and "fails its warm-up check" in r.json()["error"]
        assert "is uniform" in r.json()["error"]
        assert httpx.get(f"{url}/v2/models/{MODEL}.cloud").status_code == 404  # nothing half-loaded
        r = httpx.post(f"{url}/v2/repository/models/{MODEL}/load", content=b"{nope")
        assert r.status_code == 400 and "parameters" in r.json()["error"]
        s = status(url)
        assert s["stable"] == "1" and s["canary"] is None and list(s["versions"]) == ["1"]
        assert load(url, "v2").status_code == 200  # the good one still loads afterwards
        r = load(url, "v2")
        # With no traffic the canary advances on time alone, so on a slow machine v2 may
        # already be stable by now; either way a second load of v2 is refused.
        assert r.status_code == 409 and ("already rolling out version 2" in r.json()["error"]
                                         or "not newer than the stable version 2" in r.json()["error"])
