"""The verifier's phone model: its corpus rules (host/phones.py) and the shipped int8 model (edge/verify.py)."""

from __future__ import annotations

import numpy as np
import pytest

from host import phones as H


def test_vocabulary_leaves_out_every_word_the_fewshot_bench_speaks():
    from host.data.words import CUSTOM_PHRASES, FILLERS, NEAR_MISS, RUNS, SPEECH_COMMANDS

    words = set(H.WORDS_FILE.read_text().split())
    assert len(words) == 8000
    spoken = list(CUSTOM_PHRASES) + list(FILLERS) + list(SPEECH_COMMANDS) + RUNS
    spoken += [w for ws in NEAR_MISS.values() for w in ws]
    assert not words & {w for t in spoken for w in t.split()}
    assert not {w for w in words if "banana" in w or "computer" in w or "dolphin" in w}
    texts = H.texts()
    assert len(texts) == 8000 + H.N_PAIRS and texts == H.texts()  # seeded
    assert all(len(t.split()) == 2 for t in texts[8000:])


def test_phonemise_uses_the_voices_accent_and_folds_variants():
    us, gb = H.phonemise("en-us", ["banana", "bandana"]), H.phonemise("en-gb", ["banana"])
    assert us[0] != us[1] and "d" in us[1] and "d" not in us[0]
    assert us[0] != gb[0]  # en-us and en-gb say it differently, and the labels follow the voice
    for p in us[0] + us[1] + gb[0]:
        assert "'" not in p and "," not in p and p not in H.PHONE_MAP
    the, dog = H.phonemise("en-us", ["the", "dog"])
    assert H.phonemise("en-us", ["cat", "the dog"])[1] == the + dog


def test_inventory_drops_rare_phones():
    labels = ["a b"] * H.MIN_COUNT + ["a c"]
    assert H.inventory(labels) == ["a", "b"]


def test_phone_error_rate_greedy_ctc():
    n = 3  # phones 0..2, blank 3
    path = [3, 0, 0, 3, 1, 1, 1, 3, 3, 0]  # -> 0 1 0
    logits = np.full((1, len(path), n + 1), -5.0, np.float32)
    logits[0, np.arange(len(path)), path] = 5.0
    assert H.phone_error_rate(logits, np.array([[0, 1, 0, -1]])) == 0.0
    assert H.phone_error_rate(logits, np.array([[0, 2, 0, -1]])) == pytest.approx(1 / 3)
    assert H.phone_error_rate(logits, np.array([[0, 1, -1, -1]])) == pytest.approx(1 / 2)
    assert H._edit_distance([1, 2, 3], [1, 3]) == 1 and H._edit_distance([], [4, 4]) == 2


def test_export_gives_int8_posteriors_without_the_blank(tmp_path):
    pytest.importorskip("tensorflow")
    from edge.backends import dequantize, load, quantize

    model = H.build(4, channels=8)
    calib = np.random.default_rng(0).standard_normal((20, 49, 10)).astype(np.float32)
    H.export_int8(model, calib, tmp_path / "p.tflite")
    be = load(tmp_path / "p.tflite")
    assert be.inputs[0].dtype == np.int8 and be.outputs[0].dtype == np.int8
    p = dequantize(be.invoke(quantize(calib[:3], be.inputs[0]))[0], be.outputs[0])
    assert p.shape == (3, 49, 4)  # 4 phones, no blank
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=0.05)
