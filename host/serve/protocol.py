"""Open Inference Protocol (KServe v2) request parsing and response encoding.

Pure functions over bytes and numpy arrays, with the binary tensor data
extension (``Inference-Header-Content-Length``, ``binary_data_size``,
``binary_data``); the HTTP layer (``host.serve.app``) only moves bytes. Every
problem raises ``ProtocolError(status, message)``, which the app turns into
``{"error": message}`` with that status. An input value the model cannot use
is refused, never passed on: NaN or ±Inf in a float input (binary, or JSON
NaN/Infinity/1e400), a JSON number the datatype cannot hold (1e39 for FP32,
300 or 1.5 for UINT8), a BOOL byte other than 0 or 1.

    >>> spec = ModelSpec("kws", "3", [TensorSpec("features", "FP32", [-1, 49, 10, 1])], [...])
    >>> req = parse_infer_request(body, headers.get("inference-header-content-length"), spec, 64)
    >>> body, headers = encode_infer_response(spec, req, {"logits": array})
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np

try:  # orjson parses a 490-float tensor ~10x faster than the stdlib, the largest cost per request
    import orjson

    def _loads(b: bytes):
        return orjson.loads(b)

    def _dumps(doc) -> bytes:
        return orjson.dumps(doc)
    _JSONError: tuple = (orjson.JSONDecodeError, UnicodeDecodeError)
except ModuleNotFoundError:  # the stdlib is correct, only slower
    def _loads(b: bytes):
        return json.loads(b)

    def _dumps(doc) -> bytes:
        return json.dumps(doc, separators=(",", ":")).encode()
    _JSONError = (json.JSONDecodeError, UnicodeDecodeError)

# OIP datatype <-> numpy; BYTES is handled separately (length-prefixed strings).
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
ORT_TO_OIP = {
    "tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(float16)": "FP16",
    "tensor(int8)": "INT8", "tensor(uint8)": "UINT8", "tensor(int16)": "INT16",
    "tensor(uint16)": "UINT16", "tensor(int32)": "INT32", "tensor(uint32)": "UINT32",
    "tensor(int64)": "INT64", "tensor(uint64)": "UINT64", "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


class ProtocolError(Exception):
    """A request the protocol says to refuse; ``status`` is the HTTP status, ``reason`` the label a
    400 is counted under in /metrics (``non_finite``, ``out_of_range``; else ``bad_request``)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None,
                 reason: str | None = None):
        super().__init__(message)
        self.status, self.message, self.headers, self.reason = status, message, dict(headers or {}), reason


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: list[int]  # -1 = any size

    def to_json(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass
class ModelSpec:
    name: str
    version: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    platform: str = "onnxruntime_onnx"

    def metadata(self, versions: list[str]) -> dict:
        return {"name": self.name, "versions": versions, "platform": self.platform,
                "inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs]}


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    batch: int
    # requested outputs: name -> send as binary? (empty = all outputs, as JSON
    # unless the request-level ``binary_data_output`` parameter says binary)
    outputs: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False


def _json_header(body: bytes, header_length: str | None) -> tuple[dict, bytes]:
    if header_length is None:
        json_bytes, rest = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise ProtocolError(400, f"Inference-Header-Content-Length must be an integer, got {header_length!r}")
        if not 0 < n <= len(body):
            raise ProtocolError(400, f"Inference-Header-Content-Length is {n} but the body has {len(body)} bytes")
        json_bytes, rest = body[:n], body[n:]
    try:
        header = _loads(json_bytes)
    except _JSONError as e:
        header = _with_non_finite(json_bytes, e)
    if not isinstance(header, dict):
        raise ProtocolError(400, "request body must be a JSON object with an 'inputs' list")
    return header, rest


def _with_non_finite(json_bytes: bytes, err: Exception) -> dict:
    """A body that is JSON but for NaN, ±Infinity or a number too large for a double, parsed with those
    as floats so that the input decoder refuses them naming the input and element; else the JSON error."""
    if b"NaN" in json_bytes or b"Infinity" in json_bytes or "infinity" in str(err).lower():
        try:
            return json.loads(json_bytes)  # the stdlib reads NaN/Infinity, and 1e400 as inf
        except (ValueError, RecursionError):
            pass
    raise ProtocolError(400, f"request body is not valid JSON: {err}")


def _first(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


def _plain(v) -> str:
    """A number as the client sent it (``1e+39``), not numpy 2's repr of its scalar (``np.float64(1e+39)``)."""
    return repr(v.item() if isinstance(v, np.generic) else v)


def _refuse_non_finite(arr: np.ndarray, name: str, dt: str, src: np.ndarray | None = None) -> None:
    """400 ``non_finite`` if ``arr`` holds NaN or ±Inf (``src``: the JSON values it was cast from)."""
    bad = ~np.isfinite(arr.ravel())
    if bad.any():
        i = _first(bad)
        v = (src if src is not None else arr).ravel()[i]
        what = f"{_plain(v)}, which overflows {dt}" if src is not None and np.isfinite(v) else f"{v}"
        raise ProtocolError(400, f"input '{name}' element {i} is {what}: a model input must be finite "
                                 f"(NaN and ±Inf are refused); send finite {dt} values", reason="non_finite")


def _cast(flat: np.ndarray, dt: str, name: str) -> np.ndarray:
    """JSON values as ``dt``, refusing any the type cannot hold instead of wrapping or overflowing."""
    target = DTYPES[dt]
    if flat.dtype.kind == "f":
        _refuse_non_finite(flat, name, dt)
    if target.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            out = flat.astype(target)
        _refuse_non_finite(out, name, dt, src=flat)
        return out
    if target.kind in "iu" and flat.size:
        info = np.iinfo(target)
        if flat.dtype.kind == "f":  # 2^k bounds are exact in a double: min <= v < max + 1
            ok = (flat == np.floor(flat)) & (flat >= float(info.min)) & (flat < float(info.max) + 1)
            # beyond 2^53 a double is not one integer: the JSON parser turns an integer literal outside
            # int64/uint64 into the nearest double, which may land on a bound (-2^63 - 1 -> -2^63)
            ok &= np.abs(flat) < 2.0 ** 53
        else:
            ok = (flat >= int(info.min)) & (flat <= int(info.max))
        if not ok.all():
            i = _first(~ok)
            raise ProtocolError(400, f"input '{name}' element {i} is {_plain(flat[i])}, which is not a {dt} "
                                     f"(integers from {info.min} to {info.max}, beyond 2^53 as integer "
                                     f"literals, not mixed with fractions); send {dt} values",
                                reason="out_of_range")
    if target.kind == "b" and flat.dtype.kind != "b" and flat.size and not np.isin(flat, (0, 1)).all():
        i = _first(~np.isin(flat, (0, 1)))
        raise ProtocolError(400, f"input '{name}' element {i} is {_plain(flat[i])}, not a BOOL; send true/false or 0/1",
                            reason="out_of_range")
    return flat.astype(target)


def _exact_ints(data, flat: np.ndarray, dt: str, name: str) -> np.ndarray:
    """Integer literals numpy read as doubles (it does when int64 cannot hold them all, e.g. 0 and
    2^63 for a UINT64 tensor): taken exactly as ``dt`` when every one fits; ``flat`` otherwise."""
    values = np.asarray(data, dtype=object).ravel()
    if not all(type(v) is int for v in values):
        return flat  # fractions or booleans among them: _cast decides
    info = np.iinfo(DTYPES[dt])
    for i, v in enumerate(values):
        if not info.min <= v <= info.max:
            raise ProtocolError(400, f"input '{name}' element {i} is {v}, which is not a {dt} (integers from "
                                     f"{info.min} to {info.max}); send {dt} values", reason="out_of_range")
    return np.array(values.tolist(), dtype=DTYPES[dt])


def _big_ints(values: np.ndarray, dt: str, name: str) -> np.ndarray:
    """Integers too large for numpy (object array): out of range for every integer type; floats else."""
    if DTYPES[dt].kind in "iub":
        i = next(i for i, v in enumerate(values) if not -2**63 <= v < 2**64)
        raise ProtocolError(400, f"input '{name}' element {i} is {values[i]}, which is not a {dt}; send {dt} values",
                            reason="out_of_range")
    try:
        return np.array([float(v) for v in values])
    except OverflowError:
        raise ProtocolError(400, f"input '{name}' holds an integer too large for {dt}; send finite {dt} values",
                            reason="non_finite") from None


def _check_shape(name: str, shape, spec: TensorSpec) -> list[int]:
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise ProtocolError(400, f"input '{name}' shape must be a list of non-negative integers, got {shape!r}")
    if len(shape) != len(spec.shape) or any(w != -1 and w != d for d, w in zip(shape, spec.shape)):
        raise ProtocolError(400, f"input '{name}' has shape {shape}, model expects {spec.shape} (-1 = any)")
    return shape


def _decode_bytes_tensor(raw: bytes, count: int, name: str) -> np.ndarray:
    items, pos = [], 0
    for _ in range(count):
        if pos + 4 > len(raw):
            raise ProtocolError(400, f"input '{name}': BYTES binary data is truncated")
        (n,) = struct.unpack_from("<I", raw, pos)
        items.append(raw[pos + 4:pos + 4 + n])
        pos += 4 + n
    if pos != len(raw):
        raise ProtocolError(400, f"input '{name}': BYTES binary data has {len(raw) - pos} trailing bytes")
    return np.array(items, dtype=object)


def _decode_input(item, spec_by_name: dict[str, TensorSpec], model: str, rest: bytes, offset: int
                  ) -> tuple[str, np.ndarray, int]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ProtocolError(400, "each entry of 'inputs' must be an object with a string 'name'")
    name = item["name"]
    spec = spec_by_name.get(name)
    if spec is None:
        raise ProtocolError(400, f"unexpected input '{name}' for model '{model}'; expected: "
                                 + ", ".join(sorted(spec_by_name)))
    dt = item.get("datatype")
    if dt != spec.datatype:
        raise ProtocolError(400, f"input '{name}' has datatype {dt!r}, model '{model}' expects {spec.datatype}")
    shape = _check_shape(name, item.get("shape"), spec)
    count = int(np.prod(shape)) if shape else 1
    params = item.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError(400, f"input '{name}': 'parameters' must be an object")
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ProtocolError(400, f"input '{name}': binary_data_size must be a non-negative integer")
        if offset + size > len(rest):
            raise ProtocolError(400, f"input '{name}': binary_data_size {size} runs past the end of the body "
                                     f"({len(rest) - offset} binary bytes left)")
        raw = rest[offset:offset + size]
        if dt == "BYTES":
            arr = _decode_bytes_tensor(raw, count, name)
        else:
            want = count * DTYPES[dt].itemsize
            if size != want:
                raise ProtocolError(400, f"input '{name}': binary_data_size is {size} bytes, shape {shape} "
                                         f"of {dt} needs {want}")
            arr = np.frombuffer(raw, dtype=DTYPES[dt].newbyteorder("<")).astype(DTYPES[dt], copy=False)
            if arr.dtype.kind == "f":
                _refuse_non_finite(arr, name, dt)
            elif dt == "BOOL" and raw and max(raw) > 1:
                i = next(i for i, b in enumerate(raw) if b > 1)
                raise ProtocolError(400, f"input '{name}' element {i} is byte {raw[i]}, not a BOOL (0 or 1)",
                                    reason="out_of_range")
        return name, arr.reshape(shape), offset + size
    if "data" not in item:
        raise ProtocolError(400, f"input '{name}' has neither 'data' nor a binary_data_size parameter")
    try:
        if dt == "BYTES":
            flat = np.array([s.encode() if isinstance(s, str) else bytes(s)
                             for s in np.asarray(item["data"], dtype=object).ravel()], dtype=object)
        else:
            flat = np.asarray(item["data"]).ravel()  # nested lists are allowed by the protocol
            if flat.dtype.kind == "f" and DTYPES[dt].kind in "iu":
                flat = _exact_ints(item["data"], flat, dt, name)
            if flat.dtype == object and flat.size and all(type(v) is int for v in flat):
                flat = _big_ints(flat, dt, name)
            if flat.dtype == object or (flat.size and flat.dtype.kind not in "biuf"):
                raise ValueError("non-numeric data")
            if dt != "BOOL" and flat.dtype.kind == "b":
                raise ValueError("booleans for a numeric tensor")
            flat = _cast(flat, dt, name)  # NaN, ±Inf, overflow and out-of-range values are refused
    except (ValueError, TypeError) as e:
        raise ProtocolError(400, f"input '{name}': 'data' is not a list of {dt} values ({e})")
    if flat.size != count:
        raise ProtocolError(400, f"input '{name}' has {flat.size} values, shape {shape} needs {count}")
    return name, flat.reshape(shape), offset


def parse_infer_request(body: bytes, header_length: str | None, spec: ModelSpec,
                        max_batch_size: int) -> InferRequest:
    """Parse and validate one infer request body against ``spec``."""
    header, rest = _json_header(body, header_length)
    inputs_json = header.get("inputs")
    if not isinstance(inputs_json, list) or not inputs_json:
        raise ProtocolError(400, "request must have a non-empty 'inputs' list")
    spec_by_name = {t.name: t for t in spec.inputs}
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for item in inputs_json:
        name, arr, offset = _decode_input(item, spec_by_name, spec.name, rest, offset)
        if name in inputs:
            raise ProtocolError(400, f"input '{name}' is given twice")
        inputs[name] = arr
    if offset != len(rest):
        raise ProtocolError(400, f"{len(rest) - offset} bytes of binary data after the header are not "
                                 "claimed by any input's binary_data_size")
    missing = [t.name for t in spec.inputs if t.name not in inputs]
    if missing:
        raise ProtocolError(400, f"missing input(s) {', '.join(missing)} for model '{spec.name}'")
    batches = {int(a.shape[0]) for a in inputs.values() if a.ndim}
    if len(batches) > 1:
        raise ProtocolError(400, f"inputs disagree on the batch size (first dimension): {sorted(batches)}")
    batch = batches.pop() if batches else 1
    if not 1 <= batch <= max_batch_size:
        raise ProtocolError(400, f"batch size {batch} is outside 1..{max_batch_size}; split the request")
    params = header.get("parameters") or {}
    binary_default = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    outputs: dict[str, bool] = {}
    out_names = {t.name for t in spec.outputs}
    for item in header.get("outputs") or []:
        if not isinstance(item, dict) or item.get("name") not in out_names:
            got = item.get("name") if isinstance(item, dict) else item
            raise ProtocolError(400, f"unknown output {got!r} for model '{spec.name}'; available: "
                                     + ", ".join(sorted(out_names)))
        p = item.get("parameters") or {}
        outputs[item["name"]] = bool(p.get("binary_data", binary_default)) if isinstance(p, dict) else binary_default
    req_id = header.get("id")
    return InferRequest(req_id if isinstance(req_id, str) else None, inputs, batch, outputs, binary_default)


def _datatype_of(arr: np.ndarray) -> str:
    if arr.dtype == object or arr.dtype.kind in "SU":
        return "BYTES"
    for name, dt in DTYPES.items():
        if arr.dtype == dt:
            return name
    raise ProtocolError(500, f"cannot encode output of numpy dtype {arr.dtype}")


def _bytes_payload(arr: np.ndarray) -> bytes:
    parts = []
    for v in arr.ravel():
        b = v.encode() if isinstance(v, str) else bytes(v)
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


def encode_infer_response(model: str, version: str, req: InferRequest,
                          results: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """Body and extra headers for an infer response (binary extension when asked)."""
    names = list(req.outputs) or list(results)
    outputs, blobs = [], []
    for name in names:
        arr = results[name]
        dt = _datatype_of(arr)
        entry: dict = {"name": name, "datatype": dt, "shape": list(arr.shape)}
        if req.outputs.get(name, req.binary_default):
            blob = _bytes_payload(arr) if dt == "BYTES" else np.ascontiguousarray(arr).astype(
                arr.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif dt == "BYTES":
            entry["data"] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in arr.ravel()]
        else:
            entry["data"] = arr.ravel().tolist()
        outputs.append(entry)
    doc: dict = {"model_name": model, "model_version": version, "outputs": outputs}
    if req.id is not None:
        doc["id"] = req.id
    head = _dumps(doc)
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream",
                                     "inference-header-content-length": str(len(head))}
