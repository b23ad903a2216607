"""``edgelearn partition MODEL --target NAME --out BUNDLE --key KEY``: a signed,
target-specific bundle (model partitions with placement, trainable subset, plan,
and for MicroPython targets the flat int8 tensor blob of docs/partition.md).

    $ edgelearn partition build/kws/encoder_int8.tflite --target esp32 --out out/kws-esp32 \\
          --key keys/edgelearn.key --labels yes,no,up,down
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from edge.errors import EdgelearnError


def add_arguments(p) -> None:
    p.add_argument("model", type=Path, help="int8 .tflite (or .onnx) model, or a bundle")
    p.add_argument("--target", required=True, help="profile name or path to your own profile .toml")
    p.add_argument("--out", required=True, type=Path, help="bundle directory to write")
    p.add_argument("--key", required=True, type=Path, help="Ed25519 private key (edgelearn bundle keygen)")
    p.add_argument("--model-id", default="kws-dscnn-s")
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--labels", default="", help="comma-separated labels (default: from the input bundle)")
    p.add_argument("--objective", choices=("latency", "energy"), default="latency")
    p.add_argument("--cut", type=int, help="force a device/cloud cut before this layer (ONNX models)")
    p.add_argument("--force", action="store_true", help="write the bundle even if the plan does not fit")


def run(args) -> int:
    from host.bundle import build_bundle
    from host.partition.blob import write_blob
    from host.partition.graph import load_graph
    from host.partition.plan import plan_partition
    from host.partition.profiles import load_profile
    from host.partition.report import resolve_model

    profile = load_profile(args.target)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = resolve_model(args.model, tmp / "in")
        labels = [x for x in args.labels.split(",") if x] or _labels_from_bundle(args.model)
        g = load_graph(model)
        plan = plan_partition(g, profile, objective=args.objective)
        if not plan.fits and not args.force:
            raise EdgelearnError(plan.verdict, fix="follow that advice, or pass --force to write it anyway")
        npu = plan.totals["npu_ops"] and profile.npu is not None
        placement = "mcu" if profile.kind == "mcu" and not npu else ("npu" if npu else "cpu")
        files = {model.name: model}
        parts = [{"name": "encoder", "file": model.name, "format": g.format, "placement": placement,
                  "precision": "int8" if g.is_int8 else "float32", "layers": [0, len(g.layers)]}]
        cut = args.cut if args.cut is not None else (plan.split.cut if plan.split is not None else len(g.layers))
        if 0 < cut < len(g.layers):
            files, parts = _cloud_split(model, g, cut, tmp, placement)
        elif args.cut is not None:
            raise EdgelearnError(f"--cut {args.cut} is not inside the model ({len(g.layers)} layers)",
                                 fix=f"choose a cut between 1 and {len(g.layers) - 1}")
        if profile.name.startswith("ethos-u") and g.format == "tflite":
            from host.partition.placement import vela_available, vela_report
            if not vela_available():
                raise EdgelearnError(f"{profile.name} bundles carry the Vela-compiled model and Vela is not installed",
                                     fix="pip install 'edgelearn[host]' (ethos-u-vela)")
            compiled = vela_report(model, keep_dir=tmp / "vela")["compiled"]
            files[compiled.name] = compiled
            parts.append({"name": "encoder-ethos-u", "file": compiled.name, "format": "tflite",
                          "placement": "npu", "precision": "int8", "layers": [0, len(g.layers)],
                          "compiler": "ethos-u-vela 5.2.0, ethos-u55-128"})
        if profile.runtime == "micropython":
            blob = write_blob(g, tmp / "weights.elb")
            files["weights.elb"] = blob
            parts.append({"name": "encoder-weights", "file": "weights.elb", "format": "mpy-blob",
                          "placement": "mcu", "precision": "int8", "layers": [0, len(g.layers)]})
        from host.partition.training import tail_ops
        try:
            tail = [o.layer for o in tail_ops(g) if o.kind == "linear"]
        except EdgelearnError:
            tail = []
        manifest = {
            "model_id": args.model_id, "version": args.version, "labels": labels,
            "target": {"name": profile.name, "kind": profile.kind, "runtime": profile.runtime,
                       "budget_bytes": profile.budget_bytes},
            "partitions": parts,
            "trainable": {"strategy": plan.totals["training_strategy"], "layers": tail,
                          "predicted_bytes": plan.totals["training_bytes"]},
            "quantization": {"input": _qparams(g, g.inputs[0]), "outputs": [_qparams(g, t) for t in g.outputs]},
            "extra": {"plan": {k: v for k, v in plan.totals.items() if k != "arena_approximate_ops"},
                      "verdict": plan.verdict},
        }
        out = build_bundle(args.out, files, manifest, args.key)
    print(plan.verdict)
    print(f"bundle: {out}")
    return 0


def _cloud_split(model: Path, g, cut: int, tmp: Path, placement: str) -> tuple[dict, list]:
    from host.partition.split import export_split

    if g.format != "onnx":
        raise EdgelearnError(f"the plan cuts {model.name} before layer {cut}, and the cloud half is exported "
                             "from the ONNX model", fix="pass the .onnx model (edgelearn quantize writes it)")
    device, cloud = export_split(model, cut, tmp / "split")
    files = {device.name: device, cloud.name: cloud}
    parts = [{"name": "device", "file": device.name, "format": "onnx", "placement": placement,
              "precision": "int8", "layers": [0, cut]},
             {"name": "cloud", "file": cloud.name, "format": "onnx", "placement": "cloud",
              "precision": "int8", "layers": [cut, len(g.layers)]}]
    return files, parts


def _qparams(g, t: int) -> dict:
    x = g.tensors[t]
    return {"name": x.name, "dtype": x.dtype, "shape": list(x.shape), "scale": list(x.scales),
            "zero_point": list(x.zero_points)}


def _labels_from_bundle(path: Path) -> list[str]:
    mf = path / "manifest.json" if path.is_dir() else None
    if mf and mf.is_file():
        return list(json.loads(mf.read_text()).get("labels", []))
    raise EdgelearnError("no labels given and the model is not a bundle",
                         fix="pass --labels yes,no,... in the order of the model's outputs")
