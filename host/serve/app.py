"""The HTTP face of the shim: Open Inference Protocol v2 on Starlette.

    >>> server = Server(ServeConfig(), trusted_keys="keys/release.pub")
    >>> app = server.app(bundle="models/kws-dscnn-s")      # any ASGI server runs it
    >>> uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: ``/v2``, ``/v2/health/{live,ready}``, ``/v2/models/{m}[/versions/{v}]``
(metadata, ``/ready``, ``/infer``), ``/v2/models/{m}/rollout`` (status),
``/v2/repository/models/{m}/load`` (start a canary from a bundle in the rollout
directory), ``/v2/cascade/{m}`` and ``/v2/split/{m}`` (device endpoints),
``/metrics`` (Prometheus) and, only with ``fault_injection``,
``/v2/debug/models/{m}/versions/{v}/replicas/{i}/fault``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import tempfile
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge.errors import EdgelearnError
from host.serve import device
from host.serve.config import ServeConfig
from host.serve.loader import check_bundle_path, load_bundle_models
from host.serve.metrics import Metrics
from host.serve.policy import TenantQuotas
from host.serve.pool import ModelVersion, Overloaded
from host.serve.protocol import ProtocolError, encode_infer_response, parse_infer_request
from host.serve.replica import ReplicaError
from host.serve.rollout import ServedModel

SERVER_NAME, SERVER_VERSION = "edgelearn", "0.1.0"
MAX_TENANT_LABELS = 100  # beyond this, tenants share the label "other" (bounded metric cardinality)
log = logging.getLogger("edgelearn.serve")


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class Server:
    def __init__(self, config: ServeConfig | None = None, trusted_keys=None, *, allow_unsigned: bool = False,
                 rollout_dir: str | Path | None = None, clock=time.monotonic):
        self.cfg = config or ServeConfig()
        self.trusted_keys, self.allow_unsigned = trusted_keys, allow_unsigned
        self.rollout_dir = Path(rollout_dir) if rollout_dir else None
        self.clock = clock
        self.metrics = Metrics()
        self.quotas = TenantQuotas(self.cfg.tenant_rate, self.cfg.tenant_burst, clock,
                                   overrides=self.cfg.tenant_overrides)
        self.models: dict[str, ServedModel] = {}
        self.bundles: dict[str, object] = {}   # model_id -> ServedBundle of the stable version
        self._tenant_labels: set[str] = set()
        self._work = tempfile.TemporaryDirectory(prefix="edgelearn-serve-")
        self._load_lock = asyncio.Lock()
        self.client_disconnects = 0   # requests whose client left mid-body (logged once)

    # -- loading -----------------------------------------------------------------------------
    async def load(self, bundle_path) -> dict:
        """Verify a bundle and serve it: first version stable, later versions as a canary."""
        async with self._load_lock:
            served = await asyncio.to_thread(load_bundle_models, bundle_path, self.trusted_keys,
                                             allow_unsigned=self.allow_unsigned, work_dir=Path(self._work.name))
            # All-or-nothing: check every model of the bundle first, and withdraw the
            # canaries already started if a later one fails its warm-up.
            for sm in served.models:
                if sm.name in self.models:
                    self.models[sm.name].check_can_roll_out(sm.version)
            started, canaries = [], []
            try:
                for sm in served.models:
                    model = self.models.get(sm.name) or ServedModel(sm.name, self.cfg, self.metrics, self.clock)
                    mv = ModelVersion(sm.name, sm.version, sm.path, sm.spec, self.cfg, self.metrics,
                                      sm.score_output)
                    mv.info = sm  # type: ignore[attr-defined]
                    mv.bundle = served  # type: ignore[attr-defined]
                    await model.begin_canary(mv)
                    self.models.setdefault(sm.name, model)
                    if model.canary == sm.version:
                        canaries.append(model)
                    started.append({"model": sm.name, "version": sm.version, "kind": sm.kind,
                                    "role": "stable" if model.stable == sm.version else "canary"})
            except BaseException as e:
                for model in canaries:
                    model.abort_canary(f"a sibling model of bundle v{served.version} failed: {e}")
                raise
            self.bundles.setdefault(served.model_id, served)
            return {"model_id": served.model_id, "version": served.version, "models": started}

    # -- helpers -----------------------------------------------------------------------------
    def model(self, name: str) -> ServedModel:
        m = self.models.get(name)
        if m is None:
            raise ProtocolError(404, f"unknown model '{name}'; served: {', '.join(sorted(self.models)) or 'none'}")
        return m

    def tenant(self, request: Request) -> str:
        t = request.headers.get(self.cfg.tenant_header, "anonymous")[:64] or "anonymous"
        return t

    def _tenant_label(self, tenant: str) -> str:
        if tenant in self._tenant_labels or len(self._tenant_labels) < MAX_TENANT_LABELS:
            self._tenant_labels.add(tenant)
            return tenant
        return "other"

    async def body(self, request: Request) -> bytes:
        """The whole request body, within ``max_body_bytes`` and ``body_timeout`` seconds (else 413/408)."""
        limit = self.cfg.max_body_bytes
        cl = request.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > limit:
            raise ProtocolError(413, f"request body is {cl} bytes, the limit is {limit}")

        async def read() -> bytes:
            chunks, n = [], 0
            async for chunk in request.stream():
                n += len(chunk)
                if n > limit:
                    raise ProtocolError(413, f"request body exceeds the limit of {limit} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

        # One deadline for the whole body, not per chunk: a client trickling a byte a second
        # would reset a per-chunk timer forever and hold its connection and task.
        try:
            return await asyncio.wait_for(read(), self.cfg.body_timeout)
        except asyncio.TimeoutError:
            raise ProtocolError(408, f"the request body did not arrive within {self.cfg.body_timeout:g} s; "
                                     f"send the whole body at once", {"Connection": "close"})

    def admit(self, model: str, tenant: str) -> None:
        ok, wait = self.quotas.take(tenant)
        if not ok:
            self.metrics.rejections.labels(model, "", self._tenant_label(tenant), "quota").inc()
            rate = self.cfg.tenant_overrides.get(tenant, (self.cfg.tenant_rate,))[0]
            raise ProtocolError(429, f"tenant '{tenant}' is over its quota of {rate:g} requests/s",
                                {"Retry-After": str(max(1, math.ceil(wait)))})

    def shed(self, model: ServedModel, version: str | None, tenant: str) -> None:
        """Refuse before reading and parsing the body when the queue is already full:
        under overload the parse is most of a rejection's cost."""
        mv = model.get(version)
        try:
            mv.check_room()
        except Overloaded as e:
            self.metrics.rejections.labels(model.name, mv.version, self._tenant_label(tenant), e.reason).inc()
            raise ProtocolError(503, f"{e}; retry later", {"Retry-After": str(max(1, math.ceil(e.retry_after)))})

    async def run(self, model: ServedModel, version: str | None, inputs: dict, rows: int, tenant: str):
        """Execute with metrics; turns overload and replica failures into protocol errors."""
        t0 = self.clock()
        label = self._tenant_label(tenant)
        try:
            mv, out = await model.infer(version, inputs, rows)
        except Overloaded as e:
            self.metrics.rejections.labels(model.name, version or model.stable or "", label, e.reason).inc()
            raise ProtocolError(503, f"{e}; retry later", {"Retry-After": str(max(1, math.ceil(e.retry_after)))})
        except ReplicaError as e:
            self.metrics.requests.labels(model.name, version or model.stable or "", label, "500").inc()
            raise ProtocolError(500, f"inference failed: {e}")
        self.metrics.requests.labels(model.name, mv.version, label, "200").inc()
        self.metrics.latency.labels(model.name, mv.version, label).observe(self.clock() - t0)
        return mv, out

    # -- handlers ----------------------------------------------------------------------------
    async def server_metadata(self, request: Request):
        return JSONResponse({"name": SERVER_NAME, "version": SERVER_VERSION,
                             "extensions": ["binary_tensor_data", "model_repository", "edgelearn_cascade",
                                            "edgelearn_split"]})

    async def live(self, request: Request):
        return JSONResponse({"live": True})

    async def ready(self, request: Request):
        ok = bool(self.models) and all(m.stable and m.versions[m.stable].ready for m in self.models.values())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def model_metadata(self, request: Request):
        m = self.model(request.path_params["model"])
        mv = m.get(request.path_params.get("version"))
        versions = sorted(v for v, x in m.versions.items() if not x.stopping)
        return JSONResponse(mv.spec.metadata(versions))

    async def model_ready(self, request: Request):
        m = self.model(request.path_params["model"])
        mv = m.get(request.path_params.get("version"))
        ok = mv.ready and any(s.routable_health for s in mv.slots)
        return JSONResponse({"name": m.name, "version": mv.version, "ready": ok}, status_code=200 if ok else 503)

    async def infer(self, request: Request):
        m = self.model(request.path_params["model"])
        version = request.path_params.get("version")
        spec = m.get(version).spec
        tenant = self.tenant(request)
        self.admit(m.name, tenant)
        self.shed(m, version, tenant)
        body = await self.body(request)
        req = parse_infer_request(body, request.headers.get("inference-header-content-length"), spec,
                                  self.cfg.max_batch_size)
        mv, out = await self.run(m, version, req.inputs, req.batch, tenant)
        payload, headers = encode_infer_response(m.name, mv.version, req, out)
        return Response(payload, headers=headers)

    async def rollout_status(self, request: Request):
        return JSONResponse(self.model(request.path_params["model"]).status())

    async def repository_load(self, request: Request):
        body = await self.body(request)
        try:
            doc = __import__("json").loads(body or b"{}")
            bundle = (doc.get("parameters") or {}).get("bundle")
        except (ValueError, AttributeError):
            raise ProtocolError(400, "load request body must be JSON like {\"parameters\": {\"bundle\": \"DIR\"}}")
        if not isinstance(bundle, str):
            raise ProtocolError(400, "load request needs parameters.bundle, the bundle path in the rollout directory")
        path = check_bundle_path(bundle, self.rollout_dir)
        try:
            result = await self.load(path)
        except ReplicaError as e:
            raise ProtocolError(400, f"new version refused: {e}")
        if result["model_id"] != request.path_params["model"]:
            raise ProtocolError(400, f"bundle holds model '{result['model_id']}', not "
                                     f"'{request.path_params['model']}' (it was loaded anyway)")
        return JSONResponse(result)

    async def metrics_endpoint(self, request: Request):
        from prometheus_client import CONTENT_TYPE_LATEST
        return Response(self.metrics.render(self.models), media_type=CONTENT_TYPE_LATEST)

    async def fault(self, request: Request):
        m = self.model(request.path_params["model"])
        mv = m.get(request.path_params["version"])
        i = int(request.path_params["index"])
        if not 0 <= i < len(mv.slots):
            raise ProtocolError(404, f"replica {i} does not exist (0..{len(mv.slots) - 1})")
        try:
            doc = __import__("json").loads(await self.body(request) or b"{}")
            await mv.slots[i].inject(delay=doc.get("delay"), fail=doc.get("fail"), nan=doc.get("nan"))
        except (ValueError, AttributeError, TypeError) as e:
            raise ProtocolError(400, f"fault body must be JSON like {{\"delay\": 0.5, \"fail\": false}} ({e})")
        return JSONResponse({"replica": i, "applied": doc})

    # -- app ---------------------------------------------------------------------------------
    def count_refusal(self, request: Request, e: ProtocolError) -> None:
        """A 400 in /metrics (``rejections``, reason ``non_finite``, ``out_of_range`` or ``bad_request``);
        labels only ever hold served model names and versions, so bad requests cannot grow them."""
        name = request.path_params.get("model")
        model = self.models.get(name)
        version = request.path_params.get("version")
        self.metrics.rejections.labels(name if model else "other",
                                       version if model and version in model.versions else "",
                                       self._tenant_label(self.tenant(request)), e.reason or "bad_request").inc()

    def app(self, bundle=None) -> Starlette:
        def wrap(handler):
            async def endpoint(request: Request):
                try:
                    return await handler(request)
                except ProtocolError as e:
                    if e.status == 400:
                        self.count_refusal(request, e)
                    return _error(e.status, e.message, e.headers)
                except EdgelearnError as e:
                    return _error(400, str(e))
                except ClientDisconnect:
                    # The client hung up mid-body: nobody is left to answer, and a traceback per
                    # disconnect buries the log (thousands under load), so one line, once.
                    self.client_disconnects += 1
                    if self.client_disconnects == 1:
                        log.warning("serve: a client disconnected before sending its whole request "
                                    "(not logged again)")
                    return Response(status_code=499)
            return endpoint

        v = "/v2/models/{model}"
        vv = v + "/versions/{version}"
        routes = [
            Route("/v2", wrap(self.server_metadata)),
            Route("/v2/health/live", wrap(self.live)),
            Route("/v2/health/ready", wrap(self.ready)),
            Route(v, wrap(self.model_metadata)), Route(vv, wrap(self.model_metadata)),
            Route(v + "/ready", wrap(self.model_ready)), Route(vv + "/ready", wrap(self.model_ready)),
            Route(v + "/infer", wrap(self.infer), methods=["POST"]),
            Route(vv + "/infer", wrap(self.infer), methods=["POST"]),
            Route(v + "/rollout", wrap(self.rollout_status)),
            Route("/v2/repository/models/{model}/load", wrap(self.repository_load), methods=["POST"]),
            Route("/v2/cascade/{model}", wrap(lambda r: device.cascade(self, r)), methods=["POST"]),
            Route("/v2/split/{model}", wrap(lambda r: device.split(self, r)), methods=["POST"]),
            Route("/metrics", self.metrics_endpoint),
        ]
        if self.cfg.fault_injection:
            routes.append(Route("/v2/debug/models/{model}/versions/{version}/replicas/{index:int}/fault",
                                wrap(self.fault), methods=["POST"]))

        @contextlib.asynccontextmanager
        async def lifespan(app):
            if bundle is not None:
                await self.load(bundle)
            try:
                yield
            finally:
                await asyncio.gather(*(m.stop() for m in self.models.values()), return_exceptions=True)
                self._work.cleanup()

        return Starlette(routes=routes, lifespan=lifespan)

