"""`edgelearn export esphome`: the model is in micro_wake_word's format and streams like its reference.

A tiny model (two "phrase" clips of tone bursts, noise negatives, two epochs, no corpus) is trained
once per module; the checks are about the format, not accuracy: int8 [1, 3, 40] input with
ESPHome's fixed quantisation, uint8 [1, 1] output, state in resource variables, only ops
micro_wake_word registers, the v2 manifest, TFLite Micro running it in the manifest's arena, the
streaming model equal to the non-streaming one, and pymicro-wakeword loading it (when .venv-mww is
there). Bad input is one sentence and exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("pymicro_features")
pytest.importorskip("tflite_micro")

from edge.audio import write_wav  # noqa: E402
from host.export import esphome as E  # noqa: E402
from host.export import frontend as FE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MWW_PY = ROOT / ".venv-mww" / "bin" / "python"


def _mww_ready() -> bool:
    return MWW_PY.is_file() and subprocess.run([str(MWW_PY), "-c", "import pymicro_wakeword"],
                                               capture_output=True).returncode == 0


def _phrase(rng, f0: float) -> np.ndarray:
    """A stand-in for a spoken phrase: two tone bursts with a gap (no synthesizer needed)."""
    sr = FE.SAMPLE_RATE
    t = np.arange(int(0.25 * sr)) / sr
    a = np.sin(2 * np.pi * f0 * t) * np.hanning(len(t))
    b = np.sin(2 * np.pi * 1.6 * f0 * t) * np.hanning(len(t))
    x = np.concatenate([a, np.zeros(int(0.1 * sr)), b]) * 8000 + rng.normal(0, 50, len(t) * 2 + int(0.1 * sr))
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    rng = np.random.default_rng(0)
    out = tmp_path_factory.mktemp("esphome")
    clips = [_phrase(rng, f) for f in (400, 420, 440, 460, 480)]
    cfg = E.ExportConfig(user_copies=6, noise_contexts=40, epochs=8, batch=32, log=lambda m: None)
    res = E.export_esphome("hey tone", None, out, cfg, corpus=None, clips=clips)
    return {"res": res, "clips": clips, "out": out, "cfg": cfg}


def test_model_format_matches_micro_wake_word(export):
    data = export["res"].model_path.read_bytes()
    info = E.check_format(data)
    assert info["input_shape"] == [1, E.STRIDE, 40] and info["input_dtype"] == "int8"
    scale, zp = info["input_quantization"]
    assert zp == -128 and abs(scale - 26 / 255) < 1e-6       # ESPHome's fixed feature quantisation
    assert info["output_shape"] == [1, 1] and info["output_dtype"] == "uint8"
    assert info["output_quantization"] == (1 / 256, 0)
    assert E.STREAMING_OPS <= set(info["ops"])               # state in resource variables
    assert set(info["ops"]) <= E.MWW_OPS
    assert "DEQUANTIZE" not in info["ops"]                   # int8 variables, no float state


def test_registered_ops_are_esphome_s():
    # esphome/components/micro_wake_word/streaming_model.cpp, StreamingModel::register_streaming_ops_
    assert len(E.MWW_OPS) == 20
    assert {"CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "SPLIT_V"} <= E.MWW_OPS
    assert "DEQUANTIZE" not in E.MWW_OPS and "EXPAND_DIMS" not in E.MWW_OPS


def test_check_format_rejects_a_foreign_op():
    import tensorflow as tf

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 3, 40], tf.float32)])
        def __call__(self, x):
            return tf.reshape(tf.reduce_max(tf.exp(x), axis=[1, 2]), [1, 1])
    conv = tf.lite.TFLiteConverter.from_concrete_functions([M().__call__.get_concrete_function()])
    with pytest.raises(RuntimeError, match="not a micro_wake_word model"):
        E.check_format(conv.convert())


def test_manifest_fields(export):
    res = export["res"]
    man = json.loads(res.manifest_path.read_text())
    assert man == res.manifest
    assert man["type"] == "micro" and man["version"] == 2 and man["wake_word"] == "Hey Tone"
    assert man["author"] == "edgelearn" and man["trained_languages"] == ["en"]
    assert man["model"] == res.model_path.name == "hey_tone.tflite"
    assert (res.manifest_path.parent / man["model"]).is_file()
    micro = man["micro"]
    assert set(micro) == {"probability_cutoff", "sliding_window_size", "feature_step_size",
                          "tensor_arena_size", "minimum_esphome_version"}
    assert 0 < micro["probability_cutoff"] < 1 and micro["sliding_window_size"] == 5
    assert micro["feature_step_size"] == 10 and micro["minimum_esphome_version"] == "2024.7.0"
    assert res.arena_bytes <= micro["tensor_arena_size"] <= res.arena_bytes * 1.2


def _stream_feats(export, seed=1):
    rng = np.random.default_rng(seed)
    sr = FE.SAMPLE_RATE
    parts = [rng.normal(0, 100, sr).astype(np.float32)]
    for c in export["clips"][:2]:
        parts += [c, rng.normal(0, 100, sr).astype(np.float32)]
    pcm = np.clip(np.concatenate(parts), -32768, 32767).astype(np.int16)
    return FE.features(pcm)


def test_runs_in_tflite_micro_within_the_manifest_arena(export):
    res = export["res"]
    feats = _stream_feats(export)
    out = E.run_tflm(res.model_path, feats, res.manifest["micro"]["tensor_arena_size"])
    assert out.dtype == np.uint8 and len(out) == len(feats) // E.STRIDE
    assert len(set(out.tolist())) > 1                 # it reacts to its input


def test_streaming_model_tracks_the_non_streaming_reference(export):
    """The float streaming module equals the Keras model over whole windows; the int8 TFLite under
    TFLite Micro follows it within quantisation error."""
    import tensorflow as tf

    res, feats = export["res"], _stream_feats(export)
    model = res.keras_model
    ref = E.stream_probabilities(model, feats)
    mod = E.streaming_module(model)
    s = np.array([float(mod(tf.constant(feats[None, k * E.STRIDE:(k + 1) * E.STRIDE]))[0, 0])
                  for k in range(len(feats) // E.STRIDE)])
    first = (E.WINDOW - E.K1) // E.STRIDE + 1      # calls before the first whole window see zero state
    assert len(s) == len(ref) and s.std() > 1e-3
    assert np.allclose(s[first:], ref[first:], atol=1e-5)
    q = E.run_tflm(res.model_path, feats, res.manifest["micro"]["tensor_arena_size"]).astype(np.float32) / 256
    assert np.abs(q[first:] - s[first:]).max() < 0.08, np.abs(q[first:] - s[first:]).max()


def test_too_few_clips_unreadable_and_wrong_rate(tmp_path):
    rng = np.random.default_rng(0)
    good = []
    for i in range(5):
        good.append(write_wav(tmp_path / f"c{i}.wav", np.clip(_phrase(rng, 440), -32768, 32767).astype(np.int16)))
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF0000WAVEfmt nonsense")
    write_wav(tmp_path / "r8k.wav", np.zeros(8000, np.int16), rate=8000)
    cases = [(good[:3], "3 clip(s) of the phrase given, 5 or more are needed"),
             (good[:4] + [bad], "bad.wav"),
             (good[:4] + [tmp_path / "r8k.wav"], "r8k.wav"),
             (good[:4] + [tmp_path / "missing.wav"], "missing.wav: no such file")]
    for wavs, msg in cases:
        argv = ["export", "esphome", "--keyword", "hey tone", "--out", str(tmp_path / "o")]
        for w in wavs:
            argv += ["--wav", str(w)]
        r = subprocess.run([sys.executable, "-m", "edge.cli", *argv], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert msg in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(not _mww_ready(), reason="the reference venv .venv-mww is not set up: "
                    "`make .venv-mww/bin/python` (pip install pymicro-wakeword pymicro-features)")
def test_loads_and_runs_in_pymicro_wakeword(export):
    """The export's manifest and model, loaded by pymicro-wakeword's MicroWakeWord.from_config and fed
    by its own MicroWakeWordFeatures, in its own venv."""
    res = export["res"]
    rng = np.random.default_rng(3)
    wav = write_wav(export["out"] / "stream.wav", np.clip(np.concatenate(
        [rng.normal(0, 100, 16000), export["clips"][0], rng.normal(0, 100, 16000)]), -32768, 32767).astype(np.int16))
    code = r"""
import json, sys, wave
from pymicro_wakeword import MicroWakeWord, MicroWakeWordFeatures
mww = MicroWakeWord.from_config(sys.argv[1])
feats = MicroWakeWordFeatures()
with wave.open(sys.argv[2], "rb") as w:
    audio = w.readframes(w.getnframes())
probs = []
for i in range(0, len(audio), 2048):
    for f in feats.process_streaming(audio[i:i + 2048]):
        p = mww.process_streaming_prob(f)
        probs.append(p)
print(json.dumps({"stride": mww.stride, "cutoff": mww.probability_cutoff, "window": mww.sliding_window_size,
                  "wake_word": mww.wake_word, "n": len(probs), "max": max(probs),
                  "in": [float(mww.input_scale), int(mww.input_zero_point)], "out_dtype": str(mww.output_dtype)}))
"""
    r = subprocess.run([str(MWW_PY), "-c", code, str(res.manifest_path), str(wav)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["stride"] == E.STRIDE and got["window"] == 5 and got["wake_word"] == "Hey Tone"
    assert got["cutoff"] == res.manifest["micro"]["probability_cutoff"]
    assert got["n"] > 100 and 0.0 <= got["max"] <= 1.0
    assert got["in"][1] == -128 and abs(got["in"][0] - 26 / 255) < 1e-6 and "uint8" in got["out_dtype"]


def test_telephone_band_removes_the_top_band():
    sr = FE.SAMPLE_RATE
    t = np.arange(sr) / sr
    x = (np.sin(2 * np.pi * 1000 * t) + np.sin(2 * np.pi * 6000 * t)).astype(np.float32) * 8000
    y = E.telephone_band(x)
    spec = np.abs(np.fft.rfft(y)) / len(y)
    assert len(y) == len(x) and y.dtype == np.float32
    assert spec[1000] > 3000 and spec[6000] < 40          # 1 kHz kept, 6 kHz gone (bins are 1 Hz)


def test_real_speech_prompts_are_negatives_in_their_own_channel():
    rng = np.random.default_rng(3)
    clips = [_phrase(rng, f) for f in (400, 440, 480, 520, 560)]
    speech = [rng.normal(0, 3000, int(2.5 * FE.SAMPLE_RATE)).astype(np.float32) for _ in range(2)]
    cfg = E.ExportConfig(user_copies=1, noise_contexts=2, real_copies=2, real_hop=20, telephone=1.0,
                         log=lambda m: None)
    X, y, counts = E.build_training_set("hey tone", clips, None, cfg, real=speech)
    _X0, y0, c0 = E.build_training_set("hey tone", clips, None, cfg, real=None)
    assert c0["real_speech"] == 0 and counts["real_speech"] >= 2 * 2 * 5   # 2 copies of 2 prompts
    assert len(y) == len(y0) + counts["real_speech"]
    assert y.sum() == y0.sum() > 0                        # every real-speech window is a negative
    assert X.shape[1:] == (E.WINDOW, FE.CHANNELS)


def test_a_user_clips_halves_swapped_are_negatives_in_the_users_own_voice():
    """``user_swapped`` (session 52, off in the recipe): each augmented user clip also gives negatives
    of its two halves swapped, cut in the gap between its words: the same sounds in the wrong order."""
    from host.export.esphome_data import swapped

    rng = np.random.default_rng(4)
    x = _phrase(rng, 440)
    y = swapped(x)
    word, gap = int(0.25 * FE.SAMPLE_RATE), int(0.1 * FE.SAMPLE_RATE)
    cuts = [k for k in range(0, len(x), 160) if np.array_equal(y, np.concatenate([x[k:], x[:k]]))]
    assert len(cuts) == 1 and word <= cuts[0] <= word + gap        # cut in the gap: each word whole
    clips = [_phrase(rng, f) for f in (400, 440, 480, 520, 560)]
    cfg = E.ExportConfig(user_copies=2, noise_contexts=2, log=lambda m: None)
    _X0, y0, c0 = E.build_training_set("hey tone", clips, None, cfg)
    _X, y1, c1 = E.build_training_set("hey tone", clips, None, E.ExportConfig(
        user_copies=2, noise_contexts=2, user_swapped=3, log=lambda m: None))
    assert c0["swapped"] == 0 and c1["swapped"] == 3 * 2 * len(clips)
    assert len(y1) == len(y0) + c1["swapped"] and y1.sum() == y0.sum() > 0


def test_a_share_of_the_user_clips_is_placed_over_loud_babble(monkeypatch):
    """``user_babble`` (session 54, off in the recipe): that share of the user's augmented clips, and
    their scrambled and swapped negatives, over babble at ``user_babble_snr`` dB, every time;
    ``synth_babble`` the same for the synthetic voices' copies."""
    from host.export import esphome_data as D
    from host.export.esphome_audio import _background

    rng = np.random.default_rng(5)
    pool = [rng.normal(0, 1000, 8000).astype(np.float32) for _ in range(6)]
    for _ in range(20):
        noise = _background(rng, 16000, 100.0, pool, babble_snr=(5.0, 15.0))
        snr = 10 * np.log10(100.0 / float((noise ** 2).mean()))
        assert 4.9 <= snr <= 15.1
    seen = []

    def spy(rng, utt, pool, telephone=0.0, babble_snr=None, orig=D._positive_context):
        seen.append(babble_snr)
        return orig(rng, utt, pool, telephone, babble_snr)
    monkeypatch.setattr(D, "_positive_context", spy)
    clips = [_phrase(rng, f) for f in (400, 440, 480, 520, 560)]
    for share, want in ((0.0, {None}), (1.0, {(5.0, 15.0)})):
        seen.clear()
        E.build_training_set("hey tone", clips, None, E.ExportConfig(
            user_copies=3, noise_contexts=1, user_swapped=1, user_babble=share, log=lambda m: None))
        assert len(seen) == 3 * 3 * len(clips) and set(seen) == want   # each copy and its two negatives
    seen.clear()   # ``synth_babble``: the same for the synthetic voices' copies (here one "other voice")
    E.build_training_set("hey tone", clips, None, E.ExportConfig(
        user_copies=1, synth_copies=2, noise_contexts=1, synth_babble=1.0, log=lambda m: None),
        others=([clips[0]], []))
    assert seen == [(5.0, 15.0)] * 2 * 2 + [None] * 2 * len(clips)    # the synthetic copies come first


def test_real_speech_names_missing_packages_and_refuses_allison(monkeypatch, tmp_path):
    from edge.errors import EdgelearnError
    from host.data import realneg

    said = []
    monkeypatch.setattr(realneg, "SOUNDS", tmp_path)          # nothing installed
    cfg = E.ExportConfig(real_speech=("fr", "ru"), log=said.append)
    assert E.real_speech(cfg) == []
    assert len(said) == 1 and "apt-get install asterisk-core-sounds-fr-wav asterisk-core-sounds-ru-wav" in said[0]
    assert E.real_speech(E.ExportConfig(real_speech=(), log=said.append)) == [] and len(said) == 1
    with pytest.raises(EdgelearnError, match="Allison"):
        E.real_speech(E.ExportConfig(real_speech=("es",), log=said.append))
    with pytest.raises(EdgelearnError, match="'de' has no prompts"):
        E.real_speech(E.ExportConfig(real_speech=("de",), log=said.append))


def test_other_voices_say_the_phrase_and_the_corpus_words():
    import shutil

    from edge.errors import EdgelearnError

    assert E.other_voices("hey tone", E.ExportConfig()) == ([], [])      # off by default
    with pytest.raises(EdgelearnError, match="synth:name"):
        E.other_voices("hey tone", E.ExportConfig(other_voices=("kal16",)))
    if shutil.which("flite") is None:
        pytest.skip("flite is not installed (scripts/bootstrap.sh installs it)")
    cfg = E.ExportConfig(other_voices=("flite:kal16",), other_renders=2, other_words=1, log=lambda m: None)
    pos, words = E.other_voices("hey tone", cfg)
    assert len(pos) == 2 and len(words) == len(E._vocab("hey tone"))
    assert all(p.dtype == np.float32 and np.abs(p).max() > 100 for p in pos + words)
