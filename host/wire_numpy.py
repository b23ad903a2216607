"""Vectorised numpy twin of ``edge.portable.wire`` for the aggregator and the fleet simulator.

Same frames, same bytes, same errors: the header, metadata, record structure,
HMAC and freshness checks are the portable functions themselves; only the
per-element work (payload decoding, quantisation, top-k selection and the
rounding-noise stream) is numpy. tests/test_wire.py checks byte-for-byte
equality with the portable codec on random tensors and codecs.

    from host.wire_numpy import encode_update, decode_update, TopKEncoder
    frame = encode_update(hdr, [("conv1/w", w), ("conv1/b", b)], key, codec=INT8)
    upd = decode_update(frame, keys.get, last_seq=seen.get, round_id=12)
    upd.tensor("conv1/w").values          # float32 ndarray with the tensor's shape
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import numpy as np

from edge.portable import wire_topk
from edge.portable.quant import FLT_MAX, lfib24_state, symmetric_scale
from edge.portable.wire import (DENSE_F32, FLAG_SUBSET, HEADER_FMT, HEADER_LEN, INT8, MAGIC,
                                MAX_FRAME_LEN, MAX_TENSORS,
                                TAG_LEN, VERSION, _codec_for, check_header,
                                check_tensor, default_seed, encode_meta, topk_index_width)
from edge.portable.wire_decode import check_scale, decode_frame
from edge.portable.wire_errors import EncodeError, MalformedFrame

__all__ = ["encode_update", "decode_update", "TopKEncoder", "lfib24_stream"]

_WARMUP = 220
_MASK24 = 0xFFFFFF


def lfib24_stream(seed: int, n: int) -> np.ndarray:
    """The first ``n`` outputs of ``edge.portable.quant.Lfib24(seed)`` as int64, in blocks of 24."""
    total = 55 + _WARMUP + n
    x = np.empty(total, dtype=np.int64)
    x[:55] = np.asarray(lfib24_state(seed), dtype=np.int64)
    # x[m] needs x[m-24] and x[m-55]; any 24 consecutive outputs depend only on earlier ones.
    for start in range(55, total, 24):
        end = min(start + 24, total)
        x[start:end] = (x[start - 55:end - 55] + x[start - 24:end - 24]) & _MASK24
    return x[55 + _WARMUP:]


def _quantize(v: np.ndarray, scale: float, draws: np.ndarray) -> np.ndarray:
    if scale == 0.0:
        return np.zeros(v.shape, dtype=np.int8)
    t = v.astype(np.float64) / scale + draws / 16777216.0
    return np.clip(np.floor(t), -127, 127).astype(np.int8)


class TopKEncoder(wire_topk.TopKEncoder):
    """``edge.portable.wire.TopKEncoder`` with numpy residuals; the same selection, bit for bit."""

    def select(self, name, values):
        n = values.size
        r = self.residuals.get(name)
        if r is not None and r.size != n:
            raise EncodeError("tensor %r had %d values in an earlier round and %d now" % (name, r.size, n),
                              fix="call TopKEncoder.reset() after changing the model")
        v = values if r is None else values + r
        a = np.abs(v)
        if n and not np.all(a <= FLT_MAX):
            raise EncodeError("tensor %r plus its residual is not finite at index %d"
                              % (name, int(np.argmin(a <= FLT_MAX))),
                              fix="call TopKEncoder.reset(); the update diverged")
        k = self.k_for(n)
        order = np.argsort(-a, kind="stable")[:k]  # stable: ties go to the lower index
        return (name, np.sort(order), symmetric_scale(float(a[order[0]])) if k else 0.0)

    def write_np(self, values, selection, draws):
        name, idx, scale = selection
        r = self.residuals.get(name)
        r = values.copy() if r is None else values + r
        sent = r[idx]
        q = _quantize(sent, scale, draws)
        r[idx] = sent - q.astype(np.float32) * np.float32(scale)
        self.residuals[name] = r
        width = "<u2" if topk_index_width(values.size) == 2 else "<u4"
        return struct.pack("<If", len(idx), scale) + idx.astype(width).tobytes() + q.tobytes()


def _as_entries(tensors):
    for t in tensors:
        if len(t) == 2:
            name, arr = t
            arr = np.asarray(arr)
            yield name, arr.shape, arr
        else:
            yield t


def encode_update(header, tensors, key, codec=INT8, topk=None, only=None, seed=None,
                  max_len=MAX_FRAME_LEN) -> bytes:
    """``edge.portable.wire.encode_update`` for numpy: tensors are ``(name, ndarray)`` or ``(name, shape, flat)``."""
    check_header(header)
    idb = header.device_id.encode()
    meta = encode_meta(header.meta)
    flags = header.flags
    entries = list(_as_entries(tensors))
    if only is not None:
        flags |= FLAG_SUBSET
        keep = only if callable(only) else (lambda n, s=frozenset(only): n in s)
        entries = [e for e in entries if keep(e[0])]
    if len(entries) > MAX_TENSORS:
        raise EncodeError("%d tensors, at most %d fit one frame" % (len(entries), MAX_TENSORS))
    hmac.new(bytes(key), b"", hashlib.sha256)  # a bad key fails before any residual changes
    plan, names, total, draws = [], set(), 0, 0
    for name, shape, values in entries:
        nb, shape, n, total = check_tensor(name, tuple(int(d) for d in shape), names, total)
        with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, rejected below
            v = np.asarray(values, dtype=np.float32).reshape(-1)
        if v.size != n:
            raise EncodeError("tensor %r has %d values but shape %r needs %d" % (name, v.size, shape, n))
        c = _codec_for(codec, name)
        a = np.abs(v)
        if n and not np.all(a <= FLT_MAX):
            bad = v[np.argmin(a <= FLT_MAX)]
            raise EncodeError("tensor %r holds %r, not a finite float32" % (name, float(bad)),
                              fix="clip or drop the update; a diverged step must not reach the aggregator")
        if c == DENSE_F32:
            extra, plen = None, 4 * n
        elif c == INT8:
            extra, plen = symmetric_scale(float(a.max()) if n else 0.0), 4 + n
            draws += n
        else:
            if topk is None:
                raise EncodeError("tensor %r uses TOPK_INT8 but no TopKEncoder was given" % name,
                                  fix="pass topk=TopKEncoder(fraction=...) and keep it across rounds")
            extra = topk.select(name, v)
            plen = 8 + len(extra[1]) * (topk_index_width(n) + 1)
            draws += len(extra[1])
        plan.append((nb, shape, c, v, plen, extra))
    size = HEADER_LEN + len(idb) + len(meta) + TAG_LEN + sum(
        1 + len(p[0]) + 2 + 4 * len(p[1]) + 4 + p[4] for p in plan)
    if size > max_len:
        raise EncodeError("the frame would be %d bytes, above the %d-byte limit" % (size, max_len),
                          fix="use INT8 or TOPK_INT8, or send a subset (only=)")
    stream = lfib24_stream(default_seed(header) if seed is None else seed, draws)
    parts = [struct.pack(HEADER_FMT, MAGIC, VERSION, flags, len(plan), size, header.round_id,
                         header.model_version, header.seq, header.num_examples, len(idb),
                         len(header.meta), 0), idb, bytes(meta)]
    pos = 0
    for nb, shape, c, v, plen, extra in plan:
        parts.append(struct.pack("<B%dsBB%dII" % (len(nb), len(shape)), len(nb), nb, c, len(shape),
                                 *shape, plen))
        if c == DENSE_F32:
            parts.append(v.astype("<f4").tobytes())
        elif c == INT8:
            parts.append(struct.pack("<f", extra))
            parts.append(_quantize(v, extra, stream[pos:pos + v.size]).tobytes())
            pos += v.size
        else:
            k = len(extra[1])
            parts.append(topk.write_np(v, extra, stream[pos:pos + k]))
            pos += k
    body = b"".join(parts)
    return body + hmac.new(bytes(key), body, hashlib.sha256).digest()


def _payload(frame: bytes, record) -> np.ndarray:
    name, shape, codec, n, off, plen = record
    if codec == DENSE_F32:
        out = np.frombuffer(frame, dtype="<f4", count=n, offset=off).astype(np.float32)
        if not np.all(np.abs(out) <= FLT_MAX):
            raise MalformedFrame("tensor %r holds %r; values must be finite"
                                 % (name, float(out[np.argmin(np.abs(out) <= FLT_MAX)])))
        return out.reshape(shape)
    if codec == INT8:
        (scale,) = struct.unpack_from("<f", frame, off)
        k, qoff, idx = n, off + 4, None
    else:
        k, scale = struct.unpack_from("<If", frame, off)
        width = topk_index_width(n)
        idx = np.frombuffer(frame, dtype="<u2" if width == 2 else "<u4", count=k, offset=off + 8)
        qoff = off + 8 + k * width
        if k and (idx[-1] >= n or (k > 1 and not np.all(idx[1:] > idx[:-1]))):
            bad = int(idx[-1]) if idx[-1] >= n else int(idx[1:][np.argmin(idx[1:] > idx[:-1])])
            raise MalformedFrame("tensor %r: top-k index %d is out of order or >= %d" % (name, bad, n))
    check_scale(name, scale)
    q = np.frombuffer(frame, dtype=np.int8, count=k, offset=qoff)
    if k and q.min() == -128:
        raise MalformedFrame("tensor %r holds int8 -128; the codec's range is [-127, 127]" % name)
    vals = q.astype(np.float32) * np.float32(scale)
    if idx is None:
        return vals.reshape(shape)
    out = np.zeros(n, dtype=np.float32)
    out[idx] = vals
    return out.reshape(shape)


def decode_update(frame, key, last_seq=None, round_id=None, model_version=None,
                  max_len=MAX_FRAME_LEN) -> "Update":
    """``edge.portable.wire.decode_update`` with ndarray values shaped like each tensor."""
    return decode_frame(bytes(frame), key, last_seq, round_id, model_version, max_len, _payload)
