"""Turn a verified bundle into the models the shim serves.

From a bundle with model id ``kws-dscnn-s`` the shim serves:

* ``kws-dscnn-s``: the full ONNX model (features in, embedding + logits out);
* ``kws-dscnn-s.head``: the classifier head cut out of the full model with
  ``onnx.utils.extract_model`` (embedding in, logits out), for devices that send
  the embedding of a low-confidence clip (cascade);
* ``kws-dscnn-s.<partition>``: every ONNX partition whose placement is
  ``cloud``, the cloud half of a split model (activation at the cut in).

    >>> served = load_bundle_models("models/kws-dscnn-s", trusted_keys="keys/release.pub", work_dir=tmp)
    >>> [(s.name, s.kind) for s in served.models]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edge.errors import BundleError, EdgelearnError
from host.serve.protocol import ORT_TO_OIP, ModelSpec, TensorSpec

MAIN_PARTITION_NAMES = ("full", "encoder", "model")


@dataclass
class ServableModel:
    name: str
    version: str
    path: str
    spec: ModelSpec
    kind: str                    # "full", "head" or "split"
    score_output: str | None     # the class-score output, for health checks and labels
    partition: str = ""


@dataclass
class ServedBundle:
    model_id: str
    version: str
    labels: list[str]
    models: list[ServableModel]
    embedding_output: str | None


def spec_from_onnx(path: str, name: str, version: str) -> ModelSpec:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    try:
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise BundleError(f"{Path(path).name}: ONNX Runtime cannot load it ({e})",
                          fix="re-export the model; check its opset against onnxruntime") from None

    def tensors(items) -> list[TensorSpec]:
        out = []
        for t in items:
            if t.type not in ORT_TO_OIP:
                raise BundleError(f"{Path(path).name}: tensor {t.name} has type {t.type}, "
                                  "which the shim cannot serve", fix="export with float/int tensors")
            out.append(TensorSpec(t.name, ORT_TO_OIP[t.type], [d if isinstance(d, int) else -1 for d in t.shape]))
        return out

    return ModelSpec(name, version, tensors(sess.get_inputs()), tensors(sess.get_outputs()))


def _score_output(spec: ModelSpec, n_labels: int) -> str | None:
    for t in spec.outputs:
        if t.datatype.startswith("FP") and len(t.shape) == 2 and t.shape[-1] == n_labels:
            return t.name
    return None


def _embedding_output(spec: ModelSpec, score: str | None) -> str | None:
    cands = [t for t in spec.outputs if t.name != score and t.datatype.startswith("FP") and len(t.shape) == 2]
    named = [t for t in cands if "emb" in t.name.lower()]
    pick = named or cands
    return pick[0].name if pick else None


def _extract_head(full: str, embedding: str, score: str, out_path: Path) -> bool:
    """Cut embedding -> scores out of the full graph; False if the graph does not allow it."""
    try:
        import onnx.utils
    except ModuleNotFoundError:
        return False  # the head endpoint is optional; the serve extra need not carry onnx
    try:
        onnx.utils.extract_model(full, str(out_path), [embedding], [score], check_model=True)
    except Exception:
        return False  # e.g. the score output does not depend on the embedding
    return True


def load_bundle_models(path, trusted_keys=None, *, allow_unsigned: bool = False,
                       work_dir: Path) -> ServedBundle:
    from edge.bundle import load_bundle

    b = load_bundle(path, trusted_keys=trusted_keys, allow_unsigned=allow_unsigned)
    version = str(b.version)
    onnx_parts = [p for p in b.partitions if p.get("format") == "onnx"]
    main = ([p for p in onnx_parts if p["name"] in MAIN_PARTITION_NAMES and p.get("placement") != "cloud"]
            or [p for p in onnx_parts if p.get("placement") != "cloud"])
    cloud = [p for p in onnx_parts if p.get("placement") == "cloud"]
    if not main and not cloud:
        raise BundleError(f"bundle {b.model_id} v{version} has no ONNX partition to serve",
                          fix="build the bundle with the ONNX export (`edgelearn quantize` writes one)")
    work = Path(work_dir) / f"{b.model_id}-v{version}"
    work.mkdir(parents=True, exist_ok=True)
    models: list[ServableModel] = []
    emb = None
    if main:
        full_path = str(b.path(main[0]["file"]))
        spec = spec_from_onnx(full_path, b.model_id, version)
        score = _score_output(spec, len(b.labels))
        models.append(ServableModel(b.model_id, version, full_path, spec, "full", score, main[0]["name"]))
        emb = _embedding_output(spec, score)
        head_path = work / "head.onnx"
        if emb and score and _extract_head(full_path, emb, score, head_path):
            hspec = spec_from_onnx(str(head_path), f"{b.model_id}.head", version)
            models.append(ServableModel(hspec.name, version, str(head_path), hspec, "head",
                                        _score_output(hspec, len(b.labels)), "head"))
    for p in cloud:
        name = f"{b.model_id}.{p['name']}"
        ppath = str(b.path(p["file"]))
        spec = spec_from_onnx(ppath, name, version)
        models.append(ServableModel(name, version, ppath, spec, "split", _score_output(spec, len(b.labels)),
                                    p["name"]))
    # keep the Bundle (and a zip's temp extraction) alive as long as its files are served
    served = ServedBundle(b.model_id, version, b.labels, models, emb)
    served._bundle = b  # type: ignore[attr-defined]
    return served


def check_bundle_path(path: str, allowed_dir: Path | None) -> Path:
    """A bundle path sent over HTTP must lie inside the configured rollout directory."""
    if allowed_dir is None:
        raise EdgelearnError("loading bundles over HTTP is disabled",
                             fix="start the server with --rollout-dir DIR and put new bundles there")
    p = (allowed_dir / path).resolve() if not Path(path).is_absolute() else Path(path).resolve()
    if allowed_dir.resolve() not in p.parents and p != allowed_dir.resolve():
        raise EdgelearnError(f"{path} is outside the rollout directory {allowed_dir}",
                             fix="copy the bundle into the rollout directory first")
    return p
