"""The flat int8 tensor blob for MicroPython targets (layout: docs/partition.md).

Every constant tensor of the model (int8 weights, int32 biases) with its
quantisation, in a format a board reads with ``struct.unpack_from`` and
``memoryview`` slices - no flatbuffers on the device.

    >>> write_blob(load_graph("enc.tflite"), Path("weights.elb"))
    >>> read_blob(Path("weights.elb"))[0]["name"]
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from edge.atomic import atomic_write
from host.partition.graph import Graph

MAGIC = b"ELB1"
VERSION = 1
DTYPES = {"int8": 0, "int32": 1, "int16": 2, "uint8": 3, "float32": 4}
_NP = {v: k for k, v in DTYPES.items()}


def _pad4(n: int) -> int:
    return (4 - n % 4) % 4


def write_blob(g: Graph, out: Path) -> Path:
    consts = [t for t in g.tensors if t.is_const and t.data is not None and t.dtype in DTYPES]
    index = bytearray()
    data = bytearray()
    for t in consts:
        name = t.name.encode()[:255]
        raw = np.ascontiguousarray(t.data).astype("<" + np.dtype(t.dtype).str[1:], copy=False).tobytes()
        data += bytes(_pad4(len(data)))
        offset = len(data)
        data += raw
        rec = struct.pack("<B", len(name)) + name
        rec += struct.pack("<BBb", DTYPES[t.dtype], len(t.shape), t.axis)
        rec += struct.pack(f"<{len(t.shape)}I", *t.shape)
        rec += struct.pack("<H", len(t.scales))
        rec += struct.pack(f"<{len(t.scales)}f", *t.scales) + struct.pack(f"<{len(t.scales)}i", *t.zero_points)
        rec += struct.pack("<II", offset, len(raw))
        index += rec
    header_len = 12
    data_start = header_len + len(index)
    data_start += _pad4(data_start)
    header = MAGIC + struct.pack("<HHI", VERSION, len(consts), data_start)
    blob = header + index + bytes(data_start - header_len - len(index)) + data
    atomic_write(out, blob, mode=None)
    return out


def read_blob(path: Path) -> list[dict]:
    """Reference reader (the MicroPython loader mirrors it with struct/array)."""
    buf = memoryview(Path(path).read_bytes())
    if bytes(buf[:4]) != MAGIC:
        raise ValueError(f"{path} is not an edgelearn tensor blob (magic {bytes(buf[:4])!r})")
    version, n, data_start = struct.unpack_from("<HHI", buf, 4)
    if version != VERSION:
        raise ValueError(f"{path} is blob version {version}, this reader knows {VERSION}")
    pos, out = 12, []
    for _ in range(n):
        ln = buf[pos]
        name = bytes(buf[pos + 1:pos + 1 + ln]).decode()
        pos += 1 + ln
        dt, ndim, axis = struct.unpack_from("<BBb", buf, pos)
        pos += 3
        shape = struct.unpack_from(f"<{ndim}I", buf, pos)
        pos += 4 * ndim
        (ns,) = struct.unpack_from("<H", buf, pos)
        pos += 2
        scales = struct.unpack_from(f"<{ns}f", buf, pos)
        zps = struct.unpack_from(f"<{ns}i", buf, pos + 4 * ns)
        pos += 8 * ns
        off, nbytes = struct.unpack_from("<II", buf, pos)
        pos += 8
        arr = np.frombuffer(buf[data_start + off:data_start + off + nbytes], dtype="<" + np.dtype(_NP[dt]).str[1:])
        out.append({"name": name, "dtype": _NP[dt], "shape": shape, "axis": axis, "scales": scales,
                    "zero_points": zps, "data": arr.reshape(shape)})
    return out
