"""The flat int8 tensor blob for MicroPython targets (layout: docs/partition.md): the writer.

Every constant tensor of the model (int8 weights, int32 biases) with its
quantisation, in a format a board reads with ``struct.unpack_from`` and
``memoryview`` slices - no flatbuffers on the device.

    >>> write_blob(load_graph("enc.tflite"), Path("weights.elb"))
    >>> read_blob(Path("weights.elb"))[0]["name"]
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np

from edge.atomic import atomic_write
from edge.portable.model_load import BLOB_VERSION as VERSION
from edge.portable.model_load import DTYPE_CODES, MAGIC, read_index
from host.partition.graph import Graph

DTYPES = {np.dtype(c).name: k for k, c in DTYPE_CODES.items()}  # numpy dtype name -> blob code


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
    """Every tensor of a blob with numpy data, in blob order; read by the device's own reader
    (``edge.portable.model_load.read_index``), so host and board read one layout one way.
    Raises ``ModelBlobError`` (a ValueError) naming what is wrong."""
    raw = Path(path).read_bytes()
    index, data_start = read_index(io.BytesIO(raw), zero_points=True)
    out = []
    for name, (code, shape, axis, scales, zps, off, nbytes) in index.items():
        dt = np.dtype(code).newbyteorder("<")
        arr = np.frombuffer(raw, dtype=dt, count=nbytes // dt.itemsize, offset=data_start + off)
        out.append({"name": name, "dtype": dt.name, "shape": shape, "axis": axis, "scales": tuple(scales),
                    "zero_points": zps, "data": arr.reshape(shape)})
    return out
