"""Run the MCU model variant from its int8 tensor blob: the board's inference engine.

The model is data (as emlearn does it): ``weights.elb`` (the partitioner's
flat tensor blob, docs/partition.md) holds the int8 weights and int32 biases,
``graph.json`` (written by ``host/mcu_model.py``, docs/firmware.md) the op
list with shapes, options and activation quantisation. ``McuModel`` builds one
``edge.portable.kernels`` layer per op and one preallocated ``array('b')``
per activation at load time; ``invoke()`` then allocates nothing that lasts.
A blob that does not carry what the graph needs (another model, another
version, a truncated file) is a ``ModelBlobError`` before anything runs.

    from edge.portable.model import McuModel
    m = McuModel("weights.elb", "graph.json")
    m.set_input(normalised_features)     # 490 floats, (49, 10) row-major
    m.invoke()
    m.embedding, m.logits                # array('b'); m.embedding_f(out) dequantises
"""

import array
import json
import struct

from edge.portable import kernels as K

MAGIC = b"ELB1"
BLOB_VERSION = 1
GRAPH_FORMAT = "edgelearn-mcu-graph"
_DTYPE_CODES = {0: "b", 1: "i", 2: "h", 3: "B", 4: "f"}
_ITEM = {"b": 1, "i": 4, "h": 2, "B": 1, "f": 4}


class ModelBlobError(ValueError):
    """The blob or graph is unreadable or does not belong together; ``fix`` says what to do."""

    def __init__(self, problem, fix="deploy the weights.elb and graph.json of one bundle (edgelearn flash --bundle ...)"):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def read_index(f):
    """The blob's index: {name: (dtype code, shape, axis, scales, zero points, offset, nbytes)} and data_start."""
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
            scales = struct.unpack_from("<%df" % ns, index, pos)
            zps = struct.unpack_from("<%di" % ns, index, pos + 4 * ns)
            pos += 8 * ns
            off, nbytes = struct.unpack_from("<II", index, pos)
            pos += 8
            if dt not in _DTYPE_CODES:
                raise ModelBlobError("tensor %s has unknown dtype code %d" % (name, dt))
            out[name] = (_DTYPE_CODES[dt], shape, axis, scales, zps, off, nbytes)
    except (IndexError, struct.error):
        raise ModelBlobError("tensor blob index is damaged or truncated")
    return out, data_start


def _count(shape):
    n = 1
    for s in shape:
        n *= s
    return n


class McuModel:
    """The int8 graph of ``graph.json`` with weights from ``weights.elb``."""

    def __init__(self, blob_path, graph_path):
        with open(graph_path) as f:
            try:
                spec = json.load(f)
            except ValueError:
                raise ModelBlobError("graph %s is not valid JSON" % graph_path)
        if spec.get("format") != GRAPH_FORMAT or spec.get("version") != 1:
            raise ModelBlobError("graph %s is not an edgelearn MCU graph v1" % graph_path)
        self.spec_input = spec["input"]
        self.input_scale, self.input_zp = spec["input"]["q"]
        self.layers = []
        self.acts = {}
        n_in = _count(spec["input"]["shape"])
        self.input = K.zeros_i8(n_in)
        self.acts[spec["input"]["name"]] = self.input
        with open(blob_path, "rb") as f:
            index, data_start = read_index(f)
            for op in spec["ops"]:
                self._add(op, index, f, data_start)
        self.embedding = self.logits = None
        for o in spec["outputs"]:
            if o["name"] not in self.acts:
                raise ModelBlobError("graph output %s is produced by no op" % o["name"])
            setattr(self, o["role"], self.acts[o["name"]])
            setattr(self, o["role"] + "_q", o["q"])
        if self.embedding is None or self.logits is None:
            raise ModelBlobError("graph must name an embedding and a logits output")

    def _tensor(self, index, f, data_start, name, shape=None):
        if name not in index:
            raise ModelBlobError("the tensor blob has no tensor %r: it belongs to another model or version" % name)
        code, tshape, axis, scales, zps, off, nbytes = index[name]
        if shape is not None and list(tshape) != list(shape):
            raise ModelBlobError("tensor %s has shape %s in the blob, the graph expects %s: another model version"
                                 % (name, list(tshape), list(shape)))
        if nbytes != _count(tshape) * _ITEM[code]:
            raise ModelBlobError("tensor %s: %d bytes for shape %s" % (name, nbytes, list(tshape)))
        f.seek(data_start + off)
        a = array.array(code, bytes(nbytes))   # the zero bytes are garbage at once; then read in place
        if f.readinto(a) != nbytes:
            raise ModelBlobError("tensor blob is truncated (tensor %s)" % name)
        return a, tshape, scales

    def _add(self, op, index, f, data_start):
        kind = op["op"]
        src = self.acts.get(op["inputs"][0])
        if src is None:
            raise ModelBlobError("op %s reads %s before it is computed" % (kind, op["inputs"][0]))
        ishape = op["in_shape"]
        ih, iw, ic = ishape[1:4] if len(ishape) == 4 else (1, 1, ishape[-1])
        oshape = op["out_shape"]
        if kind == "RESHAPE":
            if _count(op["in_shape"]) != _count(oshape):
                raise ModelBlobError("reshape changes the element count")
            self.acts[op["output"]] = src
            return
        out = K.zeros_i8(_count(oshape))
        in_q, out_q = op["in_q"], op["out_q"]
        act = K.act_range(op.get("activation"), out_q[0], out_q[1])
        if kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            w, wshape, wsc = self._tensor(index, f, data_start, op["inputs"][1])
            b = self._tensor(index, f, data_start, op["inputs"][2])[0] if len(op["inputs"]) > 2 else None
            if op.get("dilation", [1, 1]) != [1, 1]:
                raise ModelBlobError("dilated convolutions have no portable kernel")
            args = (w, b, (ih, iw, ic), tuple(oshape[1:4]), (wshape[1], wshape[2]), tuple(op["stride"]),
                    op["padding"], in_q, wsc, out_q, act)
            layer = K.Conv2D(*args) if kind == "CONV_2D" else K.DepthwiseConv2D(*args, op.get("depth_multiplier", 1))
        elif kind == "AVERAGE_POOL_2D":
            layer = K.AvgPool2D((ih, iw, ic), tuple(oshape[1:4]), tuple(op["kernel"]), tuple(op["stride"]),
                                op["padding"], act)
        elif kind == "FULLY_CONNECTED":
            w, wshape, wsc = self._tensor(index, f, data_start, op["inputs"][1])
            b = self._tensor(index, f, data_start, op["inputs"][2])[0] if len(op["inputs"]) > 2 else None
            layer = K.Dense(w, b, wshape[1], wshape[0], in_q, wsc, out_q, act)
        else:
            raise ModelBlobError("op %s has no portable int8 kernel" % kind,
                                 fix="build the MCU variant with host/mcu_model.py")
        self.layers.append((layer, src, out))
        self.acts[op["output"]] = out

    def set_input(self, feats):
        """Quantise ``len(input)`` normalised float features into the input tensor."""
        K.quantize_input(feats, self.input_scale, self.input_zp, self.input)

    def invoke(self):
        for layer, src, out in self.layers:
            layer.run(src, out)

    def embedding_f(self, out):
        """The embedding dequantised into ``out`` (array('f'))."""
        s, z = self.embedding_q
        e = self.embedding
        for i in range(len(e)):
            out[i] = (e[i] - z) * s
        return out

    def probs(self, out):
        """Softmax of the logits into ``out`` (array('f'))."""
        s, z = self.logits_q
        return K.softmax(self.logits, s, z, out)
