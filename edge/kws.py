"""Keyword spotting with a verified bundle: audio -> normalised MFCC -> int8 encoder.

``KeywordModel`` wraps one encoder partition of a bundle behind the backend
interface (LiteRT for ``.tflite``, ONNX Runtime for ``.onnx``) and returns both
outputs of one invocation: the 64-d embedding (for enrolment and adaptation)
and the class probabilities (for the base keywords).

    >>> from edge.bundle import load_bundle
    >>> from edge.kws import KeywordModel
    >>> km = KeywordModel(load_bundle("models/kws-dscnn-s", trusted_keys="models/keys"))
    >>> label, score = km.classify(pcm)        # 1 s of 16 kHz int16
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge import features as F
from edge.errors import BundleError, EdgelearnError

# The shipped bundles and the public key that verifies them travel with the package (edge/models,
# package data; the checkout's models/ links here).
MODELS = Path(__file__).resolve().parent / "models"
REPO_KEYS = MODELS / "keys"
DEFAULT_BUNDLE = MODELS / "kws-dscnn-s"


def named_bundle(value) -> Path:
    """``value`` as a bundle path: the path when it exists, else the shipped bundle of that name
    (``kws-mcu-tcnn``, or a checkout's ``models/kws-mcu-tcnn``), so the names work installed from the
    wheel, where the shipped bundles are package data (``MODELS``)."""
    path = Path(value)
    shipped = MODELS / path.name
    if (not path.exists() and path.name and str(path.parent) in (".", "models")
            and (shipped / "manifest.json").is_file()):
        return shipped
    return path


NO_SHIPPED_ENV = "EDGELEARN_NO_SHIPPED_KEYS"


class TrustedKeys(list):
    """The resolved key files and directories; ``str()`` joins them with ``os.pathsep`` (like $PATH), so code
    that passes keys on as one path string (``--pubkey``, a unit file) keeps them all (``load_public_keys``)."""

    def __str__(self) -> str:
        import os

        return os.pathsep.join(str(k) for k in self)


def configured_keys(given=None) -> list:
    """The keys a user configured: every ``given`` (``--pubkey``, repeatable: a .pub file or a directory
    of them), else ``$EDGELEARN_KEYS``, else ``/etc/edgelearn/keys`` when it exists; [] when none."""
    import os

    if given:
        items = list(given) if isinstance(given, (list, tuple)) else [given]
        return [k if not isinstance(k, str) or k.startswith("edgelearn-") else Path(k) for k in items]
    env = os.environ.get("EDGELEARN_KEYS")
    if env:
        paths = [Path(p) for p in env.split(os.pathsep) if p]
        missing = [str(p) for p in paths if not p.exists()]
        if missing or not paths:
            raise EdgelearnError(f"EDGELEARN_KEYS={env}: no such key file or directory {', '.join(missing)}".rstrip(),
                                 fix="point EDGELEARN_KEYS at .pub files or directories of them (several: "
                                     f"joined with {os.pathsep!r}), or unset it")
        return paths
    etc = Path("/etc/edgelearn/keys")
    return [etc] if etc.exists() else []


def shipped_keys_trusted() -> bool:
    """Whether the shipped release keys are trusted: yes unless ``$EDGELEARN_NO_SHIPPED_KEYS`` is 1/yes/true.

    The shipped bundles (the default model every command falls back to) are signed with these keys, so
    trusting only the keys a user adds would make ``--pubkey aggregator.pub`` refuse the device's own base
    model. The opt-out exists for fleets that run only their own signed bundles, or that have retired a
    release key: they can shrink the trust set to exactly the keys they configure."""
    import os

    return os.environ.get(NO_SHIPPED_ENV, "").strip().lower() not in ("1", "yes", "true", "on")


def resolve_trusted_keys(given=None) -> TrustedKeys:
    """Keys a device trusts: the configured ones (``configured_keys``: ``--pubkey`` values, else
    $EDGELEARN_KEYS, else /etc/edgelearn/keys) plus, always, the shipped release keys (``REPO_KEYS``)
    unless $EDGELEARN_NO_SHIPPED_KEYS=1. A list for ``load_bundle(trusted_keys=...)``."""
    keys = TrustedKeys(configured_keys(given))
    if shipped_keys_trusted() and REPO_KEYS.is_dir() and REPO_KEYS not in keys:
        keys.append(REPO_KEYS)
    if not keys:
        off = f" (the shipped keys are off: ${NO_SHIPPED_ENV} is set)" if not shipped_keys_trusted() else ""
        raise EdgelearnError(f"no trusted public keys found{off}",
                             fix="pass --pubkey KEYFILE or set EDGELEARN_KEYS to a key directory"
                                 + (f", or unset {NO_SHIPPED_ENV}" if off else ""))
    return keys


def default_trusted_keys() -> TrustedKeys:
    """Keys a device trusts by default: $EDGELEARN_KEYS (else /etc/edgelearn/keys) plus the shipped ones."""
    return resolve_trusted_keys(None)


def check_frontend(frontend: dict) -> None:
    """Refuse a bundle made for a different front end than this runtime computes."""
    for k, v in F.PARAMS.items():
        if k in frontend and frontend[k] != v:
            raise BundleError(f"bundle front end has {k}={frontend[k]!r}, this runtime computes {v!r}",
                              fix="use a bundle built for the edgelearn front end (docs/frontend-and-model.md) or upgrade")


def check_labels_fit(bundle, part: dict, probs) -> None:
    """The model's class output has exactly one value per label of the bundle (else classify
    would index past the labels, or name a class by the wrong word)."""
    n, shape = len(bundle.labels), tuple(probs.shape)
    k = shape[-1] if shape else 1
    if n == 0 or (k > 0 and k != n):
        raise BundleError(f"bundle {bundle.model_id} v{bundle.version} has {n} labels, but its model "
                          f"{part['file']} gives {k} classes",
                          fix="list one label per class in manifest.json, in the model's output order, "
                              "and sign the bundle again (`edgelearn bundle sign` checks this)")


class KeywordModel:
    """One encoder of a bundle: (N, 49, 10) normalised features -> (embedding, probs)."""

    def __init__(self, bundle, backend: str = "auto", num_threads: int = 1, precision: str = "int8"):
        from edge.backends import load

        self.bundle = bundle
        fe = bundle.frontend
        check_frontend(fe)
        try:
            self.scale = np.asarray(fe["normalize"]["scale"], np.float32)
        except (KeyError, TypeError, ValueError):
            raise BundleError(f"bundle {bundle.model_id} has no frontend.normalize.scale",
                              fix="rebuild it with `edgelearn model`") from None
        if (self.scale.shape not in ((), (F.N_MFCC,)) or not np.all(np.isfinite(self.scale))
                or np.any(self.scale == 0)):
            raise BundleError(f"bundle {bundle.model_id}: frontend.normalize.scale must be {F.N_MFCC} finite, "
                              f"non-zero numbers (got shape {list(self.scale.shape)})",
                              fix="rebuild it with `edgelearn model`")
        self.part = self._choose_partition(bundle, backend, precision)
        self.backend = load(bundle.path(self.part["file"]), backend=backend, num_threads=num_threads)
        roles = {o["role"]: o.get("name") for o in self.part.get("outputs", []) if "role" in o}
        names = [o.name for o in self.backend.outputs]
        try:
            self._emb = names.index(roles["embedding"])
            self._probs = names.index(roles["probs"])
        except (KeyError, ValueError):
            raise BundleError(f"partition {self.part['name']!r} does not name its embedding and probs "
                              f"outputs (model outputs: {names})", fix="rebuild the bundle") from None
        self.labels = bundle.labels
        check_labels_fit(bundle, self.part, self.backend.outputs[self._probs])

    @staticmethod
    def _choose_partition(bundle, backend: str, precision: str) -> dict:
        fmt = "onnx" if backend == "onnxruntime" else "tflite"
        cands = [p for p in bundle.partitions if p.get("role") == "encoder" and p["format"] == fmt]
        if not cands:
            raise BundleError(f"bundle {bundle.model_id} has no {fmt} encoder partition",
                              fix="choose another --backend")
        cands.sort(key=lambda p: p.get("precision") != precision)
        return cands[0]

    def features(self, pcm) -> np.ndarray:
        """1 s (or (N, 16000)) of audio -> normalised (…, 49, 10) float32."""
        return F.normalize(F.mfcc(pcm), self.scale)

    def infer(self, feats: np.ndarray):
        """(N, 49, 10) normalised features -> (embedding (N, 64), probs (N, classes)), float32."""
        x = np.asarray(feats, np.float32).reshape(-1, F.N_FRAMES, F.N_MFCC, 1)
        outs = self.backend.run1(x) if len(x) == 1 else self.backend.run(x)
        return outs[self._emb], outs[self._probs]

    def classify(self, pcm):
        """1 s of audio -> (label, probability)."""
        _, probs = self.infer(self.features(F.fit_to_window(np.asarray(pcm)))[None])
        k = int(np.argmax(probs[0]))
        return self.labels[k], float(probs[0, k])
