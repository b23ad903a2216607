"""Model versions: parameters on disk, a signed bundle per version, and the held-out check.

Every aggregate that passes the held-out check becomes version v+1: its
trainable tensors go into ``head.npz`` inside a bundle that is the base
bundle's files plus that file, with a manifest naming it (``trainable.file``),
signed with the aggregator's Ed25519 key and zipped for download. An
aggregate that loses more than ``tolerance`` accuracy on the held-out
embeddings (voices no device trains on) is recorded as ``rejected`` and the
current version stays: the automatic rollback. Files are written (atomically)
before the database names them, so a crash leaves at worst an unnamed file.

Every version's bundle also carries the operator's rehearsal set when ``init`` was given one
(``rehearsal.npz``: embeddings of the voices the shipped model was trained on, which devices train on
beside their own examples, ``edge.fl.model.load_rehearsal``).

On a shared store (PostgreSQL, several replicas) the files also live in the database (``files``:
the held-out set, the rehearsal set, the base bundle, each version's head, strategy state and zip), written in the
transaction that publishes the version; a replica that lacks one locally (another machine
published it) writes it into its own state directory from there before use.

    reg = ModelRegistry(state_dir, store, signing_key)
    v = reg.init_from_bundle("models/kws-dscnn-s", params)
    ok, acc = reg.check(new_params)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError
from edge.fl.model import HEAD_FILE, REHEARSAL_FILE, head_logits
from edge.atomic import atomic_path, atomic_write, npz_bytes

HEAD_ONNX = "head.onnx"
_BASE_EXCLUDE = ("manifest.json", "manifest.sig", "manifest.mac", HEAD_FILE, HEAD_ONNX, REHEARSAL_FILE)
# a version number is written once; a crash before its commit leaves no row, so a retry replaces nothing
_REPLACE = (" ON CONFLICT(version) DO UPDATE SET parent=excluded.parent, round_id=excluded.round_id, "
            "status=excluded.status, accuracy=excluded.accuracy, epsilon=excluded.epsilon, path=excluded.path, "
            "created=excluded.created")


def params_bytes(params: dict) -> bytes:
    return npz_bytes({k: np.asarray(v, np.float32) for k, v in params.items()})


def load_params(path) -> dict:
    with np.load(path) as z:
        return {k: z[k].astype(np.float32) for k in z.files}


class ModelRegistry:
    """Versions of the federated tail under ``state_dir``, recorded in the ``models`` table."""

    def __init__(self, state_dir, store, signing_key=None):
        self.dir = Path(state_dir)
        self.store = store
        self.shared = store.shared
        self.signing_key = signing_key
        (self.dir / "models").mkdir(parents=True, exist_ok=True)
        (self.dir / "bundles").mkdir(parents=True, exist_ok=True)
        if self.shared:
            self.drop_cache()  # what a killed process left may be a version that never committed
        self.heldout, self.classes, self.negatives, self.groups = None, None, None, None
        self._reference_counts = None
        h = self._local("heldout.npz")
        if h.exists():
            with np.load(h) as z:
                self.heldout = (z["X"].astype(np.float32), z["y"].astype(np.int64))
                if "classes" in z.files:  # label id -> reported class (e.g. 35 words -> 12 classes)
                    self.classes = z["classes"].astype(np.int64)
                if "groups" in z.files:  # row -> group (e.g. a voice family): each is gated on its own
                    self.groups = z["groups"].astype(np.int64)
                if "neg_X" in z.files:  # keyword-free speech, window by window (``operating``)
                    self.negatives = (z["neg_X"].astype(np.float32), z["neg_ends"].astype(np.float64),
                                      z["keywords"].astype(np.int64), float(z["neg_hours"]))

    # --- files -------------------------------------------------------------
    def _local(self, rel: str) -> Path:
        """``state_dir/rel``; on a shared store first written from the database if this replica lacks it."""
        p = self.dir / rel
        if self.shared and not p.exists():
            data = self.store.get_file(rel)
            if data is not None:
                p.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(p, data)
        return p

    def _share(self, rel: str) -> None:
        """Put ``state_dir/rel`` into the shared store (in the caller's transaction)."""
        if self.shared:
            self.store.put_file(rel, (self.dir / rel).read_bytes())

    def _base(self) -> Path:
        """The base bundle's directory: the path ``init`` recorded, or on a shared store this replica's
        copy of the files ``init`` put into the database (``state_dir/base``)."""
        if not self.shared:
            return Path(self.store.get_meta("base_bundle"))
        manifest = json.loads(self._local("base/manifest.json").read_text())
        for n in manifest["files"]:
            if n not in _BASE_EXCLUDE:
                self._local(f"base/{n}")
        return self.dir / "base"

    def drop_cache(self, version: int | None = None) -> None:
        """Forget this replica's local copies (of ``version``, or of every version): on a shared store
        the database is the truth, and a copy written for a publication that did not commit (a failed
        or killed close) must not shadow the version another replica publishes under that number."""
        import shutil

        for sub in ("models", "bundles"):
            d = self.dir / sub
            for p in list(d.iterdir()) if d.is_dir() else []:
                if version is not None and p.name != f"v{version}" and not p.name.startswith(f"v{version}."):
                    continue
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)

    def bundle_file(self, version) -> Path | None:
        """The zip of a published version, or None."""
        row = self.store.one("SELECT path FROM models WHERE version=? AND status='published'", (version,))
        if row is None:
            return None
        p = self._local(f"bundles/v{int(version)}.zip") if self.shared else Path(row[0])
        return p if p.exists() else None

    # --- versions ---------------------------------------------------------
    @property
    def current(self) -> int:
        v = self.store.get_meta("current_version")
        if v is None:
            raise EdgelearnError(f"{self.dir}: no model yet", fix="run `edgelearn aggregator init` first")
        return int(v)

    def params(self, version: int | None = None) -> dict:
        v = self.current if version is None else version
        return load_params(self._local(f"models/v{v}.npz"))

    def strategy_state(self, version: int) -> dict:
        p = self._local(f"models/v{version}.state.npz")
        return load_params(p) if p.exists() else {}

    def zip_path(self, version: int) -> Path:
        return self.dir / "bundles" / f"v{version}.zip"

    def accuracy(self, params: dict, metric: str = "accuracy", rows=None) -> float | None:
        """The held-out score of ``params``: plain accuracy, or (``balanced``) the mean of each class's
        recall over the classes the held-out set has. With a ``classes`` map in ``heldout.npz``, labels
        and predictions are first folded into the classes they are reported as (a device reporting
        the 12-class task names any of the 25 other words `_unknown_`). ``rows``: only those."""
        if self.heldout is None:
            return None
        X, y = self.heldout
        if rows is not None:
            X, y = X[rows], y[rows]
        pred = np.argmax(head_logits(params, X), axis=1)
        if self.classes is not None:
            pred, y = self.classes[pred], self.classes[y]
        hit = pred == y
        if metric == "balanced":
            return float(np.mean([hit[y == k].mean() for k in np.unique(y)]))
        return float(np.mean(hit))

    def operating(self, params: dict, version: int) -> dict | None:
        """The per-word thresholds version ``version`` (``params``) is published with: for each
        keyword of the held-out set's negatives, the lowest threshold at which it fires on that
        keyword-free speech no more often than the first published version does at the base bundle's
        own operating point (``edge.detect.bundle_thresholds``, else ``THRESHOLD``;
        ``edge.operating.matched``), so a version that names the fleet's voices more readily does not
        fire more often on everyday speech than the model federation started from. Words the negatives
        do not cover keep the base bundle's own thresholds. None without negatives, and for the first
        version itself (it carries the base bundle's operating point)."""
        row = self.store.one("SELECT MIN(version) FROM models WHERE status='published'")
        if self.negatives is None or row is None or row[0] is None or version <= int(row[0]):
            return None  # no negatives, or this is the first version (it is the reference)
        start = int(row[0])  # not start_version(): while the first version is written there is none
        from edge.adapt import EmbeddingHead
        from edge.detect import THRESHOLD, bundle_thresholds, count_events
        from edge.operating import matched

        X, ends, kw, hours = self.negatives
        names = [self._labels()[k] for k in kw]
        own = bundle_thresholds(json.loads((self._base() / "manifest.json").read_text())) or {}
        ref_thr = [own.get(n, THRESHOLD) for n in names]

        def probs(p):  # the posteriors a device's Detector scores with this head
            return EmbeddingHead(p).probs(X)[:, kw]

        if self._reference_counts is None or self._reference_counts[0] != start:
            ref = probs(self.params(start))
            self._reference_counts = (start, [count_events(ref[:, k], ref_thr[k], ends) for k in range(len(kw))])
        thr = matched(probs(params), ends, self._reference_counts[1], names)
        # words without negatives keep the base bundle's own threshold (its operating point, if any)
        return {"thresholds": {**own, **{n: float(t) for n, t in thr.items()}}, "matched_to_version": start,
                "reference_threshold": dict(zip(names, ref_thr)), "negative_hours": round(hours, 4),
                "reference_events": dict(zip(names, self._reference_counts[1]))}

    def _labels(self) -> list[str]:
        return list(json.loads((self._base() / "manifest.json").read_text())["labels"])

    def start_version(self) -> int:
        """The first version this aggregator published (where federation started)."""
        row = self.store.one("SELECT MIN(version) FROM models WHERE status='published'")
        return int(row[0]) if row and row[0] is not None else self.current

    def check(self, new: dict, tolerance: float, metric: str = "accuracy",
              against: str = "current") -> tuple[bool, float | None, float | None]:
        """(publish?, new score, reference score) on the held-out set (``accuracy``'s ``metric``),
        the reference being the current version or (``against="start"``) the first published one;
        always True without a held-out set. With ``groups`` in the held-out set (e.g. voice
        families), every group must be within ``tolerance`` of its own reference score, so a gain on
        the many rows of one group cannot hide a loss on the few of another; the scores returned are
        then those of the group that fell the most."""
        if self.heldout is None:
            return True, None, None
        old = self.params(self.start_version() if against == "start" else None)
        if self.groups is None:
            ref, acc = self.accuracy(old, metric), self.accuracy(new, metric)
            return acc >= ref - tolerance, acc, ref
        pairs = [(self.accuracy(new, metric, self.groups == g), self.accuracy(old, metric, self.groups == g))
                 for g in np.unique(self.groups)]
        acc, ref = min(pairs, key=lambda p: p[0] - p[1])
        return acc >= ref - tolerance, acc, ref

    # --- building ---------------------------------------------------------
    def _build(self, version: int, params: dict, note: dict) -> None:
        from host.bundle import build_bundle, zip_bundle

        if self.signing_key is None:
            raise EdgelearnError("the aggregator has no signing key", fix="pass --signing-key to `edgelearn aggregator`")
        base = self._base()
        manifest = json.loads((base / "manifest.json").read_text())
        head = self.dir / "models" / f"v{version}.npz"
        files = {n: base / n for n in manifest["files"] if n not in _BASE_EXCLUDE}
        files[HEAD_FILE] = head
        m = {k: v for k, v in manifest.items() if k not in ("files", "created_utc", "format", "format_version")}
        m["version"] = version
        if {"proj.w", "classifier.w"} <= set(params):
            # The same tail as ONNX, so the serving shim can answer for this version (split
            # endpoint). MCU models (proto/bias) have no such tail and skip it.
            from host.aggregator.head_onnx import PARTITION, write_head_onnx

            onnx_path = self.dir / "models" / f"v{version}.onnx"
            with atomic_path(onnx_path, mode=None) as tmp:  # public, as published versions are
                part = write_head_onnx(params, tmp)
            files[HEAD_ONNX] = onnx_path
            part["file"] = HEAD_ONNX
            m["partitions"] = [p for p in manifest.get("partitions", []) if p.get("name") != PARTITION] + [part]
        m["trainable"] = {**manifest.get("trainable", {}), "strategy": "federated-head", "file": HEAD_FILE,
                          "tensors": sorted(params)}
        m["extra"] = {**manifest.get("extra", {}), "fl": note}
        m["extra"].pop("rehearsal", None)
        rehearsal = self._local(REHEARSAL_FILE)
        if rehearsal.exists():  # every version carries the operator's rehearsal set (init_state's)
            files[REHEARSAL_FILE] = rehearsal
            with np.load(rehearsal) as z:
                m["extra"]["rehearsal"] = {"file": REHEARSAL_FILE, "rows": int(len(z["y"]))}
        op = self.operating(params, version)
        if op is not None:  # edge.device reads it: the version's default thresholds
            m["extra"]["operating"] = op
        out = self.dir / "bundles" / f"v{version}"
        build_bundle(out, files, m, self.signing_key)
        zip_bundle(out, self.zip_path(version))
        self._share(f"bundles/v{version}.zip")

    def _write(self, version: int, params: dict, state: dict | None) -> None:
        atomic_write(self.dir / "models" / f"v{version}.npz", params_bytes(params))
        self._share(f"models/v{version}.npz")
        if state:
            atomic_write(self.dir / "models" / f"v{version}.state.npz", params_bytes(state))
            self._share(f"models/v{version}.state.npz")

    def init_from_bundle(self, bundle_dir, params: dict, metric: str = "accuracy") -> int:
        """Version base+1 = the base bundle with its head as ``head.npz`` (the federated starting point);
        its held-out score recorded by ``metric`` (the config's ``eval_metric``)."""
        base = Path(bundle_dir).resolve()
        m = json.loads((base / "manifest.json").read_text())
        version = int(m["version"]) + 1
        with self.store.tx():
            self.store.set_meta("base_bundle", str(base))
            self.store.set_meta("model_id", m["model_id"])
            if self.shared:  # replicas on other machines build versions from these bytes
                for n in ["manifest.json"] + [n for n in m["files"] if n not in _BASE_EXCLUDE]:
                    self.store.put_file(f"base/{n}", (base / n).read_bytes())
        self._write(version, params, None)
        self._build(version, params, {"parent": m["version"], "round": None})
        with self.store.tx() as c:
            c.execute("INSERT INTO models(version, parent, round_id, status, accuracy, path, created) "
                      "VALUES(?,?,?,?,?,?,?)" + _REPLACE, (version, m["version"], None, "published",
                                                self.accuracy(params, metric), str(self.zip_path(version)),
                                                time.time()))
            self.store.set_meta("current_version", version)
        return version

    def publish(self, params: dict, round_id: int, accuracy, epsilon, state: dict | None) -> int:
        """Write files and bundle for version current+1; the caller commits the DB change (same tx)."""
        parent = self.current
        version = parent + 1
        self._write(version, params, state)
        self._build(version, params, {"parent": parent, "round": round_id, "heldout_accuracy": accuracy,
                                      "epsilon": epsilon})
        c = self.store.db
        c.execute("INSERT INTO models(version, parent, round_id, status, accuracy, epsilon, path, created) "
                  "VALUES(?,?,?,?,?,?,?,?)" + _REPLACE, (version, parent, round_id, "published", accuracy, epsilon,
                                              str(self.zip_path(version)), time.time()))
        self.store.set_meta("current_version", version)
        return version
