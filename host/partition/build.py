"""A target-specific signed bundle from a model and a target profile (``edgelearn partition``).

The bundle carries the model partitions with their placement (NPU/CPU/MCU; a device/cloud split
as two ONNX halves when the plan or ``cut`` cuts the model; the Vela-compiled model for Ethos-U
targets; the flat int8 tensor blob for MicroPython targets), the trainable subset and the plan
(docs/partition.md).

    >>> out, plan = build_target_bundle("build/kws/encoder_int8.tflite", "esp32", "out/kws-esp32",
    ...                                 "keys/edgelearn.key", labels=["yes", "no", "up", "down"])
    >>> plan.verdict
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from edge.errors import EdgelearnError


def build_target_bundle(model, profile, out, key, *, model_id: str | None = None, version: int | None = None,
                        labels=None, objective: str = "latency", cut: int | None = None,
                        force: bool = False):
    """Plan ``model`` (an int8 .tflite or .onnx, or a bundle) for ``profile`` (a
    ``host.partition.Profile``, a shipped profile's name or a .toml path) and write the signed
    bundle ``out`` with the Ed25519 private key ``key``; returns (bundle path, plan).

    ``labels``: the model's labels in output order (None: from the input bundle). A plan that does
    not fit is an ``EdgelearnError`` with its advice unless ``force``; ``cut``: the device/cloud cut
    before this layer (ONNX models), instead of the plan's.

    From a bundle, the new bundle keeps its model id and version (unless ``model_id``/``version`` are
    given), its front end, and every file, partition and manifest section the target's partitions do not
    replace (``carry_bundle``), so what ran the input bundle runs the partitioned one; from a bare model,
    ``model_id`` defaults to ``kws-dscnn-s`` and ``version`` to 1."""
    from host.bundle import build_bundle
    from host.partition.blob import write_blob
    from host.partition.graph import load_graph
    from host.partition.plan import plan_partition
    from host.partition.profiles import Profile, load_profile
    from host.partition.report import resolve_model

    model_arg = Path(model)
    profile = profile if isinstance(profile, Profile) else load_profile(profile)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = resolve_model(model_arg, tmp / "in")
        source = None  # the input bundle's directory and manifest, when the input is a bundle
        if model_arg.suffix.lower() not in (".tflite", ".onnx") and (model.parent / "manifest.json").is_file():
            source = (model.parent, read_manifest(model.parent))
        labels = list(labels or ()) or (list(source[1].get("labels", [])) if source else labels_from_bundle(model_arg))
        if model_id is None:
            model_id = str(source[1].get("model_id", "kws-dscnn-s")) if source else "kws-dscnn-s"
        if version is None:
            version = int(source[1].get("version", 1)) if source else 1
        g = load_graph(model)
        plan = plan_partition(g, profile, objective=objective)
        spec = board_graph(g, model_arg, profile, plan) if profile.runtime == "micropython" else None
        if not plan.fits and not force:
            raise EdgelearnError(plan.verdict, fix="follow that advice, or pass --force to write it anyway")
        npu = plan.totals["npu_ops"] and profile.npu is not None
        placement = "mcu" if profile.kind == "mcu" and not npu else ("npu" if npu else "cpu")
        files = {model.name: model}
        parts = [{"name": "encoder", "file": model.name, "format": g.format, "placement": placement,
                  "precision": "int8" if g.is_int8 else "float32", "layers": [0, len(g.layers)]}]
        at = cut if cut is not None else (plan.split.cut if plan.split is not None else len(g.layers))
        if 0 < at < len(g.layers):
            files, parts = cloud_split(model, g, at, tmp, placement)
        elif cut is not None:
            raise EdgelearnError(f"--cut {cut} is not inside the model ({len(g.layers)} layers)",
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
            files["weights.elb"] = write_blob(g, tmp / "weights.elb")
            parts.append({"name": "encoder-weights", "file": "weights.elb", "format": "mpy-blob",
                          "placement": "mcu", "precision": "int8", "layers": [0, len(g.layers)]})
            if spec is not None:  # the op list the firmware runs: without it `edgelearn flash` refuses the bundle
                (tmp / "graph.json").write_text(json.dumps(spec, separators=(",", ":")))
                files["graph.json"] = tmp / "graph.json"
                parts[-1]["graph"] = "graph.json"
        manifest = target_manifest(g, plan, profile, parts, model_id=model_id, version=version, labels=labels)
        if source is not None:
            files, manifest = carry_bundle(*source, model.name, files, manifest)
        out = build_bundle(out, files, manifest, key)
    return out, plan


def board_graph(g, model_arg: Path, profile, plan):
    """For a MicroPython target: ``graph.json``'s content, the op list the board's firmware runs beside
    the blob (``host.mcu_model.graph_spec``, docs/firmware.md), or None when the firmware's int8 kernels
    do not run the model (DS-CNN's MEAN and SOFTMAX). Such a model that does not fit the board either
    is refused, ``--force`` or not, pointing at the model the board does run (the plan's own advice, a
    DS-CNN variant, would need those kernels too); one that fits is written with its blob alone, which
    ``edgelearn flash`` refuses in one sentence (``host.flash.check_flashable``)."""
    from host.mcu_model import SUPPORTED_OPS, graph_spec
    from host.partition.graph import ModelError

    try:
        return graph_spec(g)
    except ModelError:
        if plan.fits:
            return None
    ops = sorted({layer.op for layer in g.layers} - set(SUPPORTED_OPS) - {"SHAPE", "STRIDED_SLICE", "PACK",
                                                                           "CONCATENATION"})
    raise EdgelearnError(f"{model_arg.name}: {plan.verdict.split('; try ')[0]}, and "
                         f"the board's MicroPython firmware has no int8 kernel for {', '.join(ops) or 'one of its ops'} "
                         f"(it runs {', '.join(SUPPORTED_OPS)}), so not even --force gives a bundle it can run",
                         fix=f"partition the shipped MCU model, made for MicroPython boards: edgelearn partition "
                             f"kws-mcu-tcnn --target {profile.name} --out DIR --key KEY")


def read_manifest(bundle_dir: Path) -> dict:
    try:
        m = json.loads((bundle_dir / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise EdgelearnError(f"{bundle_dir}/manifest.json cannot be read ({e})", fix="rebuild the bundle") from None
    if not isinstance(m, dict):
        raise EdgelearnError(f"{bundle_dir}/manifest.json is not a JSON object", fix="rebuild the bundle")
    return m


def carry_bundle(src: Path, src_manifest: dict, replaced: str, files: dict, manifest: dict) -> tuple[dict, dict]:
    """The target bundle's files and manifest with what the input bundle ``src`` has and the target's
    partitions do not replace: its other files and partitions (the input's partition of file ``replaced``
    gives way to the new ones, which keep its role and tensor declarations when the model is not cut),
    its front end, and its ``extra``, ``trainable`` and ``quantization`` entries besides the new ones
    (the input's ``trainable`` wins: the device runtime adapts with it; the plan's own is in extra.plan)."""
    files = dict(files)
    new_names = {p["name"] for p in manifest["partitions"]}
    parts = []
    for part in manifest["partitions"]:
        old = next((p for p in src_manifest.get("partitions", []) if p.get("file") == replaced), None)
        if old is not None and part["file"] == replaced:  # the same model, placed for the target
            part = {**{k: v for k, v in old.items() if k not in ("placement", "layers")}, **part}
        parts.append(part)
    for part in src_manifest.get("partitions", []):
        if part.get("file") != replaced and part.get("name") not in new_names and part.get("file") not in files:
            parts.append(part)
    for name in src_manifest.get("files", {}):
        if name != replaced and name not in files:
            files[name] = src / name
    m = dict(manifest, partitions=parts, frontend=src_manifest.get("frontend") or {})
    for key in ("extra", "quantization"):
        m[key] = {**(src_manifest.get(key) or {}), **manifest[key]}
    m["trainable"] = {**manifest["trainable"], **(src_manifest.get("trainable") or {})}
    return files, m


def target_manifest(g, plan, profile, parts: list, *, model_id: str, version: int, labels: list) -> dict:
    """The manifest of a target bundle: its partitions, the target, what trains on the device
    (the linear layers of the graph's tail), the quantisation of its inputs and outputs, the plan."""
    from host.partition.training import tail_ops
    try:
        tail = [o.layer for o in tail_ops(g) if o.kind == "linear"]
    except EdgelearnError:
        tail = []
    return {
        "model_id": model_id, "version": version, "labels": labels,
        "target": {"name": profile.name, "kind": profile.kind, "runtime": profile.runtime,
                   "budget_bytes": profile.budget_bytes},
        "partitions": parts,
        "trainable": {"strategy": plan.totals["training_strategy"], "layers": tail,
                      "predicted_bytes": plan.totals["training_bytes"]},
        "quantization": {"input": qparams(g, g.inputs[0]), "outputs": [qparams(g, t) for t in g.outputs]},
        "extra": {"plan": {k: v for k, v in plan.totals.items() if k != "arena_approximate_ops"},
                  "verdict": plan.verdict},
    }


def cloud_split(model: Path, g, cut: int, tmp: Path, placement: str) -> tuple[dict, list]:
    """The device and cloud halves of an ONNX model cut before layer ``cut``: (files, partitions)."""
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


def qparams(g, t: int) -> dict:
    x = g.tensors[t]
    return {"name": x.name, "dtype": x.dtype, "shape": list(x.shape), "scale": list(x.scales),
            "zero_point": list(x.zero_points)}


def labels_from_bundle(path: Path) -> list[str]:
    mf = path / "manifest.json" if path.is_dir() else None
    if mf and mf.is_file():
        return list(json.loads(mf.read_text()).get("labels", []))
    raise EdgelearnError("no labels given and the model is not a bundle",
                         fix="pass --labels yes,no,... in the order of the model's outputs")
