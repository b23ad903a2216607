"""Replica faults on a live server: breakers, retries, deep health checks, restarts, backpressure.

Faults are injected through the documented hook (``--fault-injection``,
POST /v2/debug/models/M/versions/V/replicas/I/fault), so everything runs
through real worker processes and real HTTP on loopback.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from host.keys import generate_keypair
from host.serve.app import Server
from host.serve.background import BackgroundServer
from host.serve.config import ServeConfig
from bench._toymodels import make_toy_bundle

MODEL = "kws-toy"
X = np.random.default_rng(0).standard_normal((1, 49, 10, 1)).astype(np.float32)
BODY = {"inputs": [{"name": "features", "shape": [1, 49, 10, 1], "datatype": "FP32", "data": X.ravel().tolist()}]}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    priv, pub = generate_keypair(tmp / "keys")
    return make_toy_bundle(tmp / "b1", priv, version=1, cloud_half=False), pub


def serve(bundle, **cfg):
    path, pub = bundle
    base = dict(replicas=3, fault_injection=True, health_interval=3600.0, breaker_open=0.5,
                breaker_min_calls=3, breaker_window=6)
    return BackgroundServer(Server(ServeConfig(**{**base, **cfg}), trusted_keys=pub), bundle=path)


def fault(url, replica, **change):
    r = httpx.post(f"{url}/v2/debug/models/{MODEL}/versions/1/replicas/{replica}/fault", json=change)
    assert r.status_code == 200, r.text


def blast(url, n, threads=6, tenant="t"):
    with httpx.Client(timeout=30) as c, ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: c.post(f"{url}/v2/models/{MODEL}/infer", json=BODY,
                                              headers={"X-Tenant": tenant}), range(n)))


def replica_batches(url) -> dict:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        if fam.name == "edgelearn_serve_replica_batches":
            for s in fam.samples:
                if s.name.endswith("_total") and s.labels["model"] == MODEL:
                    key = (s.labels["replica"], s.labels["outcome"])
                    out[key] = out.get(key, 0) + s.value
    return out


def replicas(url) -> list[dict]:
    return httpx.get(f"{url}/v2/models/{MODEL}/rollout").json()["versions"]["1"]["replicas"]


def wait_for(pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_failing_replica_is_cut_off_and_comes_back(bundle):
    with serve(bundle) as url:
        fault(url, 0, fail=True)
        codes = [r.status_code for r in blast(url, 90)]
        assert codes == [200] * 90  # failed batches were retried on a healthy replica
        assert replicas(url)[0]["breaker"] in ("open", "half_open")
        before = replica_batches(url)
        blast(url, 60)
        after = replica_batches(url)
        sent_to_0 = sum(after.get(("0", o), 0) - before.get(("0", o), 0) for o in ("ok", "error"))
        assert sent_to_0 <= 2  # at most a half-open probe or two while it is still failing
        fault(url, 0, fail=False)
        wait_for(lambda: (blast(url, 12), replicas(url)[0]["breaker"] == "closed")[1], what="breaker to close")
        before = replica_batches(url)
        blast(url, 90)
        assert replica_batches(url).get(("0", "ok"), 0) > before.get(("0", "ok"), 0)  # traffic returned


def test_slow_replica_breaker_opens_and_requests_still_succeed(bundle):
    with serve(bundle, breaker_slow_call=0.1, breaker_open=5.0) as url:
        fault(url, 1, delay=0.3)
        codes = []
        wait_for(lambda: (codes.extend(r.status_code for r in blast(url, 30)),
                          replicas(url)[1]["breaker"] == "open")[1], what="the slow replica's breaker to open")
        assert set(codes) == {200}
        before = replica_batches(url)
        assert {r.status_code for r in blast(url, 60)} == {200}
        after = replica_batches(url)
        assert after.get(("1", "ok"), 0) - before.get(("1", "ok"), 0) <= 2  # half-open probes at most


def test_deep_check_replaces_a_replica_that_answers_nan(bundle):
    with serve(bundle, replicas=2, health_interval=0.2) as url:
        old_pid = replicas(url)[0]["pid"]
        fault(url, 0, nan=True)  # the fault stays with the slot, so restarts do not cure it
        wait_for(lambda: replicas(url)[0]["pid"] != old_pid and not replicas(url)[0]["restarting"], 30,
                 "the NaN replica to be restarted")
        r0 = replicas(url)[0]
        assert not r0["healthy"] and "NaN" in r0["last_check"]
        before = replica_batches(url)
        assert [r.status_code for r in blast(url, 30)] == [200] * 30
        after = replica_batches(url)
        assert after.get(("0", "ok"), 0) + after.get(("0", "error"), 0) == \
            before.get(("0", "ok"), 0) + before.get(("0", "error"), 0)  # removed from routing
        fault(url, 0, nan=False)
        wait_for(lambda: replicas(url)[0]["healthy"], 30, "the replica to pass its deep check again")


def test_a_worker_that_dies_idle_is_restarted_before_the_next_health_check(bundle):
    # no request is in flight, so no batch fails; the health interval is an hour
    with serve(bundle, replicas=2) as url:
        pid = replicas(url)[1]["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: replicas(url)[1]["pid"] not in (pid, None) and replicas(url)[1]["healthy"],
                 60, "restart of an idle worker")
        codes = [r.status_code for r in blast(url, 6, 2)]
        assert codes == [200] * 6


def test_crashed_worker_is_restarted_without_failing_requests(bundle):
    with serve(bundle, replicas=2) as url:
        fault(url, 0, delay=0.2)
        pid = replicas(url)[0]["pid"]
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(blast, url, 30, 4)
            time.sleep(0.3)
            os.kill(pid, signal.SIGKILL)
            codes = [r.status_code for r in fut.result()]
        assert codes == [200] * 30
        wait_for(lambda: replicas(url)[0]["pid"] not in (pid, None) and replicas(url)[0]["healthy"],
                 30, "restart")


def test_full_queue_answers_503_with_retry_after(bundle):
    with serve(bundle, replicas=1, max_queue=2, max_inflight_per_replica=1, max_batch_size=1,
               breaker_slow_call=10.0) as url:
        fault(url, 0, delay=0.2)
        res = blast(url, 12, threads=12)
        codes = sorted(r.status_code for r in res)
        assert set(codes) == {200, 503}, codes
        assert codes.count(200) >= 3  # one in flight plus a full queue of two
        busy = next(r for r in res if r.status_code == 503)
        assert int(busy.headers["retry-after"]) >= 1
        assert "queue is full (2 requests)" in busy.json()["error"]
        text = httpx.get(f"{url}/metrics").text
        assert 'reason="queue_full"' in text


def test_wait_budget_rejects_at_arrival_what_would_wait_too_long(bundle):
    # One replica that takes 1 s per batch and a 200 ms wait budget: once the
    # server has seen one batch's compute time, a request arriving while the
    # replica is busy would wait ~1 s, so it is refused at once (with the queue
    # bound far away), and the one that found the replica idle is served.
    with serve(bundle, replicas=1, max_queue=50, max_queue_wait=0.2, max_inflight_per_replica=1,
               max_batch_size=1, breaker_slow_call=10.0) as url:
        fault(url, 0, delay=1.0)
        assert blast(url, 1, threads=1)[0].status_code == 200   # measures the compute time
        res = blast(url, 4, threads=4)
        codes = sorted(r.status_code for r in res)
        assert codes == [200, 503, 503, 503], codes
        busy = next(r for r in res if r.status_code == 503)
        assert "over the 200 ms budget" in busy.json()["error"]
        assert int(busy.headers["retry-after"]) >= 1
        assert 'reason="queue_wait"' in httpx.get(f"{url}/metrics").text


def batch_stats(url) -> tuple[float, float, dict]:
    count = total = 0.0
    buckets = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        if fam.name == "edgelearn_serve_batch_size":
            for s in fam.samples:
                if s.labels.get("model") != MODEL:
                    continue
                if s.name.endswith("_count"):
                    count += s.value
                elif s.name.endswith("_sum"):
                    total += s.value
                elif s.name.endswith("_bucket"):
                    buckets[s.labels["le"]] = buckets.get(s.labels["le"], 0) + s.value
    return count, total, buckets


def test_requests_waiting_for_a_busy_replica_are_batched(bundle):
    with serve(bundle, replicas=1, max_batch_size=4, max_inflight_per_replica=1, breaker_slow_call=10.0) as url:
        fault(url, 0, delay=0.1)
        c0, s0, _ = batch_stats(url)
        assert [r.status_code for r in blast(url, 12, threads=12)] == [200] * 12
        count, total, buckets = batch_stats(url)
        assert total - s0 == 12                  # every row went through exactly once
        assert count - c0 < 12                   # ... in fewer batches than requests
        assert buckets["4.0"] == count           # none larger than max_batch_size
