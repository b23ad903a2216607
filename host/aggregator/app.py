"""The aggregator's HTTP interface (Starlette); it translates requests and knows none of the math.

Endpoints (docs/protocol.md has the full contract):

    POST /v1/checkin          JSON device state, X-Edgelearn-Device + X-Edgelearn-Mac (HMAC of the body)
    POST /v1/updates          one wire frame (application/octet-stream), X-Edgelearn-Device
    POST /v1/chunks           one chunk of a frame; 202 {"missing": [...]} until the frame is whole
    GET  /v1/bundles/{v}.zip  a published, signed bundle
    GET  /v1/status           rounds, versions, devices (JSON)
    POST /v1/secagg           secure-aggregation messages (signed JSON; host/aggregator/secure.py)
    GET  /metrics             Prometheus text (host/aggregator/metrics.py)

    app = build_app("agg/")          # then: uvicorn.run(app, host="127.0.0.1", port=8470)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from edge.errors import EdgelearnError
from edge.portable import wire_errors as we
from edge.portable.chunks import parse_chunk
from host.aggregator.checkin import find_non_finite, load_object
from host.aggregator.config import AggregatorConfig, shared_config  # noqa: F401 (shared_config: re-exported)
from host.aggregator.errors import log_storage_error, revoked
from host.aggregator.metrics import metrics_registry
from host.aggregator.models import ModelRegistry
from host.aggregator.rounds import Reject, RoundManager
from host.aggregator.status import read_status, revoked_devices, status_of  # noqa: F401 (re-exported)
from host.aggregator.store import StateLock, open_store, state_db

MAX_CHECKIN = 4096


class Aggregator:
    """Store + registry + round manager of one state directory (and, with ``db``, of the database
    it names: on PostgreSQL several replicas, each with its own state directory, share one)."""

    def __init__(self, state_dir, clock=time.time, signing_key=None, db=None):
        self.dir = Path(state_dir)
        db = state_db(self.dir, db)  # --db, else the one init recorded in config.json
        shared = bool(db) and not str(db).startswith("sqlite:")
        if shared:
            self.dir.mkdir(parents=True, exist_ok=True)  # a new replica's local cache of files
        else:
            self.cfg = AggregatorConfig.load(self.dir / "config.json")
        # one process per state directory: a second would accept and close the same rounds
        self.lock = StateLock(self.dir)
        self.swept = sweep_leftovers(self.dir)
        self.store = None
        try:
            self.store = open_store(db, self.dir, "full" if shared else self.cfg.synchronous)
            if shared:
                self.cfg = shared_config(self.store)
            key = signing_key or self.store.get_meta("signing_key")
            if shared and not (key and Path(key).is_file()):
                raise EdgelearnError(f"this replica has no signing key ({key} does not exist here)",
                                     fix="pass --signing-key KEY, the aggregator key every replica of "
                                         f"{self.store.url} signs new versions with")
            self.registry = ModelRegistry(self.dir, self.store, key)
            self.rounds = RoundManager(self.cfg, self.store, self.registry, clock)
        except BaseException:
            self.close()
            raise
        self.group = None  # the HTTP app's GroupCommit, when serving

    def close(self):
        if self.store is not None:
            self.store.close()
        self.lock.release()


def sweep_leftovers(state_dir: Path) -> list[str]:
    """Remove what a crash mid-publication left in ``models/`` and ``bundles/``: temporary files of
    atomic writes (``.vN.npz.*``), half-built bundle directories (``.vN.building-*``), partial zips
    (``.vN.zip.*``) and ONNX heads (``.vN.onnx.*``; ``vN.onnx.tmp`` from older versions). Called only under the state lock, so no live
    writer owns them; a version is published only by the database commit that follows its files,
    so none of these was ever served. Returns the names removed."""
    import shutil

    gone = []
    for sub in ("models", "bundles"):
        d = state_dir / sub
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if p.name.startswith(".") or p.name.endswith(".onnx.tmp"):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                gone.append(f"{sub}/{p.name}")
    return gone


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) before reading more than ``limit`` bytes."""
    cl = request.headers.get("content-length")
    if cl is not None:
        if not cl.isdigit():
            raise Reject(400, "BadRequest", f"Content-Length {cl!r} is not a number", "send a valid HTTP request")
        if int(cl) > limit:
            raise Reject(413, "OversizedFrame", f"body of {cl} bytes exceeds the {limit}-byte limit",
                         "send a smaller update (INT8, TOPK_INT8 or a subset) or use /v1/chunks")
    buf = bytearray()
    async for part in request.stream():
        buf += part
        if len(buf) > limit:
            raise Reject(413, "OversizedFrame", f"body exceeds the {limit}-byte limit",
                         "send a smaller update or use /v1/chunks")
    return bytes(buf)


def _device(request: Request, required: bool = True):
    d = request.headers.get("x-edgelearn-device")
    if d is None and required:
        raise Reject(401, "Unauthenticated", "no X-Edgelearn-Device header",
                     "send the device id in X-Edgelearn-Device")
    return d


class GroupCommit:
    """Acknowledge an update only after the transaction holding it commits, one commit for every update
    the event loop has staged meanwhile (group commit): fsyncs no longer bound the upload rate.

    Decoding and checks run as each request arrives; the flush waits until a pass of the event loop
    stages nothing new (or ``max_batch`` is reached), then commits synchronously on the loop thread,
    so the store keeps a single writer and no request ever sees another's half-written state.
    """

    def __init__(self, rm: RoundManager, max_batch: int = 256):
        self.rm, self.max_batch = rm, max_batch
        self.seen_errors: set = set()  # kinds of failure already logged (log_storage_error)
        self.items: list = []
        self.flushing = None
        self.batches = self.committed = 0

    async def submit(self, frame: bytes, device: str) -> dict:
        p = self.rm.prepare(frame, device)
        if isinstance(p, dict):
            return p
        fut = asyncio.get_running_loop().create_future()
        self.items.append((p, fut))
        if self.flushing is None:
            self.flushing = asyncio.ensure_future(self._flush())
        res = await fut
        if isinstance(res, Reject):
            raise res
        return res

    async def _flush(self):
        seen = -1
        while len(self.items) != seen and len(self.items) < self.max_batch:
            seen = len(self.items)
            await asyncio.sleep(0)  # let requests already read stage their updates
        items, self.items, self.flushing = self.items, [], None
        try:
            results = self.rm.commit([p for p, _ in items])
        except Exception as e:  # never leave a request waiting forever
            log_storage_error(self.seen_errors, "commit", e)
            results = [Reject(500, "InternalError", f"commit failed: {type(e).__name__}: {e}",
                              "resend the update; nothing was acknowledged")] * len(items)
        self.batches += 1
        self.committed += len(items)
        for (_, fut), res in zip(items, results):
            if not fut.done():
                fut.set_result(res)


def build_app(state_dir, clock=time.time, tick_interval: float = 0.5, signing_key=None, db=None) -> Starlette:
    agg = Aggregator(state_dir, clock, signing_key, db)
    rm, store, cfg = agg.rounds, agg.store, agg.cfg
    group = GroupCommit(rm)
    refusals: dict = {}
    registry = metrics_registry(agg, refusals)

    def fail(e: Reject) -> JSONResponse:
        refusals[(e.status, e.error)] = refusals.get((e.status, e.error), 0) + 1
        return JSONResponse(e.body(), status_code=e.status)

    async def metrics(request: Request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def signed_json(request: Request, limit: int, what: str):
        """(device, JSON object) of a body signed with the device key in X-Edgelearn-Mac."""
        dev = _device(request)
        body = await _body(request, limit)
        cred = rm.credentials(dev, fresh=True)  # `aggregator revoke`/`provision` may have changed it meanwhile
        key = None if cred is None else cred[0]
        mac = request.headers.get("x-edgelearn-mac", "")
        want = hmac.new(key or b"\0" * 32, body, hashlib.sha256).hexdigest()
        if key is None:
            raise Reject(401, "UnknownDevice", f"no key is provisioned for device {dev!r}",
                         "provision the device with `edgelearn aggregator provision`")
        if not hmac.compare_digest(mac.encode(), want.encode()):
            raise Reject(401, "AuthError", f"{what} MAC from {dev!r} does not match its body",
                         "sign the exact body bytes with the device key")
        if cred[1] is not None:  # signed with the revoked key: its holder is told, in one sentence
            raise revoked(dev, cred[1])
        obj = load_object(body, what)
        if what != "check-in":  # the check-in schema names the field of a non-finite number itself
            bad = find_non_finite(obj)
            if bad is not None:
                raise Reject(400, "BadRequest", f"{what} field {bad} is not a finite number",
                             "send finite numbers (JSON has no NaN or Infinity)")
        return dev, obj

    async def secagg(request: Request):
        try:
            dev, msg = await signed_json(request, cfg.max_frame_len, "secagg")
            if rm.secure is None:
                raise Reject(409, "SecureAggregationOff", "this aggregator does not run secure aggregation",
                             "upload frames to /v1/updates")
            return JSONResponse(rm.secure.message(dev, msg))
        except Reject as e:
            return fail(e)

    async def checkin(request: Request):
        try:
            dev, state = await signed_json(request, MAX_CHECKIN, "check-in")
            return JSONResponse(rm.checkin(dev, state))  # validated there (host/aggregator/checkin.py)
        except Reject as e:
            return fail(e)

    async def updates(request: Request):
        try:
            dev = _device(request)
            frame = await _body(request, cfg.max_frame_len)
            return JSONResponse(await group.submit(frame, dev))
        except Reject as e:
            return fail(e)

    async def chunks(request: Request):
        try:
            dev = _device(request)
            cred = rm.credentials(dev, fresh=True)
            if cred is None:
                raise Reject(401, "UnknownDevice", f"no key is provisioned for device {dev!r}",
                             "provision the device first")
            if cred[1] is not None:  # chunks are not signed one by one: nothing of a revoked id is stored
                raise revoked(dev, cred[1])
            chunk = await _body(request, cfg.chunk_size + 64 if cfg.chunk_size else cfg.max_frame_len)
            try:
                fid, idx, count, flen, off, payload = parse_chunk(chunk, cfg.max_frame_len)
            except we.WireError as e:
                raise Reject.from_wire(e) from None
            frame = _add_chunk(store, dev, fid, idx, count, flen, bytes(payload))
            if isinstance(frame, list):
                return JSONResponse({"status": "partial", "missing": frame}, status_code=202)
            return JSONResponse(await group.submit(frame, dev))
        except Reject as e:
            return fail(e)

    async def bundle(request: Request):
        v = request.path_params["version"]
        path = agg.registry.bundle_file(v)  # on a shared store, fetched from the database if another replica built it
        if path is None:
            return fail(Reject(404, "NoSuchVersion", f"model version {v} is not published",
                               "check in to learn the current version"))
        return FileResponse(path, media_type="application/zip")

    async def status(request: Request):
        return JSONResponse(status_of(agg))

    async def ticker():
        while True:
            await asyncio.sleep(tick_interval)
            try:
                rm.tick()
            except Exception as e:  # never let the deadline loop die silently (logged once per kind)
                log_storage_error(group.seen_errors, "the round ticker", e)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(ticker()) if tick_interval else None
        yield
        if task:
            task.cancel()
        agg.close()

    async def storage_error(request: Request, exc: Exception):
        # the database went away or failed mid-request: nothing was acknowledged, the client retries
        log_storage_error(group.seen_errors, request.url.path, exc)
        return fail(Reject(503, "StorageError", f"the aggregator's database failed ({type(exc).__name__}: "
                           f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})",
                           "retry later; nothing was recorded"))

    app = Starlette(exception_handlers={store.Error: storage_error}, routes=[
        Route("/v1/checkin", checkin, methods=["POST"]),
        Route("/v1/updates", updates, methods=["POST"]),
        Route("/v1/chunks", chunks, methods=["POST"]),
        Route("/v1/secagg", secagg, methods=["POST"]),
        Route("/v1/bundles/{version:int}.zip", bundle, methods=["GET"]),
        Route("/v1/status", status, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ], lifespan=lifespan)
    app.state.aggregator = agg
    app.state.group_commit = agg.group = group
    return app


def _add_chunk(store, dev, fid, idx, count, flen, payload):
    """Persist one chunk (idempotent); returns the whole frame when complete, else the missing indices."""
    with store.tx() as c:
        # a device uploads one frame at a time: a new frame id supersedes what was pending
        c.execute("DELETE FROM chunks WHERE device_id=? AND frame_id<>?", (dev, fid))
        prev = c.execute("SELECT count, frame_len FROM chunks WHERE device_id=? AND frame_id=? LIMIT 1",
                         (dev, fid)).fetchone()
        if prev is not None and (prev[0] != count or prev[1] != flen):
            raise Reject(409, "ChunkError", f"chunk says frame 0x{fid:08x} is {flen} bytes in {count} chunks; "
                         f"earlier chunks said {prev[1]} in {prev[0]}", "give every frame its own frame id")
        same = c.execute("SELECT data FROM chunks WHERE device_id=? AND frame_id=? AND idx=?",
                         (dev, fid, idx)).fetchone()
        if same is not None and bytes(same[0]) != payload:
            raise Reject(409, "ChunkError", f"chunk {idx} of frame 0x{fid:08x} differs from the copy already received",
                         "give every frame its own frame id")
        if same is None:
            c.execute("INSERT INTO chunks(device_id, frame_id, idx, count, frame_len, data) VALUES(?,?,?,?,?,?)",
                      (dev, fid, idx, count, flen, payload))
        have = [r[0] for r in c.execute("SELECT idx FROM chunks WHERE device_id=? AND frame_id=? ORDER BY idx",
                                        (dev, fid))]
        if len(have) < count:
            return sorted(set(range(count)) - set(have))
        frame = b"".join(bytes(r[0]) for r in c.execute(
            "SELECT data FROM chunks WHERE device_id=? AND frame_id=? ORDER BY idx", (dev, fid)))
        c.execute("DELETE FROM chunks WHERE device_id=?", (dev,))
    return frame
