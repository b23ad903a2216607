"""Which model a device's detection runs on its bundle and state directory, and what its status
reports of it.

The verified bundle (``open_bundle``); the model and head detection runs (``detection_models``: the
bundle's encoder, an adapted context's conv tail or embedding head over it, ``base_models`` with
nothing adapted); a federated version's trained head and published operating point (``is_federated``,
``head_params``, ``version_thresholds``); what a calibration holds for (``calibrated_for``); what
``Device.status`` reports (``detection_info``, ``verifier_status``). Functions of a bundle and a
state directory that only read; ``edge.device.Device`` calls them, and they stay importable from
``edge.device``, where the agent, the benches and the tests import them.

    >>> km, head = detection_models(open_bundle(), "state/")   # head: None unless an embedding head runs
    >>> detection_info(bundle, "state/")["context"]
"""

from __future__ import annotations

from pathlib import Path

from edge.errors import EdgelearnError


def open_bundle(bundle=None, trusted_keys=None, state_dir=None):
    """A verified bundle: ``bundle`` itself when it is one already, else the directory or .zip at
    that path or the shipped bundle of that name (``edge.kws.named_bundle``; a store's ``current`` file
    or its directory: the version it names), checked against
    ``trusted_keys`` plus the shipped release keys (None: the device's default keys; both via
    ``edge.kws.resolve_trusted_keys``, so the shipped base model always verifies). None: with
    ``state_dir``, the federated version the agent installed and runs there (``installed_version``),
    else the shipped model. With ``state_dir``, a path naming another version of the model the state's
    keywords are bound to, with the same encoder, is refused in a sentence naming the installed one."""
    if bundle is not None and hasattr(bundle, "manifest"):
        return bundle
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, named_bundle, resolve_trusted_keys

    keys = resolve_trusted_keys(trusted_keys)
    if bundle is None:
        installed = None if state_dir is None else installed_version(state_dir, keys)
        return installed if installed is not None else load_bundle(DEFAULT_BUNDLE, trusted_keys=keys)
    given = named_bundle(bundle)  # a shipped bundle's name (kws-dscnn-s) works as in spot and serve
    path = _store_bundle(given)
    b = _verified(path, keys) if path != given else load_bundle(path, trusted_keys=keys)
    if state_dir is not None:
        _check_bound(b, given, state_dir)
    return b


# -- the federated version a state runs (the agent's store: edge.agent_versions.FL_DIR) ------------------

def fl_store_dir(state_dir) -> Path:
    """Where the agent's federated client installs versions (``edge.store.BundleStore``)."""
    return Path(state_dir) / "fl" / "store"


def _version_of(dirname):
    """The version in a store directory name ``<model_id>-v<version>`` (None: not one)."""
    import re

    m = re.fullmatch(r".+-v(\d{1,9})", dirname or "")
    return int(m.group(1)) if m else None


def _bound_to(state_dir):
    """(model_id, version) the state's enrolled keywords are bound to (``keywords.json``), or None."""
    import json

    try:
        with open(Path(state_dir) / "keywords.json", "rb") as f:
            data = json.loads(f.read(64 << 20))
        mid, ver = data.get("model_id"), data.get("model_version")
    except (OSError, ValueError, AttributeError):
        return None
    ok = isinstance(mid, str) and isinstance(ver, int) and not isinstance(ver, bool)
    return (mid, ver) if ok else None


def installed_name(state_dir):
    """The store directory (under ``fl/store/bundles``) of the federated version detection runs in
    ``state_dir``, or None (none installed: the shipped model). What the agent opens on
    (``Agent._open_device``): the store's current version when the agent ran it (``fl_version`` in
    ``agent.json``) or the enrolled keywords are bound to it, else the previous one when the agent
    ran that; never one the health check rejected (one installed but not yet checked is not used)."""
    from edge.agent import read_status
    from edge.store import read_pointer

    store = fl_store_dir(state_dir)
    if not (store / "current").is_file():
        return None
    ptr = read_pointer(store / "current")
    rec = read_status(state_dir) or {}
    ran = rec.get("fl_version")
    ran = ran if isinstance(ran, int) and not isinstance(ran, bool) else None
    rejected = rec.get("rejected") if isinstance(rec.get("rejected"), list) else []
    bound = _bound_to(state_dir)
    cur, prev = ptr["current"], ptr["previous"]
    v = _version_of(cur)
    if v is not None and v not in rejected and (v == ran or (bound is not None and cur == f"{bound[0]}-v{bound[1]}")):
        return cur
    v = _version_of(prev)
    if v is not None and v not in rejected and v == ran:
        return prev
    return None


def installed_version(state_dir, trusted_keys):
    """The verified federated version detection runs in ``state_dir`` (``installed_name``), or None."""
    name = installed_name(state_dir)
    return None if name is None else _verified(fl_store_dir(state_dir) / "bundles" / name, trusted_keys)


def _verified(path: Path, keys):
    """A bundle of the agent's store, verified as the agent verified it: one that does not verify with
    ``keys`` is an error naming it (the agent may run with keys these commands were not given)."""
    from edge.bundle import load_bundle

    try:
        return load_bundle(path, trusted_keys=keys)
    except EdgelearnError as e:
        raise EdgelearnError(f"the federated version installed at {path} does not verify with the trusted keys "
                             f"{', '.join(map(str, keys)) if isinstance(keys, (list, tuple)) else keys} ({e.problem})",
                             fix="pass --pubkey with the keys the agent runs with (the release key and the "
                                 "federation's signing key, e.g. /etc/edgelearn/keys), or pass --bundle to use another "
                                 "bundle") from None


def _store_bundle(path: Path) -> Path:
    """A store's ``current`` file (or the store directory holding it) as the bundle directory it names;
    any other path as it is."""
    from edge.store import read_pointer

    ptr_file = path / "current" if path.is_dir() and not (path / "manifest.json").exists() else path
    if ptr_file.name != "current" or not ptr_file.is_file() or not (ptr_file.parent / "bundles").is_dir():
        return path
    name = read_pointer(ptr_file)["current"]
    if name is None:
        raise EdgelearnError(f"the bundle store {ptr_file.parent} has no current version",
                             fix="leave out --bundle (the shipped model), or pass a bundle directory or .zip")
    return ptr_file.parent / "bundles" / name


def _check_bound(bundle, given: Path, state_dir) -> None:
    """Refuse ``--bundle`` naming another version of the model whose installed federated version the
    state's keywords are bound to, when that version has the same encoder (the keywords would score;
    the head differs): one sentence naming the installed version's path."""
    import json
    from types import SimpleNamespace

    from edge.device_enrolment import ENROLMENT_FILES, _basis

    bound = _bound_to(state_dir)
    if bound is None or bound[0] != bundle.model_id or bound[1] == bundle.version:
        return
    inst = fl_store_dir(state_dir) / "bundles" / f"{bound[0]}-v{bound[1]}"
    try:
        manifest = json.loads((inst / "manifest.json").read_bytes()[: 1 << 20])
        same = _basis(SimpleNamespace(manifest=manifest), ENROLMENT_FILES) == _basis(bundle, ENROLMENT_FILES)
    except (OSError, ValueError, AttributeError):
        return  # not installed here (or unreadable): the keywords' own check says what is wrong
    if same:
        raise EdgelearnError(f"state directory {state_dir} runs {bound[0]} v{bound[1]}, the federated version "
                             f"installed at {inst} (the same encoder as --bundle {given}, {bundle.model_id} "
                             f"v{bundle.version}, with another head)",
                             fix=f"leave out --bundle (the installed version is the default), or pass --bundle {inst}")


def detection_models(bundle, state_dir, backend: str = "auto", adapted_from=None):
    """(model, head) detection runs in ``state_dir``: the bundle's encoder when no adapted context is
    active; backbone + the active context's conv tail (``edge.adapt.TailModel``) for a conv-tail
    context; the encoder + the adapted embedding head (``edge.adapt.EmbeddingHead``) for an embedding-head one
    (``edge.adapt.delta.delta_kind`` tells them apart: it replaces a test of the key prefixes
    ``proj.``/``classifier.``, which agrees on every delta ``device adapt`` writes; a head delta of
    adapter factors alone, ``adapter.a``/``adapter.b``, was taken for a conv tail, which ignored
    it, and now runs as the head it is). On a federated version the conv tail ends in the version's
    head (``edge.adapt.load_tail``); a context adapted against another head runs rebased onto this
    one until it is adapted again on it (``AdaptStore.load_carried``, ``detection_info``).
    ``adapted_from``: the bundle the contexts are bound to now (the running version): what detection
    would run on ``bundle`` once ``Device.carry_to`` moved them, before anything moves (the agent's
    health check of a new version); a pointer already moved to ``bundle`` is read as it is."""
    from edge.adapt.delta import CONV_TAIL, EMBEDDING_HEAD, delta_kind
    from edge.adapt.store import AdaptStore
    from edge.kws import KeywordModel

    store = None
    if adapted_from is not None:
        try:
            store = AdaptStore(state_dir, adapted_from)
        except EdgelearnError:
            pass  # bound to `bundle` already (a carry_to stopped between its writes), or unreadable: below
    delta, _ = (store or AdaptStore(state_dir, bundle)).load_carried(onto=bundle)
    kind = delta_kind(delta)
    if kind == EMBEDDING_HEAD:
        from edge.adapt import EmbeddingHead

        return KeywordModel(bundle, backend=backend), EmbeddingHead(head_params(bundle), delta)
    if kind == CONV_TAIL:
        from edge.adapt import TailModel

        return TailModel(bundle, delta, backend=backend), None
    return base_models(bundle, backend)


def is_federated(bundle) -> bool:
    """Whether ``bundle`` is a version a federation published: it carries the trained embedding head
    (``head.npz``, manifest ``trainable.strategy == "federated-head"``)."""
    return (bundle.manifest.get("trainable") or {}).get("strategy") == "federated-head"


def version_thresholds(bundle) -> dict | None:
    """The per-word thresholds a version was published with (manifest ``extra.operating.thresholds``:
    the shipped model's operating point, or a federated version's matched by the aggregator so it
    fires on keyword-free speech no more often than the model federation started from), or None
    (``edge.detect.bundle_thresholds``)."""
    from edge.detect import bundle_thresholds

    return bundle_thresholds(bundle.manifest)


def head_params(bundle) -> dict:
    """The embedding head a bundle scores with: a federated version's trained ``head.npz``, else the
    bundle's own classifier recovered on the embedding (``edge.adapt.classifier_from_bundle``)."""
    if is_federated(bundle):
        from edge.fl.model import load_head

        return load_head(bundle)
    from edge.adapt import classifier_from_bundle

    return classifier_from_bundle(bundle)


def base_models(bundle, backend: str = "auto"):
    """(model, head) of a bundle with nothing adapted: its encoder's own posteriors, or for a federated
    version the encoder's embedding through the head the federation trained (what the rounds improve)."""
    from edge.kws import KeywordModel

    km = KeywordModel(bundle, backend=backend)
    if is_federated(bundle):
        from edge.adapt import EmbeddingHead

        return km, EmbeddingHead(head_params(bundle))
    return km, None


def calibrated_for(bundle, state_dir) -> dict:
    """What a calibration holds for: the bundle's encoder and the active adapted context."""
    from edge.adapt.store import AdaptStore

    meta = AdaptStore(state_dir, bundle).meta
    active = meta.get("active")
    version = meta["contexts"][active].get("current") if active else None
    return {"model": bundle.model_id, "bundle_version": bundle.manifest.get("version"),
            "context": active, "context_version": version}


def detection_info(bundle, state_dir) -> dict:
    """Which model detection runs in ``state_dir`` (reads only): the bundle's version and whether it
    scores with a federated head; the active adapted context and its version; the version it was
    adapted on (``adapted_on``; None: before the record, on ``tail.npz``'s classifier) and
    ``rebased``: it was adapted against another head than this version's and runs carried onto it
    (``edge.adapt.delta.rebase``) until it is adapted again on this version."""
    from edge.adapt.delta import stale
    from edge.adapt.store import AdaptStore

    out = {"version": bundle.version, "federated_head": is_federated(bundle), "context": None,
           "context_version": None, "adapted_on": None, "rebased": False}
    try:
        store = AdaptStore(state_dir, bundle)
        active = store.meta.get("active")
        delta, info = store.load_with_info(active) if active else ({}, {})
    except EdgelearnError as e:
        return {**out, "error": str(e)}
    if not delta:
        return out
    rec = info.get("trained_on") if isinstance(info.get("trained_on"), dict) else {}
    return {**out, "context": active, "context_version": store.current(active),
            "adapted_on": rec.get("version") if isinstance(rec.get("version"), int) else None,
            "rebased": stale(info, bundle)}


def embedding_dim(km) -> int:
    """The size of the embedding custom keywords score (one inference on silence)."""
    import numpy as np

    return int(km.infer(np.zeros((1, 49, 10), np.float32))[0].shape[-1])


def verifier_status(keywords: list[dict], bundle) -> dict:
    """{keyword: {"version": V, "current": bool} or None (no second stage)} for enrolled keyword
    entries: the second stage each was enrolled with, and whether it is the one this bundle enrols
    now (``edge.verify.version_for``). Older versions keep working; re-enrolling (``replace``)
    moves a keyword to the current verifier (docs/edge-runtime.md)."""
    from edge.verify import version_for

    current = version_for(bundle)
    versions = {k["name"]: k["verify"].get("version", 1) if "verify" in k else None for k in keywords}
    return {n: None if v is None else {"version": v, "current": v == current} for n, v in versions.items()}
