"""Cut an ONNX model in two at a layer boundary: the device half and the cloud half
(the serving shim runs the latter on the activation the device uploads).

    >>> device, cloud = export_split(Path("enc_int8.onnx"), cut=6, out_dir=Path("out"))

For QDQ models the cut tensor is the int8 output of a QuantizeLinear, so the
device uploads int8 bytes and the cloud half starts with the matching
DequantizeLinear: the two halves compute exactly what the whole model does.
"""

from __future__ import annotations

from pathlib import Path

from host.partition.graph import Graph, ModelError, load_graph


def boundary(g: Graph, cut: int) -> list[str]:
    produced = {t for l in g.layers[:cut] for t in l.outputs} | set(g.inputs)
    needed = {t for l in g.layers[cut:] for t in l.inputs if t >= 0}
    return [g.tensors[t].name for t in sorted(produced & needed) if not g.tensors[t].is_const]


def export_split(model: Path, cut: int, out_dir: Path) -> tuple[Path, Path]:
    import onnx
    from onnx.utils import extract_model

    g = load_graph(model)
    if g.format != "onnx":
        raise ModelError(f"{model.name} is {g.format}; the cloud half is exported from the ONNX model",
                         fix="pass the .onnx file of the same model (edgelearn quantize writes both)")
    if not 0 < cut < len(g.layers):
        raise ModelError(f"cut {cut} is not inside the model (it has {len(g.layers)} layers)",
                         fix=f"choose a cut between 1 and {len(g.layers) - 1}")
    cut_names = boundary(g, cut)
    m = onnx.load(str(model))
    outputs = [o.name for o in m.graph.output]
    early = {g.tensors[t].name for l in g.layers[:cut] for t in l.outputs}
    producer_of_output = {}
    prod = {o: n for n in m.graph.node for o in n.output}
    for name in outputs:
        p = prod.get(name)
        producer_of_output[name] = p.input[0] if p is not None and p.op_type == "DequantizeLinear" else name
    device_out = cut_names + [o for o in outputs if producer_of_output[o] in early]
    cloud_out = [o for o in outputs if producer_of_output[o] not in early]
    out_dir.mkdir(parents=True, exist_ok=True)
    device, cloud = out_dir / f"{model.stem}.device.onnx", out_dir / f"{model.stem}.cloud.onnx"
    inputs = [i.name for i in m.graph.input if i.name not in {x.name for x in m.graph.initializer}]
    extract_model(str(model), str(device), inputs, device_out, check_model=True)
    extract_model(str(model), str(cloud), cut_names, cloud_out, check_model=True)
    return device, cloud
