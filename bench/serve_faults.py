"""Faults: one of three replicas slowed by +500 ms or failing, and a tenant flooding at 10x its quota.

Side by side in one run, on 127.0.0.1:
* slow / failing replica: edgelearn with its circuit breakers vs the same server
  with breakers blind to slowness (power of two choices alone). Reported: the
  slowed replica's share of batches after its breaker opened (goal < 1 %), its
  share after the fault is cleared (it must come back), client p99 and errors.
* noisy tenant: a quiet tenant at a modest rate, alone and then beside a tenant
  sending 10x its quota; the quiet tenant's p99 rise (goal <= 10 %), against
  the same flood on a server without quotas.

Faults come from the documented hook (``edgelearn serve --fault-injection``).

    $ nice -n 10 .venv/bin/python -m bench.serve_faults
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import row, write_results
from bench.serve_throughput import (closed_loop, model_under_test, open_loop, pct, raw_post, request_body,
                                    start_edgelearn, stop)

PHASE = 4.0
QUOTA = 50.0  # requests/s for each tenant in the isolation test


def batches_by_replica(port: int, model: str) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("edgelearn_serve_replica_batches_total{") and f'model="{model}"' in line:
            rid = line.split('replica="', 1)[1].split('"', 1)[0]
            out[rid] = out.get(rid, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def share_of(port, model, raw, replica="0", seconds=PHASE) -> tuple[float, dict]:
    before = batches_by_replica(port, model)
    stats = asyncio.run(closed_loop(port, raw, 8, seconds))
    after = batches_by_replica(port, model)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    total = sum(delta.values())
    return (delta.get(replica, 0) / total if total else float("nan")), stats


def fault(port, model, version, **change) -> None:
    r = httpx.post(f"http://127.0.0.1:{port}/v2/debug/models/{model}/versions/{version}/replicas/0/fault",
                   json=change)
    r.raise_for_status()


def replica_fault_case(model, raw, change: dict, breaker_ms: float) -> dict:
    proc, port = start_edgelearn(model, "--replicas", "3", "--fault-injection", "--breaker-slow-call-ms",
                                 str(breaker_ms), "--breaker-open-s", "2")
    name = model["name"]
    version = httpx.get(f"http://127.0.0.1:{port}/v2/models/{name}").json()["versions"][0]
    try:
        healthy_share, _ = share_of(port, name, raw, seconds=2.0)
        fault(port, name, version, **change)
        asyncio.run(closed_loop(port, raw, 8, 2.0))  # the breaker needs a few calls to open
        faulty_share, stats = share_of(port, name, raw)
        fault(port, name, version, delay=0.0, fail=False)
        time.sleep(2.5)  # open -> half-open
        asyncio.run(closed_loop(port, raw, 8, 2.0))  # probes close it
        back_share, _ = share_of(port, name, raw)
    finally:
        stop(proc)
    return {"healthy": healthy_share, "faulty": faulty_share, "recovered": back_share, "p99": stats["p99"],
            "errors": stats["errors"], "n": stats["n"]}


def tenant_case(model, body, quota: float | None) -> dict:
    args = ["--replicas", "2"] + (["--tenant-rate", str(quota), "--tenant-burst", str(quota)] if quota else
                                  ["--tenant-rate", "1e9", "--tenant-burst", "1e9"])
    proc, port = start_edgelearn(model, *args)
    path = f"/v2/models/{model['name']}/infer"
    quiet = raw_post(path, body, {"X-Tenant": "quiet"})
    noisy = raw_post(path, body, {"X-Tenant": "noisy"})
    alone, with_flood, flood = [], [], []
    try:
        asyncio.run(closed_loop(port, quiet, 2, 1.0))

        async def both():
            return await asyncio.gather(open_loop(port, quiet, QUOTA * 0.6, PHASE / 2),
                                        open_loop(port, noisy, QUOTA * 10, PHASE / 2))
        # Alternate the phases so a burst from elsewhere on a shared machine is
        # unlikely to land on only one of them.
        for _ in range(3):
            alone += asyncio.run(open_loop(port, quiet, QUOTA * 0.6, PHASE / 2))
            q, f = asyncio.run(both())
            with_flood += q
            flood += f
    finally:
        stop(proc)
    lat = lambda rs: [r["latency"] for r in rs if r["status"] == 200]  # noqa: E731
    return {"alone_p99": pct(lat(alone), 99), "with_p99": pct(lat(with_flood), 99),
            "quiet_errors": sum(r["status"] != 200 for r in with_flood),
            "flood_rejected": sum(r["status"] == 429 for r in flood), "flood_sent": len(flood)}


def main() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        model = model_under_test(Path(tmp))
        body, _ = request_body(model)
        raw = raw_post(f"/v2/models/{model['name']}/infer", body)
        slow = replica_fault_case(model, raw, {"delay": 0.5}, breaker_ms=250)
        slow_ref = replica_fault_case(model, raw, {"delay": 0.5}, breaker_ms=1e9)
        failing = replica_fault_case(model, raw, {"fail": True}, breaker_ms=250)
        quiet = tenant_case(model, body, QUOTA)
        quiet_ref = tenant_case(model, body, None)
    pc = lambda v: round(100 * v, 3)  # noqa: E731
    extra = dict(model=model["label"])
    rows = [
        row("serve_faults", "slowed replica (+500 ms): its share of batches, breaker open", pc(slow["faulty"]), "%",
            "power of two choices alone", pc(slow_ref["faulty"]), goal="< 1 %", share_before=pc(slow["healthy"]),
            **extra),
        row("serve_faults", "slowed replica: its share after recovery", pc(slow["recovered"]), "%",
            "share before the fault", pc(slow["healthy"]), ratio=slow["recovered"] / slow["healthy"], **extra),
        row("serve_faults", "slowed replica: client p99 (concurrency 8)", round(slow["p99"] * 1e3, 2), "ms",
            "power of two choices alone", round(slow_ref["p99"] * 1e3, 2), errors=slow["errors"], **extra),
        row("serve_faults", "failing replica: its share of batches, breaker open", pc(failing["faulty"]), "%",
            None, None, goal="< 1 %", client_errors=failing["errors"], requests=failing["n"], **extra),
        row("serve_faults", "failing replica: its share after recovery", pc(failing["recovered"]), "%",
            "share before the fault", pc(failing["healthy"]), ratio=failing["recovered"] / failing["healthy"], **extra),
        row("serve_faults", "quiet tenant p99 beside a 10x-quota flood (quotas on)",
            round(quiet["with_p99"] * 1e3, 3), "ms", "quiet tenant alone", round(quiet["alone_p99"] * 1e3, 3),
            ratio=quiet["with_p99"] / quiet["alone_p99"], goal="<= 1.1x", quiet_errors=quiet["quiet_errors"],
            flood_rejected=quiet["flood_rejected"], flood_sent=quiet["flood_sent"], **extra),
        row("serve_faults", "quiet tenant p99 beside the same flood, quotas off", round(quiet_ref["with_p99"] * 1e3, 3),
            "ms", "quiet tenant alone", round(quiet_ref["alone_p99"] * 1e3, 3),
            ratio=quiet_ref["with_p99"] / quiet_ref["alone_p99"], **extra),
    ]
    for r in rows:  # the machine is shared: say how busy it was
        r["load_avg_1min"] = round(os.getloadavg()[0], 2)
    write_results("serve_faults", rows)
    print(json.dumps({"slow": slow, "slow_ref": slow_ref, "failing": failing}, default=float)[:600])
    return rows


if __name__ == "__main__":
    main()
