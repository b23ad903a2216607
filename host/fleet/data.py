"""Federated data for the simulator: corpus clips as encoder embeddings, cached once.

Running the int8 encoder on raw audio every round would make a 100-device
simulation take hours; the federated model is only the trainable tail on top
of the frozen encoder, so the simulator (and the aggregator's held-out check)
work on 64-d embeddings computed once per (corpus, encoder file) and cached
under ``.cache/edgelearn``. ``partition_noniid`` gives each simulated device
its own voices and a skewed subset of the words, as real users would have.

    >>> data = load_embeddings()                       # computes once, then loads the cache
    >>> parts = partition_noniid(data, n_devices=20, seed=0)
    >>> X, y = data.X[parts[0]], data.y[parts[0]]
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge.atomic import atomic_file
from edge.errors import EdgelearnError

SPLITS = ("train", "val", "test")


@dataclass
class EmbeddingSet:
    """Embeddings ``X`` (N, D) float32, labels ``y`` (N,), ``voice`` and ``split`` per row."""
    X: np.ndarray
    y: np.ndarray
    voice: np.ndarray
    split: np.ndarray

    def rows(self, split: str) -> np.ndarray:
        return np.nonzero(self.split == split)[0]


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


def _find_corpus(cache_dir: Path):
    """The corpus the default config names, else the newest cached one; renders only if none exists."""
    from host.data.corpus import CorpusConfig, build_corpus, load_corpus

    want = cache_dir / f"corpus-{CorpusConfig().key()}"
    if want.exists():
        return load_corpus(want), want.name
    cached = sorted(cache_dir.glob("corpus-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for c in cached:
        if (c / "meta.json").exists() and not c.name.count(".tmp"):
            return load_corpus(c), c.name
    return build_corpus(cache_dir=cache_dir), want.name


def read_embeddings(path, shape: tuple[int, int] | None = None) -> EmbeddingSet:
    """An embedding set saved as ``.npz`` with arrays ``X`` (N, D), ``y`` (N,), ``voice`` and ``split``
    (N,), as ``load_embeddings`` caches it: ``fleet simulate --embeddings`` runs the fleet on it.
    ``shape``: the head's (D, classes), which X's width and the labels must fit."""
    path = Path(path)
    dim, classes = shape or ("D", "K")
    fix = (f"give an .npz with X (N, {dim}) float, y (N,) integer labels 0 to {classes} - 1, voice and split "
           "(N,) strings, with train rows (the devices') and test rows (the held-out check)")
    try:
        with np.load(path, allow_pickle=False) as z:
            absent = [k for k in ("X", "y", "voice", "split") if k not in z.files]
            if absent:
                raise EdgelearnError(f"{path}: the embeddings file has no array {', '.join(absent)}", fix=fix)
            data = EmbeddingSet(np.asarray(z["X"], np.float32), np.asarray(z["y"]),
                                np.asarray(z["voice"]).astype(str), np.asarray(z["split"]).astype(str))
    except FileNotFoundError:
        raise EdgelearnError(f"{path}: no such embeddings file", fix=fix) from None
    except (OSError, ValueError, EOFError, AttributeError, TypeError) as e:  # a .npy, a pickle, a truncated zip
        raise EdgelearnError(f"{path}: not a readable .npz of embeddings ({str(e)[:80]})", fix=fix) from None
    n = len(data.X)
    if data.X.ndim != 2 or n == 0 or any(a.shape != (n,) for a in (data.y, data.voice, data.split)):
        raise EdgelearnError(f"{path}: X is {data.X.shape} but y, voice, split are "
                             f"{data.y.shape}, {data.voice.shape}, {data.split.shape}", fix=fix)
    if not np.issubdtype(data.y.dtype, np.integer) or not np.isfinite(data.X).all():
        raise EdgelearnError(f"{path}: y must be integer labels and X finite", fix=fix)
    if shape and (data.X.shape[1] != dim or data.y.min() < 0 or data.y.max() >= classes):
        raise EdgelearnError(f"{path}: X is {data.X.shape[1]} wide with labels {data.y.min()} to {data.y.max()}, "
                             f"not {dim} wide with labels below {classes}", fix=fix)
    missing = [s for s in ("train", "test") if not (data.split == s).any()]
    if missing:
        raise EdgelearnError(f"{path}: no rows in split(s) {', '.join(missing)}", fix=fix)
    return data


def load_embeddings(bundle_dir=None, cache_dir=None, progress: bool = True) -> EmbeddingSet:
    """Embeddings of the corpus eval clips for train/val/test voices, from cache or computed once."""
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from host.data.corpus import default_cache_dir

    bundle_dir = Path(bundle_dir or DEFAULT_BUNDLE)
    cache_dir = Path(cache_dir or default_cache_dir())
    bundle = load_bundle(bundle_dir, trusted_keys=default_trusted_keys())
    km = KeywordModel(bundle, backend="litert")
    enc = _file_digest(bundle.path(km.part["file"]))
    corpus, cname = _find_corpus(cache_dir)
    path = cache_dir / f"fl-embeddings-{cname}-{enc}.npz"
    if path.exists():
        try:
            return read_embeddings(path)
        except EdgelearnError:
            path.unlink(missing_ok=True)  # a damaged cache is recomputed
    Xs, ys, vs, ss = [], [], [], []
    for split in SPLITS:
        x, y, voices = corpus.eval_clips(split)
        emb = []
        for a in range(0, len(x), 256):
            emb.append(km.infer(km.features(x[a:a + 256]))[0])
            if progress:
                print(f"\rfleet data: embedding {split} {min(a + 256, len(x))}/{len(x)}",
                      end="", file=sys.stderr, flush=True)
        Xs.append(np.concatenate(emb).astype(np.float32))
        ys.append(np.asarray(y, np.int16))
        vs.append(np.asarray(voices).astype(str))
        ss.append(np.full(len(y), split))
    if progress:
        print(file=sys.stderr)
    data = EmbeddingSet(np.concatenate(Xs), np.concatenate(ys), np.concatenate(vs), np.concatenate(ss))
    with atomic_file(path, mode=None) as f:
        np.savez(f, X=data.X, y=data.y, voice=data.voice, split=data.split)
    return data


def rehearsal_rows(data: EmbeddingSet, labels, per_label: int, split: str = "train", seed: int = 0) -> np.ndarray:
    """Rows for an aggregator's rehearsal set (``init_state(rehearsal=)``): ``per_label`` clips of each
    label id in ``labels`` from ``split`` (the voices the shipped model was trained on), the first of
    one fixed shuffle per label, so a smaller set is part of a larger one (``seed`` chooses the shuffle)."""
    rows = data.rows(split)
    out = []
    for c in labels:
        mine = rows[data.y[rows] == int(c)]
        if len(mine) < per_label:
            raise EdgelearnError(f"the {split} split has {len(mine)} clips of label {int(c)}, fewer than {per_label}",
                                 fix=f"ask for at most {len(mine)} per label")
        out.append(mine[np.random.default_rng([seed, int(c)]).permutation(len(mine))[:per_label]])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def partition_noniid(data: EmbeddingSet, n_devices: int, seed: int = 0, split: str = "train",
                     words_per_device: int = 12, n_classes: int = 37) -> list[np.ndarray]:
    """Rows per device: each device is one voice (voices are reused when devices outnumber them)
    and keeps a random subset of ``words_per_device`` labels, plus silence/unknown rows."""
    rows = data.rows(split)
    if rows.size == 0:
        raise EdgelearnError(f"no {split!r} rows in the embedding set", fix="rebuild the corpus")
    rng = np.random.default_rng(seed)
    voices = sorted(set(data.voice[rows]) - {"noise"})
    noise_rows = rows[data.voice[rows] == "noise"]
    rng.shuffle(voices)
    out = []
    for d in range(n_devices):
        v = voices[d % len(voices)]
        mine = rows[data.voice[rows] == v]
        # devices that share a voice split its clips, so no two devices hold the same row
        share = d // len(voices)
        n_share = -(-n_devices // len(voices)) if n_devices > len(voices) else 1
        mine = mine[share::n_share]
        words = rng.choice(n_classes, size=min(words_per_device, n_classes), replace=False)
        keep = mine[np.isin(data.y[mine], words) | (data.y[mine] >= n_classes - 2)]
        sil = rng.choice(noise_rows, size=min(3, noise_rows.size), replace=False) if noise_rows.size else []
        out.append(np.concatenate([keep, np.asarray(sil, dtype=rows.dtype)]))
    return out


def extract_head(bundle_dir=None) -> dict:
    """The federated tail's starting point: identity projection + the bundle's classifier (float32).

    Same layout as ``edge.adapt.classifier_from_bundle`` (which recovers the
    classifier by least squares on the float model's outputs, for devices);

    here it is read from the float TFLite partition's constant tensors, exactly;
    falls back to the int8
    partition's (dequantised) weights when no float partition exists.
    """
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, default_trusted_keys

    bundle = load_bundle(Path(bundle_dir or DEFAULT_BUNDLE), trusted_keys=default_trusted_keys())
    n_cls = len(bundle.labels)
    dim = int(bundle.manifest.get("trainable", {}).get("embedding_dim", 64))
    parts = sorted((p for p in bundle.partitions if p["format"] == "tflite" and p.get("role") == "encoder"),
                   key=lambda p: p.get("precision") != "float32")
    from ai_edge_litert.interpreter import Interpreter

    for p in parts:
        it = Interpreter(model_path=str(bundle.path(p["file"])))
        W = b = None
        for d in it.get_tensor_details():
            shape = tuple(d["shape"])
            try:
                val = it.get_tensor(d["index"])
            except ValueError:
                continue
            q = d.get("quantization_parameters", {})
            if val.dtype != np.float32:
                sc = q.get("scales")
                if sc is None or len(sc) == 0:
                    continue
                sc = np.asarray(sc, np.float32)
                zp = np.asarray(q.get("zero_points"), np.float32)
                val = (val.astype(np.float32) - (zp.reshape(-1, *[1] * (val.ndim - 1)) if val.ndim else zp)) * \
                    (sc.reshape(-1, *[1] * (val.ndim - 1)) if val.ndim and sc.size > 1 else sc)
            if shape == (n_cls, dim) and W is None:
                W = np.asarray(val, np.float32)
            elif shape == (n_cls,) and b is None and "Relu" not in d["name"]:
                b = np.asarray(val, np.float32)
        if W is not None and b is not None:
            return {"proj.w": np.eye(dim, dtype=np.float32), "proj.b": np.zeros(dim, np.float32),
                    "classifier.w": W.T.copy(), "classifier.b": b.copy()}
    raise EdgelearnError(f"bundle {bundle.model_id} has no ({n_cls}, {dim}) classifier weights in a TFLite partition",
                         fix="rebuild the bundle with `edgelearn model`")
