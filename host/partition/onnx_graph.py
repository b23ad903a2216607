"""Read an ``.onnx`` model (float, or int8 QDQ from ONNX Runtime's quantize_static)
into the partitioner's ``Graph``.

QuantizeLinear / DequantizeLinear pairs are how QDQ spells "this tensor is int8";
they are folded away: a layer is every other node, a weight is an int8 initializer
behind a DequantizeLinear, and an activation that passes through QuantizeLinear is
the int8 tensor it becomes. Shapes come from ONNX shape inference (an unknown batch
dimension counts as 1). Operator names are mapped to TFLite's so placement and
the planner treat both formats alike.

    >>> g = load_graph("encoder_int8.onnx")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from host.partition.graph import Graph, Layer, ModelError, Tensor, annotate

_OPS = {"MatMul": "FULLY_CONNECTED", "Gemm": "FULLY_CONNECTED", "GlobalAveragePool": "MEAN",
        "ReduceMean": "MEAN", "Softmax": "SOFTMAX", "Relu": "RELU", "Add": "ADD", "Mul": "MUL",
        "Sub": "SUB", "Reshape": "RESHAPE", "Squeeze": "SQUEEZE", "Unsqueeze": "EXPAND_DIMS",
        "Flatten": "RESHAPE", "Transpose": "TRANSPOSE", "Concat": "CONCATENATION", "Pad": "PAD",
        "AveragePool": "AVERAGE_POOL_2D", "MaxPool": "MAX_POOL_2D", "Sigmoid": "LOGISTIC",
        "Tanh": "TANH", "Clip": "RELU6", "Identity": "RESHAPE"}
_ELEM = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
         11: "float64"}


def read_onnx(path: Path) -> Graph:
    import onnx
    from onnx import numpy_helper, shape_inference

    try:
        model = onnx.load(str(path))
        model = shape_inference.infer_shapes(model)
    except Exception as e:  # onnx raises DecodeError/ValidationError/... for a damaged file
        raise ModelError(f"{path} is not a readable ONNX model ({type(e).__name__}: {e})",
                         fix="re-export it with tf2onnx; the file may be truncated") from None
    gr = model.graph
    inits = {i.name: i for i in gr.initializer}
    infos = {v.name: v for v in list(gr.value_info) + list(gr.input) + list(gr.output)}
    producer = {o: n for n in gr.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in gr.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    tensors: list[Tensor] = []
    index: dict[str, int] = {}

    def tensor(name: str, const_bytes: np.ndarray | None = None, scales=(), zps=(), axis=0) -> int:
        if name in index:
            return index[name]
        if const_bytes is not None:
            t = Tensor(len(tensors), name, tuple(const_bytes.shape), str(const_bytes.dtype), True,
                       tuple(scales), tuple(zps), axis, const_bytes)
        else:
            info = infos.get(name)
            shape, dtype = (), "float32"
            if info is not None and info.type.HasField("tensor_type"):
                tt = info.type.tensor_type
                dtype = _ELEM.get(tt.elem_type, "float32")
                shape = tuple(d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim)
            t = Tensor(len(tensors), name, shape, dtype, False)
        tensors.append(t)
        index[name] = t.index
        return t.index

    def source(name: str) -> int:
        """The int8 tensor (or initializer) behind a DequantizeLinear output, else the name itself."""
        p = producer.get(name)
        if p is not None and p.op_type == "DequantizeLinear":
            src = p.input[0]
            if src in inits:
                data = numpy_helper.to_array(inits[src])
                scale = numpy_helper.to_array(inits[p.input[1]]).ravel() if p.input[1] in inits else ()
                zp = numpy_helper.to_array(inits[p.input[2]]).ravel() if len(p.input) > 2 and p.input[2] in inits else ()
                axis = next((a.i for a in p.attribute if a.name == "axis"), 1)
                return tensor(src, data, [float(s) for s in scale], [int(z) for z in zp], axis)
            return tensor(src)
        if name in inits:
            return tensor(name, numpy_helper.to_array(inits[name]))
        return tensor(name)

    def sink(name: str) -> int:
        """The int8 tensor a node's output becomes through QuantizeLinear, if it does."""
        qs = [c for c in consumers.get(name, []) if c.op_type == "QuantizeLinear"]
        if len(qs) == len(consumers.get(name, [])) and len(qs) == 1:
            q = qs[0]
            i = tensor(q.output[0])
            if len(q.input) > 2 and q.input[2] in inits and q.input[1] in inits:
                tensors[i].scales = tuple(float(x) for x in numpy_helper.to_array(inits[q.input[1]]).ravel())
                tensors[i].zero_points = tuple(int(x) for x in numpy_helper.to_array(inits[q.input[2]]).ravel())
            return i
        return tensor(name)

    for name in [i.name for i in gr.input if i.name not in inits]:
        tensor(name)
    layers = []
    for n in gr.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        op = _OPS.get(n.op_type)
        if n.op_type == "Conv":
            w = inits.get(producer[n.input[1]].input[0]) if n.input[1] in producer else inits.get(n.input[1])
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            op = "DEPTHWISE_CONV_2D" if group > 1 and w is not None and w.dims[1] == 1 else "CONV_2D"
        if op is None:
            op = f"ONNX:{n.op_type}"
        ins = [source(i) if i else -1 for i in n.input]
        outs = [sink(o) for o in n.output]
        layer = Layer(len(layers), op, n.name or n.output[0], ins, outs, params=_attrs(n, op, tensors, ins))
        # quantize_static folds a ReLU into the output's int8 range: zero point -128 means min 0.
        if op in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED") and outs and \
                tensors[outs[0]].zero_points == (-128,):
            layer.params["activation"] = "RELU"
        layers.append(layer)
    g = Graph(path, "onnx", tensors, layers, [index[i.name] for i in gr.input if i.name not in inits],
              [index.get(_final(o.name, producer), tensor(o.name)) for o in gr.output])
    for layer in g.layers:
        annotate(g, layer)
    return g


def _final(name: str, producer) -> str:
    """A graph output produced by DequantizeLinear is really its int8 input."""
    p = producer.get(name)
    return p.input[0] if p is not None and p.op_type == "DequantizeLinear" else name


def _attrs(n, op: str, tensors, ins) -> dict:
    a = {x.name: (list(x.ints) if x.ints else x.i) for x in n.attribute}
    p = {}
    if op in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        w = tensors[ins[1]]
        p["kernel"] = tuple(w.shape[2:4])
        p["stride"] = tuple(a.get("strides", [1, 1]))
        p["dilation"] = tuple(a.get("dilations", [1, 1]))
        p["padding"] = "VALID" if not any(a.get("pads", [0])) and a.get("auto_pad", 0) in (0, b"VALID") else "SAME"
    if op in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        p["kernel"] = tuple(a.get("kernel_shape", [1, 1]))
        p["stride"] = tuple(a.get("strides", [1, 1]))
    return p
