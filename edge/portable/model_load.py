"""Build an ``edge.portable.model.McuModel`` from ``weights.elb`` + ``graph.json`` (load-time code only).

Kept apart from the model's run-time code: on a board the loader runs once
at boot (and for a new bundle's smoke check) and its bytecode is then freed
(firmware/app.py ``unload``). Formats: docs/partition.md (blob),
docs/firmware.md (graph).

    from edge.portable.model_load import read_index
    with open("weights.elb", "rb") as f:
        index, data_start = read_index(f)      # {name: (dtype, shape, axis, scales, zps, offset, nbytes)}

``read_index`` is the one reader of the blob's layout: the host's ``host.partition.blob.read_blob``
(numpy arrays, for tests and tools) is built on it; the writer is ``host.partition.blob.write_blob``.
"""

import array
import gc
import json
import struct

from edge.portable import kernels as K
from edge.portable.compat import zeros
from edge.portable.model import ModelBlobError

MAGIC = b"ELB1"
BLOB_VERSION = 1
GRAPH_FORMAT = "edgelearn-mcu-graph"
DTYPE_CODES = {0: "b", 1: "i", 2: "h", 3: "B", 4: "f"}  # blob dtype code -> array typecode
_ITEM = {"b": 1, "i": 4, "h": 2, "B": 1, "f": 4}
# MicroPython raises ValueError where CPython raises struct.error, and has no struct.error
_STRUCT_ERROR = getattr(struct, "error", ValueError)


def read_index(f, zero_points=False):
    """The blob's index: {name: (dtype code, shape, axis, scales, zps, offset, nbytes)} and data_start.

    ``zps`` is None unless ``zero_points`` (a board never needs them: weights are symmetric); the
    dtype code is an ``array`` typecode (``DTYPE_CODES``); offsets are from ``data_start``."""
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
            # zero points follow; weights are symmetric (zero point 0), so a board does not keep them
            zps = struct.unpack_from("<%di" % ns, index, pos + 4 * ns) if zero_points else None
            pos += 8 * ns
            off, nbytes = struct.unpack_from("<II", index, pos)
            pos += 8
            if dt not in DTYPE_CODES:
                raise ModelBlobError("tensor %s has unknown dtype code %d" % (name, dt))
            out[name] = (DTYPE_CODES[dt], shape, axis, scales, zps, off, nbytes)
    except (IndexError, ValueError, _STRUCT_ERROR):
        raise ModelBlobError("tensor blob index is damaged or truncated")
    return out, data_start


def _count(shape):
    n = 1
    for s in shape:
        n *= s
    return n



def build(m, blob_path, graph_path):
    """Fill ``m`` (an McuModel) with layers and preallocated activations; ModelBlobError on a mismatch.

    Ordered for a small heap: the weight arenas first (sized by a scan of
    the blob's index that keeps only totals; the largest blocks, allocated
    while the heap is in one piece), then pass 1 parses the index and the
    graph (transient: ~20 KB of small objects on a 64-bit port) into a short
    plan, and after a collection pass 2 allocates the activations and the
    layers and reads each tensor straight into its arena slice. Building
    layers while the JSON is alive scatters them through the space it held.
    """
    with open(blob_path, "rb") as f:
        arenas = _arenas(_arena_sizes(f))   # the largest blocks, before anything transient
        f.seek(0)
        steps, slots, data_start, in_q, outputs = _plan(f, graph_path)
        gc.collect()
        m.input_scale, m.input_zp = in_q
        bufs = [K.zeros_i8(n) for n in slots]
        m.input = bufs[0]
        m.layers = []
        for make, src, out, wref, bref, rest in steps:
            w = _read_tensor(f, data_start, arenas, wref)
            b = _read_tensor(f, data_start, arenas, bref)
            m.layers.append((make(w, b, rest), bufs[src], bufs[out]))
    m.embedding = m.logits = None
    for role, slot, q in outputs:
        setattr(m, role, bufs[slot])
        setattr(m, role + "_q", q)
    if m.embedding is None or m.logits is None:
        raise ModelBlobError("graph must name an embedding and a logits output")


def _plan(f, graph_path):
    """Pass 1: ([(make, src slot, out slot, weight ref, bias ref, args)], [slot sizes], data_start, in_q, outputs)."""
    index, data_start = read_index(f)
    with open(graph_path) as g:
        try:
            spec = json.load(g)
        except ValueError:
            raise ModelBlobError("graph %s is not valid JSON" % graph_path)
    if spec.get("format") != GRAPH_FORMAT or spec.get("version") != 1:
        raise ModelBlobError("graph %s is not an edgelearn MCU graph v1" % graph_path)
    slots = [_count(spec["input"]["shape"])]
    acts = {spec["input"]["name"]: 0}
    steps = []
    for op in spec["ops"]:
        _add(steps, slots, acts, op, index)
    outputs = []
    for o in spec["outputs"]:
        if o["name"] not in acts:
            raise ModelBlobError("graph output %s is produced by no op" % o["name"])
        outputs.append((o["role"], acts[o["name"]], tuple(o["q"])))
    return steps, slots, data_start, tuple(spec["input"]["q"]), outputs


def _arena_sizes(f):
    """{dtype code: element count} over the blob's tensors, read entry by entry (nothing kept but totals)."""
    head = f.read(12)
    if len(head) < 12 or head[:4] != MAGIC:
        raise ModelBlobError("not an edgelearn tensor blob (magic %r)" % (bytes(head[:4]),))
    n = struct.unpack_from("<H", head, 6)[0]
    need = {}
    try:
        for _ in range(n):
            ln = f.read(1)[0]
            f.seek(ln, 1)
            dt, ndim, _axis = struct.unpack("<BBb", f.read(3))
            shape = struct.unpack("<%dI" % ndim, f.read(4 * ndim))
            ns = struct.unpack("<H", f.read(2))[0]
            f.seek(8 * ns, 1)
            nbytes = struct.unpack("<II", f.read(8))[1]
            code = DTYPE_CODES.get(dt)
            if code is None:
                raise ModelBlobError("a tensor has unknown dtype code %d" % dt)
            if nbytes != _count(shape) * _ITEM[code]:
                raise ModelBlobError("a tensor has %d bytes for shape %s" % (nbytes, list(shape)))
            need[code] = need.get(code, 0) + nbytes // _ITEM[code]
    except (IndexError, ValueError, _STRUCT_ERROR):
        raise ModelBlobError("tensor blob index is damaged or truncated")
    return need


def _arenas(need):
    """One array per dtype for every constant tensor in the blob, allocated before anything else.

    A board's heap fragments as code loads; several 5 KB weight arrays then
    find no contiguous block, one arena allocated first does. Layers get
    memoryview slices of it (same indexing, no copies).
    """
    gc.collect()
    out = {}
    for code in sorted(need, key=lambda c: -need[c] * _ITEM[c]):   # the largest block first
        out[code] = [memoryview(zeros(code, need[code], fill=False)), 0]  # read whole from the blob
    return out


def _tensor(index, name):
    """(dtype code, offset, nbytes) of a blob tensor, its shape and its scales; read in pass 2."""
    if name not in index:
        raise ModelBlobError("the tensor blob has no tensor %r: it belongs to another model or version" % name)
    code, tshape, axis, scales, zps, off, nbytes = index[name]
    return (code, off, nbytes), tshape, scales


def _read_tensor(f, data_start, arenas, ref):
    if ref is None:
        return None
    code, off, nbytes = ref
    arena = arenas[code]
    n = nbytes // _ITEM[code]
    a = arena[0][arena[1]:arena[1] + n]
    arena[1] += n
    f.seek(data_start + off)
    if f.readinto(a) != nbytes:
        raise ModelBlobError("tensor blob is truncated")
    return a


def _conv(w, b, rest):
    return K.Conv2D(w, b, *rest)


def _dwconv(w, b, rest):
    return K.DepthwiseConv2D(w, b, *rest)


def _pool(w, b, rest):
    return K.AvgPool2D(*rest)


def _dense(w, b, rest):
    return K.Dense(w, b, *rest)


def _add(steps, slots, acts, op, index):
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
    in_q, out_q = op["in_q"], op["out_q"]
    act = K.act_range(op.get("activation"), out_q[0], out_q[1])
    wref = bref = None
    if kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        wref, wshape, wsc = _tensor(index, op["inputs"][1])
        bref = _tensor(index, op["inputs"][2])[0] if len(op["inputs"]) > 2 else None
        if op.get("dilation", [1, 1]) != [1, 1]:
            raise ModelBlobError("dilated convolutions have no portable kernel")
        rest = ((ih, iw, ic), tuple(oshape[1:4]), (wshape[1], wshape[2]), tuple(op["stride"]),
                op["padding"], in_q, wsc, out_q, act)
        if kind == "CONV_2D":
            make = _conv
        else:
            make = _dwconv
            rest += (op.get("depth_multiplier", 1),)
    elif kind == "AVERAGE_POOL_2D":
        make = _pool
        rest = ((ih, iw, ic), tuple(oshape[1:4]), tuple(op["kernel"]), tuple(op["stride"]), op["padding"], act)
    elif kind == "FULLY_CONNECTED":
        wref, wshape, wsc = _tensor(index, op["inputs"][1])
        bref = _tensor(index, op["inputs"][2])[0] if len(op["inputs"]) > 2 else None
        make = _dense
        rest = (wshape[1], wshape[0], in_q, wsc, out_q, act)
    else:
        raise ModelBlobError("op %s has no portable int8 kernel" % kind,
                             fix="build the MCU variant with host/mcu_model.py")
    acts[op["output"]] = len(slots)
    steps.append((make, src, len(slots), wref, bref, rest))
    slots.append(_count(oshape))
