"""Build an ``edge.portable.model.McuModel`` from ``weights.elb`` + ``graph.json`` (load-time code only).

Kept apart from the model's run-time code: on a board the loader runs once
at boot (and for a new bundle's smoke check) and its bytecode is then freed
(firmware/app.py ``unload``). Formats: docs/partition.md (blob),
docs/firmware.md (graph).

    from edge.portable.model_load import read_index
    with open("weights.elb", "rb") as f:
        index, data_start = read_index(f)      # {name: (dtype, shape, axis, scales, zps, offset, nbytes)}
"""

import array
import json
import struct

from edge.portable import kernels as K
from edge.portable.model import ModelBlobError

MAGIC = b"ELB1"
BLOB_VERSION = 1
GRAPH_FORMAT = "edgelearn-mcu-graph"
_DTYPE_CODES = {0: "b", 1: "i", 2: "h", 3: "B", 4: "f"}
_ITEM = {"b": 1, "i": 4, "h": 2, "B": 1, "f": 4}
# MicroPython raises ValueError where CPython raises struct.error, and has no struct.error
_STRUCT_ERROR = getattr(struct, "error", ValueError)


def read_index(f):
    """The blob's index: {name: (dtype code, shape, axis, scales, None, offset, nbytes)} and data_start."""
    head = f.read(12)
    if len(head) < 12 or head[:4] != MAGIC:
        raise ModelBlobError("not an edgelearn tensor blob (magic %r)" % (bytes(head[:4]),))
    ver, n, data_start = struct.unpack_from("<HHI", head, 4)
    if ver != BLOB_VERSION:
        raise ModelBlobError("tensor blob version %d, this firmware reads %d" % (ver, BLOB_VERSION),
                             fix="update the firmware, or deploy a bundle built for it")
    index = f.read(data_start - 12)
    if len(index) != data_start - 12:
        raise ModelBlobError("tensor blob is truncated inside its index")
    out = {}
    pos = 0
    try:
        for _ in range(n):
            ln = index[pos]
            name = bytes(index[pos + 1:pos + 1 + ln]).decode()
            pos += 1 + ln
            dt, ndim, axis = struct.unpack_from("<BBb", index, pos)
            pos += 3
            shape = struct.unpack_from("<%dI" % ndim, index, pos)
            pos += 4 * ndim
            ns = struct.unpack_from("<H", index, pos)[0]
            pos += 2
            # one float32 array, not a tuple of boxed floats (per-channel scales are most of the index)
            scales = array.array("f", index[pos:pos + 4 * ns])
            pos += 8 * ns   # zero points follow; weights are symmetric (zero point 0), so they are not kept
            off, nbytes = struct.unpack_from("<II", index, pos)
            pos += 8
            if dt not in _DTYPE_CODES:
                raise ModelBlobError("tensor %s has unknown dtype code %d" % (name, dt))
            out[name] = (_DTYPE_CODES[dt], shape, axis, scales, None, off, nbytes)
    except (IndexError, ValueError, _STRUCT_ERROR):
        raise ModelBlobError("tensor blob index is damaged or truncated")
    return out, data_start


def _count(shape):
    n = 1
    for s in shape:
        n *= s
    return n



def build(m, blob_path, graph_path):
    """Fill ``m`` (an McuModel) with layers and preallocated activations; ModelBlobError on a mismatch."""
    with open(blob_path, "rb") as f:
        index, data_start = read_index(f)
        arenas = _arenas(index)   # before the graph's JSON is parsed, while the heap is least cut up
        with open(graph_path) as g:
            try:
                spec = json.load(g)
            except ValueError:
                raise ModelBlobError("graph %s is not valid JSON" % graph_path)
        if spec.get("format") != GRAPH_FORMAT or spec.get("version") != 1:
            raise ModelBlobError("graph %s is not an edgelearn MCU graph v1" % graph_path)
        m.input_scale, m.input_zp = spec["input"]["q"]
        m.layers = []
        m.input = K.zeros_i8(_count(spec["input"]["shape"]))
        acts = {spec["input"]["name"]: m.input}
        for op in spec["ops"]:
            _add(m, acts, op, (index, f, data_start, arenas))
    m.embedding = m.logits = None
    for o in spec["outputs"]:
        if o["name"] not in acts:
            raise ModelBlobError("graph output %s is produced by no op" % o["name"])
        setattr(m, o["role"], acts[o["name"]])
        setattr(m, o["role"] + "_q", o["q"])
    if m.embedding is None or m.logits is None:
        raise ModelBlobError("graph must name an embedding and a logits output")


def _arenas(index):
    """One array per dtype for every constant tensor in the blob, allocated before anything else.

    A board's heap fragments as code loads; several 5 KB weight arrays then
    find no contiguous block, one arena allocated first does. Layers get
    memoryview slices of it (same indexing, no copies).
    """
    need = {}
    for name in index:
        code, tshape, nbytes = index[name][0], index[name][1], index[name][6]
        if nbytes != _count(tshape) * _ITEM[code]:
            raise ModelBlobError("tensor %s: %d bytes for shape %s" % (name, nbytes, list(tshape)))
        need[code] = need.get(code, 0) + nbytes // _ITEM[code]
    out = {}
    for code in need:
        out[code] = [memoryview(array.array(code, bytes(need[code] * _ITEM[code]))), 0]
    return out


def _tensor(src, name):
    index, f, data_start, arenas = src
    if name not in index:
        raise ModelBlobError("the tensor blob has no tensor %r: it belongs to another model or version" % name)
    code, tshape, axis, scales, zps, off, nbytes = index[name]
    arena = arenas[code]
    n = nbytes // _ITEM[code]
    a = arena[0][arena[1]:arena[1] + n]
    arena[1] += n
    f.seek(data_start + off)
    if f.readinto(a) != nbytes:
        raise ModelBlobError("tensor blob is truncated (tensor %s)" % name)
    return a, tshape, scales


def _add(m, acts, op, src_blob):
    kind = op["op"]
    src = acts.get(op["inputs"][0])
    if src is None:
        raise ModelBlobError("op %s reads %s before it is computed" % (kind, op["inputs"][0]))
    ishape = op["in_shape"]
    ih, iw, ic = ishape[1:4] if len(ishape) == 4 else (1, 1, ishape[-1])
    oshape = op["out_shape"]
    if kind == "RESHAPE":
        if _count(op["in_shape"]) != _count(oshape):
            raise ModelBlobError("reshape changes the element count")
        acts[op["output"]] = src
        return
    out = K.zeros_i8(_count(oshape))
    in_q, out_q = op["in_q"], op["out_q"]
    act = K.act_range(op.get("activation"), out_q[0], out_q[1])
    if kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        w, wshape, wsc = _tensor(src_blob, op["inputs"][1])
        b = _tensor(src_blob, op["inputs"][2])[0] if len(op["inputs"]) > 2 else None
        if op.get("dilation", [1, 1]) != [1, 1]:
            raise ModelBlobError("dilated convolutions have no portable kernel")
        args = (w, b, (ih, iw, ic), tuple(oshape[1:4]), (wshape[1], wshape[2]), tuple(op["stride"]),
                op["padding"], in_q, wsc, out_q, act)
        layer = K.Conv2D(*args) if kind == "CONV_2D" else K.DepthwiseConv2D(*args, op.get("depth_multiplier", 1))
    elif kind == "AVERAGE_POOL_2D":
        layer = K.AvgPool2D((ih, iw, ic), tuple(oshape[1:4]), tuple(op["kernel"]), tuple(op["stride"]),
                            op["padding"], act)
    elif kind == "FULLY_CONNECTED":
        w, wshape, wsc = _tensor(src_blob, op["inputs"][1])
        b = _tensor(src_blob, op["inputs"][2])[0] if len(op["inputs"]) > 2 else None
        layer = K.Dense(w, b, wshape[1], wshape[0], in_q, wsc, out_q, act)
    else:
        raise ModelBlobError("op %s has no portable int8 kernel" % kind,
                             fix="build the MCU variant with host/mcu_model.py")
    m.layers.append((layer, src, out))
    acts[op["output"]] = out
