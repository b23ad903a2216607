"""A model as a list of layers with MACs, weight bytes and activation bytes.

``load_graph`` reads an int8 ``.tflite`` (flatbuffer) or an ``.onnx`` file into the
same ``Graph`` so the memory planner, the placement and the report never care which.

    >>> g = load_graph("models/kws-dscnn-s/encoder_int8.tflite")
    >>> g.total_macs, g.weight_bytes, [l.op for l in g.layers][:2]
    (2664792, 24328, ['CONV_2D', 'DEPTHWISE_CONV_2D'])

MACs follow Arm Vela's convention (npu_performance.measure_cycle_cost) so the two
can be compared number for number: convolutions and fully-connected layers count
kernel_h * kernel_w * input_depth per output element, depthwise convolutions and
pooling count kernel_h * kernel_w per output element, a spatial MEAN counts its input elements and
SOFTMAX twice its elements (Vela lowers them to a depthwise conv and to a
max-pool + reduce-sum), everything else counts 0.

The TFLite schema comes from ``tflite_micro`` (its bundled ``schema_py_generated``):
the host extra installs it anyway for the arena check, it imports in ~0.1 s with
only ``flatbuffers`` (TensorFlow's copy drags in TensorFlow, ~3 s, which would blow
the report's 2 s budget), and it is the schema TFLite Micro itself was built from.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError

DTYPE_BYTES = {"float32": 4, "float16": 2, "int32": 4, "uint8": 1, "int64": 8, "bool": 1,
               "int16": 2, "int8": 1, "float64": 8, "uint32": 4, "uint16": 2, "int4": 1}
# flatbuffer TensorType enum -> numpy dtype name (schema.fbs order)
_TFLITE_TYPES = ["float32", "float16", "int32", "uint8", "int64", "string", "bool", "int16",
                 "complex64", "int8", "float64", "complex128", "uint64", "resource", "variant",
                 "uint32", "uint16", "int4", "bfloat16"]
CONV_OPS = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV"}
POOL_OPS = {"AVERAGE_POOL_2D", "MAX_POOL_2D"}
# Ops that only move or relabel bytes; a device can always run them on the CPU.
MEMORY_OPS = {"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "SHAPE", "STRIDED_SLICE", "PACK", "QUANTIZE",
              "DEQUANTIZE", "CONCATENATION", "SLICE", "TRANSPOSE", "PAD", "SPLIT", "SPLIT_V"}


class ModelError(EdgelearnError):
    """A model file is missing, unreadable or uses something the partitioner cannot plan."""


@dataclass
class Tensor:
    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    is_const: bool
    scales: tuple[float, ...] = ()
    zero_points: tuple[int, ...] = ()
    axis: int = 0
    data: np.ndarray | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        n = int(np.prod(self.shape)) if self.shape else 1
        return n * DTYPE_BYTES.get(self.dtype, 4)


@dataclass
class Layer:
    index: int
    op: str
    name: str
    inputs: list[int]
    outputs: list[int]
    macs: int = 0
    weight_bytes: int = 0
    activation_bytes: int = 0   # bytes of this layer's outputs
    params: dict = field(default_factory=dict)


@dataclass
class Graph:
    path: Path
    format: str              # "tflite" or "onnx"
    tensors: list[Tensor]
    layers: list[Layer]
    inputs: list[int]
    outputs: list[int]

    @property
    def total_macs(self) -> int:
        return sum(l.macs for l in self.layers)

    @property
    def weight_bytes(self) -> int:
        return sum(l.weight_bytes for l in self.layers)

    @property
    def is_int8(self) -> bool:
        """True when every layer computes in int8 (float I/O around QUANTIZE is allowed)."""
        for l in self.layers:
            if l.op in MEMORY_OPS:
                continue  # moving float bytes around the int8 body (e.g. ONNX's input reshape) is not compute
            for t in l.inputs + l.outputs:
                if t >= 0 and self.tensors[t].dtype in ("float32", "float16", "float64") \
                        and not self.tensors[t].is_const:
                    return False
        return True

    def first_float_layer(self) -> Layer | None:
        for l in self.layers:
            if l.op in MEMORY_OPS:
                continue
            if any(t >= 0 and self.tensors[t].dtype.startswith("float") for t in l.inputs + l.outputs):
                return l
        return None


def load_graph(path: str | Path) -> Graph:
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist", fix="pass a .tflite or .onnx file or a bundle directory")
    suffix = path.suffix.lower()
    if suffix == ".tflite":
        return read_tflite(path)
    if suffix == ".onnx":
        from host.partition.onnx_graph import read_onnx
        return read_onnx(path)
    raise ModelError(f"{path} is a {suffix or 'extension-less'} file, not a model the partitioner reads",
                     fix="pass an int8 .tflite (TFLite converter) or an .onnx (tf2onnx) model")


def _schema():
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as s
    return s


_OP_NAMES: dict[int, str] | None = None


def _op_name(code: int) -> str:
    global _OP_NAMES
    if _OP_NAMES is None:
        s = _schema()
        _OP_NAMES = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
    return _OP_NAMES.get(code, f"BUILTIN_{code}")


def read_tflite(path: Path) -> Graph:
    s = _schema()
    buf = path.read_bytes()
    # A flatbuffer's file identifier sits at bytes 4..8; "TFL3" for every TFLite model.
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise ModelError(f"{path} is not a TFLite flatbuffer (no TFL3 identifier)",
                         fix="export it with tf.lite.TFLiteConverter, or pass the .onnx file instead")
    try:
        model = s.Model.GetRootAs(buf, 0)
        sub = model.Subgraphs(0)
        if sub is None:
            raise ValueError("no subgraph")
        tensors = [_read_tensor(model, sub.Tensors(i), i) for i in range(sub.TensorsLength())]
        layers = []
        for i in range(sub.OperatorsLength()):
            op = sub.Operators(i)
            opc = model.OperatorCodes(op.OpcodeIndex())
            code = max(opc.BuiltinCode(), opc.DeprecatedBuiltinCode())
            name = _op_name(code)
            if name == "CUSTOM":
                name = "CUSTOM:" + (opc.CustomCode() or b"?").decode(errors="replace")
            ins = [int(x) for x in op.InputsAsNumpy()] if op.InputsLength() else []
            outs = [int(x) for x in op.OutputsAsNumpy()] if op.OutputsLength() else []
            layer = Layer(i, name, tensors[outs[0]].name if outs else name, ins, outs,
                          params=_read_options(s, op, name))
            layers.append(layer)
        g = Graph(path, "tflite", tensors, layers,
                  [int(x) for x in sub.InputsAsNumpy()], [int(x) for x in sub.OutputsAsNumpy()])
    except (IndexError, ValueError, AttributeError, TypeError, struct.error) as e:
        raise ModelError(f"{path} is a damaged TFLite flatbuffer ({type(e).__name__}: {e})",
                         fix="re-export the model; the file may be truncated") from None
    if model.SubgraphsLength() > 1:
        raise ModelError(f"{path} has {model.SubgraphsLength()} subgraphs (control flow)",
                         fix="export a single-subgraph model (no tf.cond / tf.while_loop)")
    for layer in g.layers:
        annotate(g, layer)
    return g


def _read_tensor(model, t, index: int) -> Tensor:
    shape = tuple(int(x) for x in t.ShapeAsNumpy()) if t.ShapeLength() else ()
    dtype = _TFLITE_TYPES[t.Type()] if t.Type() < len(_TFLITE_TYPES) else f"type{t.Type()}"
    b = model.Buffers(t.Buffer())
    data = None
    if b is not None and b.DataLength() > 0:
        raw = b.DataAsNumpy()
        np_dtype = {"int4": "int8"}.get(dtype, dtype)
        try:
            data = raw.view(np.dtype(np_dtype)).reshape(shape) if np_dtype in DTYPE_BYTES else raw
        except ValueError:
            data = raw
    q = t.Quantization()
    scales, zps, axis = (), (), 0
    if q is not None and q.ScaleLength():
        scales = tuple(float(x) for x in q.ScaleAsNumpy())
        zps = tuple(int(x) for x in q.ZeroPointAsNumpy()) if q.ZeroPointLength() else (0,) * len(scales)
        axis = int(q.QuantizedDimension())
    name = (t.Name() or b"").decode(errors="replace")
    return Tensor(index, name, shape, dtype, data is not None, scales, zps, axis, data)


def _read_options(s, op, name: str) -> dict:
    opts = op.BuiltinOptions()
    if opts is None:
        return {}
    table = {"CONV_2D": s.Conv2DOptions, "DEPTHWISE_CONV_2D": s.DepthwiseConv2DOptions,
             "AVERAGE_POOL_2D": s.Pool2DOptions, "MAX_POOL_2D": s.Pool2DOptions,
             "FULLY_CONNECTED": s.FullyConnectedOptions}
    cls = table.get(name)
    if cls is None:
        return {}
    o = cls()
    o.Init(opts.Bytes, opts.Pos)
    act = {0: None, 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH"}.get(o.FusedActivationFunction(), "OTHER")
    if name == "FULLY_CONNECTED":
        return {"activation": act}
    p = {"stride": (o.StrideH(), o.StrideW()), "padding": "SAME" if o.Padding() == 0 else "VALID",
         "activation": act}
    if name in POOL_OPS:
        p["kernel"] = (o.FilterHeight(), o.FilterWidth())
    if name == "DEPTHWISE_CONV_2D":
        p["depth_multiplier"] = o.DepthMultiplier()
    if name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        p["dilation"] = (o.DilationHFactor(), o.DilationWFactor())
    return p


def annotate(g: Graph, layer: Layer) -> None:
    """Fill MACs (Vela's convention), weight bytes and activation bytes of one layer."""
    t = g.tensors
    outs = [t[i] for i in layer.outputs if i >= 0]
    ins = [t[i] for i in layer.inputs if i >= 0]
    layer.activation_bytes = sum(o.nbytes for o in outs if not o.is_const)
    layer.weight_bytes = sum(x.nbytes for x in ins if x.is_const and layer.op not in MEMORY_OPS)
    if not outs:
        return
    ofm = int(np.prod(outs[0].shape)) if outs[0].shape else 1
    op = layer.op
    w = t[layer.inputs[1]].shape if len(layer.inputs) > 1 and layer.inputs[1] >= 0 else ()
    nchw = g.format == "onnx"  # ONNX weights: conv (Cout, Cin/g, kh, kw), MatMul (K, N)
    if op in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        kh, kw, cin = (w[2], w[3], w[1]) if nchw else (w[1], w[2], w[3])
        layer.macs = ofm * kh * kw * (cin if op == "CONV_2D" else 1)
        layer.params["kernel"] = (kh, kw)
    elif op == "TRANSPOSE_CONV":
        _, kh, kw, cin = w
        layer.macs = int(np.prod(t[layer.inputs[2]].shape)) * kh * kw * cin
    elif op == "FULLY_CONNECTED":
        k = (w[0] if t[layer.inputs[1]].is_const else ins[0].shape[-1]) if nchw else w[-1]
        layer.macs = ofm * k
    elif op in POOL_OPS:
        kh, kw = layer.params.get("kernel", (1, 1))
        layer.macs = ofm * kh * kw
    elif op == "MEAN":
        # Vela lowers a spatial MEAN to a depthwise conv whose kernel is the reduced area.
        layer.macs = int(np.prod(ins[0].shape)) if ins else 0
    elif op == "SOFTMAX":
        # Vela's int8 softmax runs a max-pool and a reduce-sum over the logits (1 MAC each).
        layer.macs = 2 * ofm
    # Element-wise ops and memory ops count 0 MACs, as in Vela.
