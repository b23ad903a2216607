"""The federated task that improves the shipped model (issue 18): a device's examples
(``edge.fl.local.local_examples``: labelled + augmented + negatives + confident detections), the
task starting from the shipped head, and a few rounds of it over loopback moving the head."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from edge.bundle import load_bundle
from edge.device import Device
from edge.errors import EdgelearnError
from edge.fl.local import detected_examples, local_examples
from edge.fl.model import FederatedHeadTrainer, head_logits
from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys


@pytest.fixture(scope="module")
def bundle():
    return load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())


def _windows(n, seed, level=800.0):
    rng = np.random.default_rng(seed)
    t = np.arange(16000) / 16000
    out = []
    for i in range(n):
        f = rng.uniform(200, 1200)
        x = level * np.sin(2 * np.pi * f * t) * np.exp(-((t - 0.5) ** 2) / 0.02) + rng.standard_normal(16000) * 30
        out.append(np.clip(x, -32768, 32767).astype(np.int16))
    return np.stack(out)


def test_local_examples_assembles_labelled_augmented_negatives_and_detections(tmp_path, bundle):
    from edge.adapt import Backbone
    from edge.replay import TAIL_REPLAY, ReplayStore

    dev = Device(tmp_path / "state", bundle)
    km = dev.keyword_model()
    labels = list(bundle.labels)
    clips = _windows(4, 0)
    names = ["yes", "no", "_silence_", "_unknown_"]
    # what Device.detect's replay feeder keeps for a confirmed detection: the dequantised backbone output
    heard = _windows(3, 1)
    bb = Backbone(bundle)
    scale, zp = bb.qparams
    store = ReplayStore(dev.state_dir, dim=8000, max_bytes=1 << 20, name=TAIL_REPLAY)
    feats = km.features(heard)
    for q, w in zip(bb(feats), ("go", "stop", "go")):
        store.add((q.astype(np.float32) - zp) * scale, labels.index(w))
    store.flush()
    ambient = _windows(5, 2, level=300.0)
    X, y, src = local_examples(dev, (clips, names), augment=4, ambient=ambient, detail=True)
    counts = {k: int((src == k).sum()) for k in set(src)}
    assert counts == {"labelled": 4, "augmented": 2 * 3, "ambient": 5, "detected": 3}
    assert X.shape == (len(y), 64) and X.dtype == np.float32 and np.isfinite(X).all()
    assert sorted(y[src == "detected"].tolist()) == sorted([labels.index("go")] * 2 + [labels.index("stop")])
    assert (y[src == "ambient"] == labels.index("_unknown_")).all()
    assert {labels[k] for k in y[src == "labelled"]} == set(names)
    # the detections' embeddings are the encoder's embeddings of those windows (float tail vs int8 encoder)
    dx, _ = detected_examples(dev)
    enc = km.infer(feats)[0]
    cos = np.sum(dx * enc, 1) / (np.linalg.norm(dx, axis=1) * np.linalg.norm(enc, axis=1))
    assert cos.min() > 0.98
    # the same call on the state directory; and deterministic
    X2, y2 = local_examples(tmp_path / "state", (clips, names), augment=4, ambient=ambient)
    assert np.array_equal(y, y2) and np.allclose(X, X2)
    # nothing given, nothing in the state: empty, the agent's "no examples" case
    X0, y0 = local_examples(Device(tmp_path / "empty", bundle))
    assert X0.shape == (0, 64) and y0.shape == (0,)


def test_word_copies_are_sped_up_over_the_federated_range(tmp_path, bundle):
    """A round's word copies move pitch and formants over ``FL_SPEED`` (up to 1.35x, so an update
    carries past the fleet's own voices), not the speaker recipe's narrower range."""
    from edge.adapt.recipe import training_windows
    from edge.fl.local import FL_SPEED

    labels = list(bundle.labels)
    t = np.arange(16000) / 16000
    tone = (3000 * np.sin(2 * np.pi * 500 * t) * np.exp(-((t - 0.5) ** 2) / 0.02)).astype(np.int16)

    def peak_hz(x):  # 16,000 samples: one FFT bin per Hz
        return int(np.argmax(np.abs(np.fft.rfft(x.astype(np.float32)))))

    w, _ = training_windows(tone[None], [labels.index("yes")], labels, augment=6, speed=(1.3, 1.3))
    assert peak_hz(w[0]) == 500  # the clip itself first
    assert all(abs(peak_hz(c) - 650) <= 3 for c in w[1:])
    w, _ = training_windows(tone[None], [labels.index("yes")], labels, augment=6)  # augment's own range
    assert all(450 - 3 <= peak_hz(c) <= 560 + 3 for c in w[1:])
    # local_examples uses FL_SPEED unless told otherwise
    dev = Device(tmp_path / "state", bundle)
    clips = (_windows(2, 5), ["yes", "no"])
    X, _ = local_examples(dev, clips, augment=4, detections=False)
    assert np.allclose(X, local_examples(dev, clips, augment=4, detections=False, speed=FL_SPEED)[0])
    assert not np.allclose(X, local_examples(dev, clips, augment=4, detections=False, speed=(0.9, 1.12))[0])
    # and half the copies voice-converted first (FL_CONVERT) unless told otherwise
    from edge.fl.local import FL_CONVERT

    assert np.allclose(X, local_examples(dev, clips, augment=4, detections=False, convert=FL_CONVERT)[0])
    X0, _ = local_examples(dev, clips, augment=4, detections=False, convert=None)
    assert np.allclose(X[::4], X0[::4]) and not np.allclose(X, X0)   # the clips themselves as they were


def test_trainer_keeps_absent_labels_and_draws_negatives(bundle):
    from host.fleet.data import extract_head

    head = extract_head()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 64)).astype(np.float32)
    y = np.array([5] * 20 + [35] * 20 + [36] * 20)
    tr = FederatedHeadTrainer("sparse", tensors=["classifier.w", "classifier.b"], negatives=(35, 36),
                              negative_share=0.5, balance=True, keep_absent=True)
    new = tr.train(head, X, y, {"learning_rate": 0.1, "local_epochs": 2}, np.random.default_rng(1))
    assert set(new) == {"classifier.w", "classifier.b"}
    moved = np.abs(new["classifier.w"] - head["classifier.w"]).max(axis=0) > 0
    assert set(np.nonzero(moved)[0]) == {5, 35, 36}
    # without the options: the old walk, every output moves
    plain = FederatedHeadTrainer().train(head, X, y, {"learning_rate": 0.1}, np.random.default_rng(1))
    assert (np.abs(plain["classifier.w"] - head["classifier.w"]).max(axis=0) > 0).all()


def test_shipped_head_task_starts_from_the_shipped_model(tmp_path, bundle):
    """Round 0 is the shipped model: the aggregator's first version carries the shipped classifier,
    and its logits on the float encoder's embeddings are the float model's own posteriors."""
    from edge.fl import FLClient
    from host.aggregator.app import build_app
    from host.aggregator.config import AggregatorConfig
    from host.aggregator.inprocess import InProcessTransport, make_state
    from host.fleet.data import extract_head

    state, keys = make_state(tmp_path, AggregatorConfig(clients_per_round=1), n_devices=1, params=extract_head())
    with InProcessTransport(build_app(state, tick_interval=0)) as t:
        dev, key = next(iter(keys.items()))
        c = FLClient(t, dev, key, tmp_path / "dev", trusted_keys=state / "keys")
        ans = c.checkin({"battery": 1.0, "charging": True, "network": "wifi"})
        head = c.ensure_model(int(ans["task"]["model_version"]))
    kmf = KeywordModel(bundle, precision="float32")
    emb, probs = kmf.infer(kmf.features(_windows(16, 3)))
    z = head_logits(head, emb)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert np.allclose(p, probs, atol=1e-4)
    assert (p.argmax(1) == probs.argmax(1)).all()


def _split_set(rng, n=120):
    """Val rows of espeak voices, then a few train rows of a Festival voice (a second gate group)."""
    from host.fleet.data import EmbeddingSet

    X = np.abs(rng.standard_normal((n + 20, 64))).astype(np.float32)
    return EmbeddingSet(X, rng.integers(0, 37, n + 20).astype(np.int16),
                        np.array(["espeak:en-us+m1"] * n + ["festival:kal_diphone"] * 20),
                        np.array(["val"] * n + ["train"] * 20))


def test_a_held_out_group_that_names_nothing_is_one_sentence():
    from host.fleet.simulate import group_rows

    data = _split_set(np.random.default_rng(0))
    assert list(group_rows(data, "train:festival")) == list(range(120, 140))
    assert len(group_rows(data, "val")) == 120
    with pytest.raises(EdgelearnError, match="'train:flite' has no rows"):
        group_rows(data, "train:flite")


@pytest.mark.slow
def test_a_few_shipped_head_rounds_over_loopback_move_the_head(tmp_path, bundle):
    from host.fleet.data import extract_head
    from host.fleet.simulate import SimConfig, final_head, simulate

    rng = np.random.default_rng(0)
    fleet = []
    for i in range(3):
        dev = Device(tmp_path / f"user{i}", bundle)
        X, y = local_examples(dev, (_windows(6, 10 + i), ["yes", "no", "up", "_silence_", "_unknown_", "go"]),
                              augment=3, ambient=_windows(4, 20 + i, level=200.0))
        fleet.append({"device": dev, "X": X, "y": y})
    cfg = SimConfig(task="shipped-head", devices=3, rounds=2, clients_per_round=2, drop_rate=0.0,
                    slow_fraction=0.0, time_scale=0.01, eval_tolerance=1.0, local_epochs=2,
                    heldout_groups=("train:festival",))
    res = simulate(cfg, tmp_path / "sim", data=_split_set(rng), progress=False, fleet=fleet)
    (held,) = (tmp_path / "sim").rglob("heldout.npz")  # the gate holds the val rows and the Festival rows apart
    with np.load(held) as z:
        assert np.bincount(z["groups"]).tolist() == [120, 20] and len(z["y"]) == 140
    done = [r for r in res["rounds"] if r["status"] == "closed"]
    assert len(done) >= 2 and res["final_version"] > res["models"][0]["version"]
    h0, h = extract_head(), final_head(tmp_path / "sim")
    assert not np.allclose(h["proj.w"], h0["proj.w"])  # the whole head is what the devices train
    assert not np.allclose(h["classifier.w"], h0["classifier.w"])
    first = final_head(tmp_path / "sim", res["models"][0]["version"])
    assert all(np.array_equal(first[k], h0[k]) for k in h0)
    # every device got its data through the client: uploads happened, from 2+ devices
    assert res["stats"]["uploads"] >= 4 and sum(p > 0 for p in res["participation"]) >= 2


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("flite") is None, reason="needs flite")
def test_voice_device_detections_become_pseudo_labels(tmp_path, bundle):
    from host.fleet.voices import heldout_clips, make_fleet, prepare_devices

    users = make_fleet(1, voices=("kal16",), seed=3, labelled_per_command=1, heard_per_command=2,
                       ambient_words=3, heard_words=2)
    (f,) = prepare_devices(users, tmp_path, augment=2, bundle=bundle)
    src = f["source"]
    assert (src == "labelled").sum() == 10 + 10 and (src == "augmented").sum() == 10
    assert (src == "ambient").sum() == 3 and (src == "detected").sum() == f["detections"]["kept"]
    assert f["detections"]["kept_correct"] <= f["detections"]["kept"] <= f["detections"]["events"]
    x, words = heldout_clips("slt", seed=1, per_command=1, other_words=2)
    assert x.shape == (12, 16000) and words.count("_unknown_") == 2
