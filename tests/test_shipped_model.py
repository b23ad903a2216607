"""The shipped bundle: verifies, fits, runs the same on LiteRT, TFLite Micro and ONNX Runtime.

Clips are synthesised here with voices the model never trained on (Flite and
held-out espeak-ng voices), so no audio is stored in the repo.
"""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from edge import features as F
from edge.kws import DEFAULT_BUNDLE, REPO_KEYS, KeywordModel

pytestmark = pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(),
                                reason="models/kws-dscnn-s not built yet (make model)")

WORDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go", "seven", "marvin"]
VOICES = [("flite", "awb"), ("flite", "rms"), ("espeak", "en-us+m5"), ("espeak", "en-gb+f2")]  # test split


@pytest.fixture(scope="module")
def bundle():
    from edge.bundle import load_bundle

    return load_bundle(DEFAULT_BUNDLE, trusted_keys=REPO_KEYS)


@pytest.fixture(scope="module")
def clips():
    if shutil.which("flite") is None or shutil.which("espeak-ng") is None:
        pytest.skip("flite/espeak-ng not installed (scripts/bootstrap.sh installs them)")
    from host.data import noise as N
    from host.data.corpus import CorpusConfig, assign_splits
    from host.data.synth import Voice, all_voices, render

    split = assign_splits(all_voices(), CorpusConfig())
    assert all(split[f"{s}:{n}"] in ("test", "unseen") for s, n in VOICES), "pick held-out voices"
    rng = np.random.default_rng(0)
    xs, ys = [], []
    for synth, name in VOICES:
        for pcm, w in zip(render(Voice(synth, name), [(w, 1.0, 1.0) for w in WORDS]), WORDS):
            xs.append(N.place(rng, pcm))
            ys.append(w)
    return np.clip(np.stack(xs), -32768, 32767).astype(np.int16), ys


def test_manifest_matches_runtime(bundle):
    m = bundle.manifest
    assert m["model_id"] == "kws-dscnn-s" and len(m["labels"]) == 37
    for k, v in F.PARAMS.items():
        assert m["frontend"][k] == v
    assert len(m["frontend"]["normalize"]["scale"]) == 10
    assert bundle.path("encoder_int8.tflite").stat().st_size <= 64 * 1024
    assert "MODEL_CARD.md" in m["files"] and "negatives.npy" in m["files"]


def test_tflite_micro_equals_litert_within_one_lsb(bundle, clips):
    """LiteRT's built-in int8 kernels vs TFLite Micro's, on every output (XNNPACK off: it rounds differently)."""
    from edge.backends import load

    path = bundle.path("encoder_int8.tflite")
    lite = load(path, backend="litert", xnnpack=False)
    micro = load(path, backend="tflite_micro")
    km = KeywordModel(bundle, backend="litert")
    x = km.features(clips[0])[..., None]
    from edge.backends import quantize

    q = quantize(x, lite.inputs[0])
    for a, b in zip(lite.invoke(q), micro.invoke(q)):
        assert a.dtype == np.int8 and a.shape == b.shape
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


def test_hears_unseen_voices(bundle, clips):
    from host.data.words import label12

    km = KeywordModel(bundle, backend="litert")
    _, probs = km.infer(km.features(clips[0]))
    heard = [label12(km.labels[k]) for k in probs.argmax(1)]
    said = [label12(w) for w in clips[1]]
    acc = np.mean([h == s for h, s in zip(heard, said)])
    # A sanity floor far above chance (1/12); the measured figure is bench/quant_accuracy.
    assert acc >= 0.6, list(zip(said, heard))


def test_onnx_and_tflite_agree(bundle, clips):
    a = KeywordModel(bundle, backend="litert")
    b = KeywordModel(bundle, backend="onnxruntime")
    feats = a.features(clips[0])
    pa, pb = a.infer(feats)[1], b.infer(feats)[1]
    assert (pa.argmax(1) == pb.argmax(1)).mean() >= 0.9
    ea, eb = a.infer(feats)[0], b.infer(feats)[0]
    cos = (ea * eb).sum(1) / (np.linalg.norm(ea, axis=1) * np.linalg.norm(eb, axis=1) + 1e-9)
    assert cos.min() > 0.95


def test_spot_cli_and_tampered_bundle(tmp_path, clips):
    from edge.audio import write_wav

    wav = write_wav(tmp_path / "yes.wav", clips[0][0])
    res = subprocess.run([sys.executable, "-m", "edge.cli", "spot", str(wav), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["label"] in json.loads((DEFAULT_BUNDLE / "manifest.json").read_text())["labels"]

    bad = tmp_path / "bundle"
    shutil.copytree(DEFAULT_BUNDLE, bad)
    blob = bytearray((bad / "encoder_int8.tflite").read_bytes())
    blob[1000] ^= 1
    (bad / "encoder_int8.tflite").write_bytes(bytes(blob))
    res = subprocess.run([sys.executable, "-m", "edge.cli", "spot", str(wav), "--bundle", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "encoder_int8.tflite" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_demo_runs_end_to_end(clips):
    """The README's main command: verify, synthesise held-out voices, spot on two runtimes."""
    # The fleet stage needs the rendered corpus (minutes on a fresh machine); host/fleet has its own tests.
    res = subprocess.run([sys.executable, "-m", "edge.cli", "demo", "--no-fleet"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "signature and" in res.stdout and "heard right on the 12-class task" in res.stdout
    assert "cloud fallback:" in res.stdout and "answered" in res.stdout
    assert res.stdout.count("LiteRT int8") == 1 and len([l for l in res.stdout.splitlines()
                                                         if l.endswith(("ok", "miss"))]) == 8


def test_a_device_on_onnxruntime_enrols_detects_and_adapts(tmp_path):
    """`--backend onnxruntime` picks the encoder's ONNX partition; the models the bundle ships only
    as .tflite (backbone, phone model) run on the TFLite interpreter beside it, so every device
    command works (detection and adaptation failed with 'onnxruntime cannot load
    backbone_int8.tflite'), and hears what LiteRT hears."""
    pytest.importorskip("onnxruntime")
    sys.path.insert(0, str(DEFAULT_BUNDLE.parents[2] / "tests"))
    from devstate_helpers import make_data, make_keyword_clips

    from edge.audio import read_wav
    from edge.device import Device

    clips = make_keyword_clips(tmp_path / "kw")
    kw = read_wav(clips[0])
    quiet = np.zeros(16000, np.int16)
    pcm = np.concatenate([quiet, kw, quiet, quiet, kw, quiet])
    heard = {}
    for backend in ("litert", "onnxruntime"):
        dev = Device(tmp_path / backend, backend=backend)
        dev.enroll("buzz word", clips)
        heard[backend] = [e["keyword"] for e in dev.detect(pcm, replay=False)]
    assert heard["onnxruntime"] == heard["litert"] == ["buzz word"] * 2
    res = Device(tmp_path / "onnxruntime", backend="onnxruntime").adapt(make_data(tmp_path / "data"), steps=2,
                                                                        force=True)
    assert res["status"] == "done", res
