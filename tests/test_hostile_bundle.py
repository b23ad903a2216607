"""Hostile bundles: authenticated before parsed, and labels that match the model.

* A manifest is parsed only after its signature (or device MAC) over the raw bytes has
  verified, so an unsigned manifest.json of deeply nested JSON is one BundleError in
  `bundle verify`, `spot`, `device detect`, `serve` and `BundleStore.install`.
* A signed manifest of any shape loads or is one BundleError; a loaded bundle makes a
  KeywordModel or one EdgelearnError; a KeywordModel classifies to one of its labels.
* `bundle sign` refuses labels that do not match the model's output size, and so does
  loading (for a manifest signed some other way).
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import edge.bundle as eb
from edge.audio import write_wav
from edge.bundle import MAC, MANIFEST, SIGNATURE, check_contents, load_bundle
from edge.errors import BundleError, EdgelearnError
from edge.keys import load_hmac_key, mac_text
from edge.kws import DEFAULT_BUNDLE, KeywordModel
from edge.store import BundleStore
from host import bundle as hb
from host.keys import generate_device_key, generate_keypair, sign_manifest_bytes

NESTED = b"[" * 100_000 + b"]" * 100_000  # 200 kB: under the 1 MiB cap, far over any recursion limit
PROPS = settings(max_examples=int(os.environ.get("EDGELEARN_HOSTILE_EXAMPLES", 100)), deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    priv, pub = generate_keypair(d)
    other, _ = generate_keypair(d, name="other")
    return {"priv": priv, "pub": pub, "other": other, "device": generate_device_key(d)}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, keys):
    """The shipped bundle, copied and re-signed with the test key (the original stays untouched)."""
    d = tmp_path_factory.mktemp("shipped") / "kws"
    shutil.copytree(DEFAULT_BUNDLE, d)
    sign(d, (d / MANIFEST).read_bytes(), keys["priv"])
    return d


def sign(d: Path, raw: bytes, priv) -> None:
    (d / MANIFEST).write_bytes(raw)
    (d / SIGNATURE).write_text(sign_manifest_bytes(raw, priv))


def one_line(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- parsed only after authentication ------------------------------------------------------------

@pytest.mark.parametrize("sig", ["stale", "absent"])
def test_nested_unsigned_manifest_is_refused_everywhere(shipped, keys, tmp_path, capsys, sig):
    from edge.cli import main

    b = copy(shipped, tmp_path / "b")
    (b / MANIFEST).write_bytes(NESTED)
    if sig == "absent":
        (b / SIGNATURE).unlink()
    want = "signature does not match" if sig == "stale" else "missing, the bundle is unsigned"
    with zipfile.ZipFile(tmp_path / "b.zip", "w") as zf:
        for p in sorted(b.iterdir()):
            zf.write(p, p.name)
    for path in (b, tmp_path / "b.zip"):
        with pytest.raises(BundleError, match=want):
            load_bundle(path, trusted_keys=keys["pub"])
        with pytest.raises(BundleError, match="manifest.mac: missing"):
            load_bundle(path, device_key=keys["device"])
        with pytest.raises(BundleError, match=want):
            BundleStore(tmp_path / "state", trusted_keys=keys["pub"]).install(path)
    wav = write_wav(tmp_path / "clip.wav", np.zeros(16000, np.int16))
    for argv in (["bundle", "verify", str(b), "--pubkey", str(keys["pub"])],
                 ["spot", str(wav), "--bundle", str(b), "--pubkey", str(keys["pub"])],
                 ["device", "detect", "--state", str(tmp_path / "st"), "--wav", str(wav), "--bundle", str(b),
                  "--pubkey", str(keys["pub"])],
                 ["serve", "--bundle", str(b), "--pubkey", str(keys["pub"])]):
        assert main(argv) == 2, argv
        assert want in one_line(capsys.readouterr().err), argv


def test_nested_manifest_is_one_error_even_when_not_authenticated(shipped, tmp_path):
    b = copy(shipped, tmp_path / "b")
    (b / MANIFEST).write_bytes(NESTED)
    (b / SIGNATURE).unlink()
    with pytest.raises(BundleError, match="manifest.json: not valid JSON"):
        check_contents(b)
    with pytest.warns(UserWarning, match="UNSIGNED"), pytest.raises(BundleError, match="not valid JSON"):
        load_bundle(b, allow_unsigned=True)


def test_nested_mac_authenticated_manifest_is_one_error(shipped, keys, tmp_path):
    """Authenticated garbage is still one sentence (a signer's mistake must not crash devices)."""
    b = copy(shipped, tmp_path / "b")
    sign(b, NESTED, keys["priv"])
    (b / MAC).write_text(mac_text(NESTED, load_hmac_key(keys["device"])))
    for kw in ({"trusted_keys": keys["pub"]}, {"device_key": keys["device"]}):
        with pytest.raises(BundleError, match="manifest.json: not valid JSON"):
            load_bundle(b, **kw)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=12)
manifest_blobs = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 300_000).map(lambda d: b"[" * d),
    st.integers(1, 100_000).map(lambda d: b'{"a":' * d + b"1" + b"}" * d),
    st.integers(1, 3 << 20).map(lambda n: b" " * n),  # up to 3 MiB: the size cap comes first
)


class _NoParse:
    """Stands in for the json module inside edge.bundle: counts every parse."""

    calls = 0

    def __getattr__(self, name):
        return getattr(json, name)

    def loads(self, *a, **kw):
        _NoParse.calls += 1
        return json.loads(*a, **kw)


@PROPS
@given(raw=manifest_blobs, sig=st.sampled_from(["absent", "stale", "garbage", "other key", "mac stale",
                                                 "mac absent"]))
def test_unauthenticated_manifests_are_never_parsed(shipped, keys, tmp_path, monkeypatch, raw, sig):
    b = tmp_path / "b"
    if not b.exists():
        copy(shipped, b)
        (b / MAC).write_text(mac_text((b / MANIFEST).read_bytes(), load_hmac_key(keys["device"])))
        monkeypatch.setattr(eb, "json", _NoParse())
    original_sig, original_mac = (b / SIGNATURE).read_bytes(), (b / MAC).read_bytes()
    (b / MANIFEST).write_bytes(raw)
    kw = {"trusted_keys": keys["pub"]}
    if sig == "absent":
        (b / SIGNATURE).unlink()
    elif sig == "garbage":
        (b / SIGNATURE).write_bytes(raw[:200])
    elif sig == "other key":
        (b / SIGNATURE).write_text(sign_manifest_bytes(raw, keys["other"]))
    elif sig.startswith("mac"):
        kw = {"device_key": keys["device"]}
        if sig == "mac absent":
            (b / MAC).unlink()
    _NoParse.calls = 0
    try:
        with pytest.raises(BundleError) as e:
            load_bundle(b, **kw)
        assert "\n" not in str(e.value)
        assert _NoParse.calls == 0, f"parsed before authenticating: {e.value}"
    finally:
        (b / SIGNATURE).write_bytes(original_sig)
        (b / MAC).write_bytes(original_mac)


# --- signed manifests of any shape -----------------------------------------------------------------

@pytest.fixture(scope="module")
def small(tmp_path_factory, keys):
    """A one-partition bundle around the shipped int8 encoder, and its manifest."""
    m = json.loads((DEFAULT_BUNDLE / MANIFEST).read_text())
    d = tmp_path_factory.mktemp("small") / "b"
    d.mkdir()
    shutil.copyfile(DEFAULT_BUNDLE / "encoder_int8.tflite", d / "encoder_int8.tflite")
    m = {k: m[k] for k in ("format", "format_version", "model_id", "version", "labels", "frontend")} | {
        "files": {"encoder_int8.tflite": m["files"]["encoder_int8.tflite"]},
        "partitions": [p for p in m["partitions"] if p["name"] == "encoder"],
        "extra": {"labels12": m["extra"]["labels12"]}}
    sign(d, hb.manifest_bytes(m), keys["priv"])
    return d, m


PATHS = [("format_version",), ("model_id",), ("version",), ("labels",), ("labels", 0), ("files",),
         ("files", "encoder_int8.tflite"), ("files", "encoder_int8.tflite", "bytes"), ("partitions",),
         ("partitions", 0), ("partitions", 0, "name"), ("partitions", 0, "file"), ("partitions", 0, "format"),
         ("partitions", 0, "placement"), ("partitions", 0, "role"), ("partitions", 0, "precision"),
         ("partitions", 0, "inputs"), ("partitions", 0, "outputs"), ("partitions", 0, "outputs", 0),
         ("partitions", 0, "outputs", 0, "role"), ("partitions", 0, "outputs", 0, "name"),
         ("partitions", 0, "outputs", 0, "shape"), ("partitions", 0, "outputs", 0, "shape", 1),
         ("partitions", 0, "outputs", 1, "role"), ("frontend",), ("frontend", "normalize"),
         ("frontend", "normalize", "scale"), ("frontend", "normalize", "scale", 0), ("frontend", "sample_rate"),
         ("frontend", "n_mfcc"), ("extra",), ("extra", "labels12"), ("created_utc",), ("target",),
         ("partitions", 0, "notes"), ("frontend", "comment"), ("extra", "notes")]
field_values = st.one_of(json_values, st.lists(st.text(max_size=6), max_size=40),
                         st.lists(st.integers(-3, 40), max_size=4),
                         st.lists(st.floats(-1e6, 1e6), min_size=0, max_size=12), st.just("DELETE"))


def mutate(m: dict, path: tuple, value):
    node = m
    for k in path[:-1]:
        try:
            node = node[k]
        except (KeyError, IndexError, TypeError):
            return
    try:
        if value == "DELETE":
            del node[path[-1]]
        else:
            node[path[-1]] = value
    except (KeyError, IndexError, TypeError):
        pass


@PROPS
@given(st.lists(st.tuples(st.sampled_from(PATHS), field_values), min_size=1, max_size=3))
def test_signed_manifests_of_any_shape_load_or_give_one_error(small, keys, tmp_path, edits):
    d, base = small
    m = json.loads(json.dumps(base))
    for path, value in edits:
        mutate(m, path, value)
    b = tmp_path / "b"
    if not b.exists():
        copy(d, b)
    sign(b, json.dumps(m).encode(), keys["priv"])
    try:
        bundle = load_bundle(b, trusted_keys=keys["pub"])
    except BundleError as e:
        assert "\n" not in str(e)
        event(f"refused by load_bundle: {e.problem.split(':')[0]}")
        return
    try:
        km = KeywordModel(bundle, backend="auto")
    except EdgelearnError as e:
        assert "\n" not in str(e)
        event("loaded, refused by KeywordModel")
        return
    label, p = km.classify(np.zeros(16000, np.int16))
    assert label in bundle.labels
    event("loaded and classified")


# --- labels against the model's output size -------------------------------------------------------

def relabel(src: Path, dst: Path, labels, shape_too: bool = False) -> Path:
    b = copy(src, dst)
    m = json.loads((b / MANIFEST).read_text())
    m["labels"] = labels
    if shape_too:
        for p in m["partitions"]:
            for o in p.get("outputs", []):
                if o.get("role") == "probs":
                    o["shape"] = [-1, len(labels)]
    (b / MANIFEST).write_bytes(hb.manifest_bytes(m))
    return b


@pytest.mark.parametrize("labels", [[], ["yes", "no", "maybe"]])
@pytest.mark.parametrize("shape_too", [False, True], ids=["manifest-shape-37", "manifest-shape-edited"])
def test_sign_refuses_labels_that_do_not_match_the_model(shipped, keys, tmp_path, capsys, labels, shape_too):
    from edge.cli import main

    b = relabel(shipped, tmp_path / "b", labels, shape_too)
    before = (b / SIGNATURE).read_bytes()
    with pytest.raises(BundleError, match=rf"{len(labels)} labels.* 37 classes"):
        hb.sign_bundle(b, keys["priv"])
    assert main(["bundle", "sign", str(b), "--key", str(keys["priv"])]) == 2
    assert "labels" in one_line(capsys.readouterr().err)
    assert (b / SIGNATURE).read_bytes() == before  # nothing was signed
    files = {n: b / n for n in json.loads((b / MANIFEST).read_text())["files"]}
    m = json.loads((b / MANIFEST).read_text())
    with pytest.raises(BundleError, match="labels"):
        hb.build_bundle(tmp_path / "rebuilt", files, {k: v for k, v in m.items() if k != "files"}, keys["priv"])
    assert not (tmp_path / "rebuilt").exists()


@pytest.mark.parametrize("labels", [[], ["yes", "no", "maybe"]])
def test_load_refuses_signed_labels_that_do_not_match_the_manifest(shipped, keys, tmp_path, capsys, labels):
    from edge.cli import main

    b = relabel(shipped, tmp_path / "b", labels)
    sign(b, (b / MANIFEST).read_bytes(), keys["priv"])  # signed without `bundle sign`'s checks
    with pytest.raises(BundleError, match=rf"{len(labels)} labels.* 37 classes"):
        load_bundle(b, trusted_keys=keys["pub"])
    assert main(["bundle", "verify", str(b), "--pubkey", str(keys["pub"])]) == 2
    assert "labels" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("labels", [[], ["yes", "no", "maybe"]])
def test_load_refuses_labels_that_do_not_match_the_model_itself(shipped, keys, tmp_path, capsys, labels):
    """The manifest's declared shapes agree with its labels, the model does not: spot and detect
    refuse with one sentence (they died with IndexError)."""
    from edge.cli import main

    b = relabel(shipped, tmp_path / "b", labels, shape_too=True)
    sign(b, (b / MANIFEST).read_bytes(), keys["priv"])
    bundle = load_bundle(b, trusted_keys=keys["pub"])
    for backend in ("litert", "onnxruntime"):
        with pytest.raises(BundleError, match=rf"{len(labels)} labels.* 37 classes"):
            KeywordModel(bundle, backend=backend)
    wav = write_wav(tmp_path / "clip.wav", (np.random.default_rng(0).standard_normal(16000) * 3000).astype(np.int16))
    for argv in (["spot", str(wav), "--bundle", str(b), "--pubkey", str(keys["pub"])],
                 ["device", "detect", "--state", str(tmp_path / "st"), "--wav", str(wav), "--bundle", str(b),
                  "--pubkey", str(keys["pub"]), "--no-replay"]):
        assert main(argv) == 2, argv
        assert "labels" in one_line(capsys.readouterr().err)


def test_shipped_bundle_still_verifies_and_runs(keys):
    from edge.kws import default_trusted_keys

    b = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    assert len(b.labels) == 37
    assert KeywordModel(b).classify(np.zeros(16000, np.int16))[0] in b.labels


# --- the device store's own files ---------------------------------------------------------------

@PROPS
@given(st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                 st.integers(1, 100_000).map(lambda d: b"[" * d),
                 st.fixed_dictionaries({"current": json_values, "previous": json_values}).map(
                     lambda v: json.dumps(v).encode())))
def test_store_pointer_of_any_content_reads_or_gives_one_error(keys, tmp_path, raw):
    state = tmp_path / "state"
    store = BundleStore(state, trusted_keys=keys["pub"])
    store.pointer_path.write_bytes(raw)
    try:
        ptr = store.pointer()
    except BundleError as e:
        assert "current" in str(e) and "\n" not in str(e)
        return
    for v in ptr.values():
        assert v is None or (isinstance(v, str) and "/" not in v and not v.startswith("."))
    try:
        assert store.current() is None or ptr["current"] is not None
    except BundleError:
        pass


def test_install_replaces_a_current_bundle_whose_manifest_is_garbage(shipped, keys, tmp_path):
    store = BundleStore(tmp_path / "state", trusted_keys=keys["pub"])
    store.install(shipped)
    cur = store.pointer()["current"]
    (store.bundles_dir / cur / MANIFEST).write_bytes(NESTED)
    with pytest.raises(BundleError, match="not valid JSON|signature"):
        store.current()
    newer = copy(shipped, tmp_path / "newer")
    m = json.loads((newer / MANIFEST).read_text())
    m["version"] += 1
    sign(newer, hb.manifest_bytes(m), keys["priv"])
    assert store.install(newer).version == m["version"]
