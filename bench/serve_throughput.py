"""Serving throughput and latency: edgelearn serve vs MLServer vs ONNX Runtime called directly.

Both servers run as subprocesses on 127.0.0.1 with two model workers each
(edgelearn: ``--replicas 2``; MLServer 1.7.1: ``parallel_workers: 2`` and the
ONNX Runtime runtime in bench/_mlserver_onnx.py), serve the same ONNX file and
get the same JSON OIP requests (batch 1) from the same closed-loop load
generator at several concurrencies. Reported: throughput at equal p99 (the
p99 MLServer reaches at its saturating concurrency) and the p50 each adds over
a direct ``session.run`` of the same input. The model is the shipped bundle's
ONNX file when models/kws-dscnn-s exists, else the toy model of
bench/_toymodels.py (the row says which).

    $ nice -n 10 .venv/bin/python -m bench.serve_throughput      # or: edgelearn bench serve_throughput

The helpers here (server start-up, a keep-alive HTTP/1.1 load generator in
asyncio, closed and open loops) are shared by serve_overload and serve_faults.
A hand-written client because httpx/aiohttp cost more CPU per request than the
servers under test on a 2-core machine, which would measure the client.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import row, write_results
from host.netutil import free_port

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 4, 8, 16)
SECONDS = 3.0


def model_under_test(tmp: Path) -> dict:
    """The shipped bundle if present (signed, with its keys), else a freshly signed toy bundle."""
    shipped = ROOT / "models" / "kws-dscnn-s"
    if (shipped / "manifest.json").exists():
        from edge.kws import default_trusted_keys
        from host.serve.loader import load_bundle_models
        served = load_bundle_models(shipped, default_trusted_keys(), work_dir=tmp)
        main = next(m for m in served.models if m.kind == "full")
        return {"bundle": shipped, "pub": default_trusted_keys(), "onnx": main.path, "name": main.name,
                "input": main.spec.inputs[0], "version": served.version, "label": f"shipped {served.model_id} v{served.version}"}
    from host.keys import generate_keypair
    from host.serve.loader import spec_from_onnx
    from bench._toymodels import make_toy_bundle
    priv, pub = generate_keypair(tmp / "keys")
    b = make_toy_bundle(tmp / "toy", priv, version=1, cloud_half=False)
    spec = spec_from_onnx(str(b / "model.onnx"), "kws-toy", "1")
    return {"bundle": b, "pub": pub, "onnx": str(b / "model.onnx"), "name": "kws-toy", "input": spec.inputs[0],
            "version": "1",
            "label": "toy model (models/kws-dscnn-s not built yet)"}


def request_body(model: dict, rows: int = 1, seed: int = 0) -> tuple[bytes, np.ndarray]:
    t = model["input"]
    shape = [rows if i == 0 else d for i, d in enumerate(t.shape)]
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    body = {"inputs": [{"name": t.name, "shape": shape, "datatype": "FP32", "data": x.ravel().tolist()}]}
    return json.dumps(body).encode(), x


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    import httpx
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not become ready")


def start_edgelearn(model: dict, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    if "--tenant-rate" not in extra:  # quotas are measured in serve_faults; elsewhere they stay out of the way
        extra = (*extra, "--tenant-rate", "1e9", "--tenant-burst", "1e9")
    cmd = [sys.executable, "-m", "edge.cli", "serve", "--bundle", str(model["bundle"]), "--pubkey",
           str(model["pub"]), "--host", "127.0.0.1", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_ready(port, proc)
    return proc, port


def mlserver_exe() -> str:
    """MLServer 1.7.1 pins starlette < 0.47 (via fastapi 0.115) and breaks with uvloop >= 0.22
    (SeldonIO/MLServer#2286), so it lives in its own virtualenv, not in the project's."""
    for cand in (os.environ.get("EDGELEARN_MLSERVER"), ROOT / ".venv-mlserver" / "bin" / "mlserver"):
        if cand and Path(cand).is_file():
            return str(cand)
    found = shutil.which("mlserver", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("MLServer not found: python -m venv .venv-mlserver && .venv-mlserver/bin/pip install "
                           "mlserver==1.7.1 onnxruntime 'uvloop<0.22' (or set EDGELEARN_MLSERVER)")
    return found


def start_mlserver(model: dict, tmp: Path, workers: int = 2, delay_ms: float = 0.0) -> tuple[subprocess.Popen, int]:
    port = free_port()
    d = tmp / "mlserver"
    (d / "kws").mkdir(parents=True, exist_ok=True)
    (d / "settings.json").write_text(json.dumps({
        "http_port": port, "grpc_port": free_port(), "metrics_endpoint": None, "parallel_workers": workers,
        "host": "127.0.0.1", "debug": False}))
    (d / "kws" / "model-settings.json").write_text(json.dumps({
        "name": model["name"], "implementation": "_mlserver_onnx.OnnxRuntimeModel",
        "parameters": {"uri": str(model["onnx"]), "extra": {"delay_ms": delay_ms}}}))
    exe = mlserver_exe()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench")}
    proc = subprocess.Popen([exe, "start", str(d)], cwd=d, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    wait_ready(port, proc)
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class Conn:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1."""

    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None

    async def request(self, raw: bytes) -> tuple[int, dict, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(raw)
        status = int((await self.reader.readline()).split()[1])
        headers = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        body = await self.reader.readexactly(int(headers.get("content-length", 0)))
        if headers.get("connection") == "close":
            self.close()
        return status, headers, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def raw_post(path: str, body: bytes, headers: dict | None = None) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def closed_loop(port: int, raw: bytes, concurrency: int, seconds: float) -> dict:
    lat, codes = [], []
    end = time.perf_counter() + seconds

    async def worker():
        c = Conn(port)
        try:
            while time.perf_counter() < end:
                t = time.perf_counter()
                status, _, _ = await c.request(raw)
                lat.append(time.perf_counter() - t)
                codes.append(status)
        finally:
            c.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    ok = [l for l, s in zip(lat, codes) if s == 200]
    return {"concurrency": concurrency, "throughput": len(ok) / wall, "p50": pct(ok, 50), "p99": pct(ok, 99),
            "errors": sum(s != 200 for s in codes), "n": len(codes)}


async def open_loop(port: int, raws, rate: float, seconds: float, timeout: float = 10.0,
                    max_conns: int = 512) -> list[dict]:
    """Send at a fixed rate regardless of answers (``raws``: a bytes or a callable i -> (tag, bytes))."""
    idle: list[Conn] = []
    results: list[dict] = []
    tasks = []
    busy = [0]
    n = int(rate * seconds)
    t0 = time.perf_counter()

    async def one(i):
        tag, raw = raws(i) if callable(raws) else ("", raws)
        if not idle and busy[0] >= max_conns:
            results.append({"tag": tag, "status": 0, "latency": 0.0, "t": i / rate, "note": "client saturated"})
            return
        c = idle.pop() if idle else Conn(port)
        busy[0] += 1
        t = time.perf_counter()
        try:
            status, headers, _ = await asyncio.wait_for(c.request(raw), timeout)
            idle.append(c)
        except asyncio.TimeoutError:
            c.close()
            status, headers = -1, {}
        finally:
            busy[0] -= 1
        results.append({"tag": tag, "status": status, "latency": time.perf_counter() - t,
                        "retry_after": headers.get("retry-after"), "t": t - t0})

    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    for c in idle:
        c.close()
    return results


def pct(values, q) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def direct_ort(model: dict, x: np.ndarray) -> float:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(model["onnx"]), opts, providers=["CPUExecutionProvider"])
    feed = {model["input"].name: x}
    for _ in range(50):
        sess.run(None, feed)
    times = []
    for _ in range(1000):
        t = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def sweep(port: int, raw: bytes) -> list[dict]:
    return [asyncio.run(closed_loop(port, raw, c, SECONDS)) for c in CONCURRENCY]


def best_under(curve: list[dict], p99_budget: float) -> float:
    ok = [r["throughput"] for r in curve if r["p99"] <= p99_budget and not r["errors"]]
    return max(ok) if ok else 0.0


def main() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        tmp = Path(tmp)
        model = model_under_test(tmp)
        body, x = request_body(model)
        raw = raw_post(f"/v2/models/{model['name']}/infer", body)
        t_ort = direct_ort(model, x)
        curves = {}
        for name, start in (("edgelearn", lambda: start_edgelearn(model, "--replicas", "2")),
                            ("MLServer 1.7.1", lambda: start_mlserver(model, tmp))):
            proc, port = start()
            try:
                asyncio.run(closed_loop(port, raw, 4, 1.0))  # warm-up
                curves[name] = sweep(port, raw)
            finally:
                stop(proc)
    ours, ref = curves["edgelearn"], curves["MLServer 1.7.1"]
    budget = max(r["p99"] for r in ref if r["concurrency"] == 8)
    rows = []
    for a, b in zip(ours, ref):
        rows.append(row("serve_throughput", f"throughput at concurrency {a['concurrency']} (JSON, batch 1)",
                        round(a["throughput"], 1), "req/s", "MLServer 1.7.1", round(b["throughput"], 1),
                        ratio=a["throughput"] / b["throughput"], p99_ms=round(a["p99"] * 1e3, 3),
                        baseline_p99_ms=round(b["p99"] * 1e3, 3), model=model["label"]))
    t_ours, t_ref = best_under(ours, budget), best_under(ref, budget)
    rows.append(row("serve_throughput", f"throughput at equal p99 <= {budget * 1e3:.1f} ms", round(t_ours, 1),
                    "req/s", "MLServer 1.7.1", round(t_ref, 1), ratio=(t_ours / t_ref) if t_ref else None,
                    goal=">= 1.5x", model=model["label"]))
    p50_ours, p50_ref = ours[0]["p50"], ref[0]["p50"]
    rows.append(row("serve_throughput", "added p50 over direct ONNX Runtime (concurrency 1, client included)",
                    round((p50_ours - t_ort) * 1e3, 3), "ms", "MLServer 1.7.1", round((p50_ref - t_ort) * 1e3, 3),
                    goal="<= 1 ms", direct_ort_ms=round(t_ort * 1e3, 4), model=model["label"]))
    for r in rows:  # the machine is shared: say how busy it was
        r["load_avg_1min"] = round(os.getloadavg()[0], 2)
    write_results("serve_throughput", rows)
    return rows


if __name__ == "__main__":
    main()
