"""Device endpoints: cascade (the full model's answer for a low-confidence clip)
and split inference (the cloud half of a partitioned model).

Both speak the Open Inference Protocol body format, so a device can reuse any
OIP client, and both add the answer a device acts on: ``label`` (BYTES),
``probabilities`` (FP32, softmax of the class scores) and ``confidence``.

    POST /v2/cascade/kws-dscnn-s   {"inputs": [{"name": "features", ...}]}   -> full model
    POST /v2/cascade/kws-dscnn-s   {"inputs": [{"name": "embedding", ...}]}  -> its classifier head
    POST /v2/split/kws-dscnn-s     {"inputs": [{"name": <cut tensor>, ...}],
                                    "parameters": {"partition": "cloud"}}    -> cloud half
"""

from __future__ import annotations

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from host.serve.health import to_probabilities
from host.serve.protocol import (ModelSpec, ProtocolError, TensorSpec, _json_header, encode_infer_response,
                                 parse_infer_request)


def _answer(scores: np.ndarray, labels: list[str]) -> dict[str, np.ndarray]:
    p = to_probabilities(scores)
    idx = p.argmax(-1)
    names = labels if len(labels) == p.shape[-1] else [str(i) for i in range(p.shape[-1])]
    return {"label": np.array([names[i].encode() for i in idx], dtype=object),
            "probabilities": p.astype(np.float32), "confidence": p.max(-1).astype(np.float32)}


def _answer_specs(n_classes: int) -> list[TensorSpec]:
    return [TensorSpec("label", "BYTES", [-1]), TensorSpec("probabilities", "FP32", [-1, n_classes]),
            TensorSpec("confidence", "FP32", [-1])]


async def _serve(server, request: Request, model, body: bytes, extra_outputs: bool) -> Response:
    mv = model.get(None)
    info = mv.info
    labels = mv.bundle.labels
    spec = model.get(None).spec
    n = len(labels)
    outputs = (list(spec.outputs) if extra_outputs else []) + (_answer_specs(n) if info.score_output else [])
    answer_spec = ModelSpec(model.name, mv.version, spec.inputs, outputs)
    req = parse_infer_request(body, request.headers.get("inference-header-content-length"), answer_spec,
                              server.cfg.max_batch_size)
    tenant = server.tenant(request)
    mv, out = await server.run(model, None, req.inputs, req.batch, tenant)
    if info.score_output:
        out = {**out, **_answer(out[info.score_output], mv.bundle.labels)}
    if not req.outputs:
        req.outputs = {t.name: req.binary_default for t in outputs}
    payload, headers = encode_infer_response(model.name, mv.version, req, out)
    return Response(payload, headers=headers)


def _input_names(body: bytes, request: Request) -> tuple[set, dict]:
    header, _ = _json_header(body, request.headers.get("inference-header-content-length"))
    items = header.get("inputs")
    if not isinstance(items, list):
        raise ProtocolError(400, "request must have a non-empty 'inputs' list")
    params = header.get("parameters") if isinstance(header.get("parameters"), dict) else {}
    return {i.get("name") for i in items if isinstance(i, dict)}, params


async def cascade(server, request: Request) -> Response:
    model_id = request.path_params["model"]
    full = server.model(model_id)
    server.admit(model_id, server.tenant(request))
    body = await server.body(request)
    names, _ = _input_names(body, request)
    head = server.models.get(f"{model_id}.head")
    full_inputs = {t.name for t in full.get(None).spec.inputs}
    head_inputs = {t.name for t in head.get(None).spec.inputs} if head else set()
    if names and names <= full_inputs:
        target = full
    elif head is not None and names and names <= head_inputs:
        target = head
    else:
        accepted = f"{sorted(full_inputs)} (features)" + (f" or {sorted(head_inputs)} (embedding)" if head else
                                                          "; this model has no separable head, so no embedding input")
        raise ProtocolError(400, f"cascade input(s) {sorted(n for n in names if n)} not recognised; send {accepted}")
    return await _serve(server, request, target, body, extra_outputs=False)


async def split(server, request: Request) -> Response:
    model_id = request.path_params["model"]
    server.admit(model_id, server.tenant(request))
    body = await server.body(request)
    _, params = _input_names(body, request)
    halves = {m.name[len(model_id) + 1:]: m for m in server.models.values()
              if m.name.startswith(model_id + ".") and m.stable and m.get(None).info.kind == "split"}
    if not halves:
        raise ProtocolError(404, f"model '{model_id}' has no cloud partition; split inference needs a bundle "
                                 "with a partition placed on \"cloud\"")
    part = params.get("partition")
    if part is None and len(halves) == 1:
        part = next(iter(halves))
    if part not in halves:
        raise ProtocolError(400, f"partition {part!r} is not a cloud partition of '{model_id}'; "
                                 f"choose parameters.partition from {sorted(halves)}")
    return await _serve(server, request, halves[part], body, extra_outputs=True)
