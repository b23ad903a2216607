"""Adaptation with negatives (issue 17): batch sampling, distillation on local negatives, ambient
windows and augmentation, and what they are for: after adapting with negatives the tail still
calls held-out other speech ``_unknown_``."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from edge.adapt.ambient import ambient_windows, augment
from edge.adapt.conv import ConvTail
from edge.adapt.convtrain import ConvTrainer
from edge.adapt.run import train
from edge.adapt.sampling import Batches
from edge.audio import write_wav
from edge.errors import EdgelearnError


class MemStore:
    def __init__(self):
        self.saved = None

    def current(self, context):
        return None

    def load_checkpoint(self):
        return None, None

    def save_checkpoint(self, state, info):
        pass

    def save(self, context, delta, info, stage=None, charge=None):
        self.saved, self.info = delta, info
        return 1


def test_plain_batches_are_the_loops_old_order():
    y = np.arange(13) % 4
    b = Batches(y, 5, seed=3)
    order = np.random.default_rng(3).permutation(13)
    for step in range(7):
        np.testing.assert_array_equal(b(step), order[(step * 5 + np.arange(5)) % 13])
    assert b.plain and b.describe() == {}


def test_a_negative_share_and_balance_fix_every_batch():
    # 3 classes of 3 clips, 200 unknowns (9), 10 silences (8): lopsided as a speaker adaptation set
    y = np.concatenate([np.repeat([0, 1, 2], 3), np.full(200, 9), np.full(10, 8)])
    b = Batches(y, 16, seed=1, balance=True, negatives=(9, 8), negative_share=0.75)
    counts = np.zeros(10, int)
    for step in range(300):
        idx = b(step)
        assert len(idx) == 16 and np.isin(y[idx], (8, 9)).sum() == 12  # 12 of 16, every batch
        np.add.at(counts, y[idx], 1)
    assert counts[8] == counts[9] == 300 * 6  # evenly between the negative labels present
    assert counts[:3].sum() == 1200 and counts[:3].min() >= 380  # each class about a third
    np.testing.assert_array_equal(b(17), Batches(y, 16, seed=1, balance=True, negatives=(9, 8),
                                                 negative_share=0.75)(17))  # a function of (seed, step)
    assert b.describe() == {"balance": True, "negatives": [9, 8], "negative_share": 0.75}
    # no negatives present: the share has nothing to draw from, the walk is class-balanced
    bal = Batches(np.repeat([0, 1], [2, 50]), 10, balance=True, negatives=(9,), negative_share=0.5)
    assert bal.share is None and sum(int((np.repeat([0, 1], [2, 50])[bal(s)] == 0).sum()) for s in range(50)) >= 200
    with pytest.raises(EdgelearnError):
        Batches(y, 16, negative_share=1.5)


def tail_arrays(c=8, k=5, seed=0):
    rng = np.random.default_rng(seed)
    return {"dw4_w": rng.normal(0, .4, (3, 3, c)).astype(np.float32), "dw4_b": rng.normal(0, .1, c).astype(np.float32),
            "pw4_w": rng.normal(0, .4, (c, c)).astype(np.float32), "pw4_b": rng.normal(0, .1, c).astype(np.float32),
            "cls_w": rng.normal(0, .5, (c, k)).astype(np.float32), "cls_b": rng.normal(0, .1, k).astype(np.float32)}


def test_full_distillation_on_negatives_keeps_the_base_model_there():
    """Every example a negative whose target is the base tail's own posteriors: nothing moves."""
    rng = np.random.default_rng(2)
    x = np.abs(rng.normal(0, 1, (12, 5, 3, 8))).astype(np.float32)
    y = np.full(12, 4)
    teacher = ConvTail(tail_arrays()).probs
    tr = ConvTrainer(ConvTail(tail_arrays()), "full", "sgd", lr=0.5)
    store = MemStore()
    train(tr, x, y, store, "c", 30, batch=4, teacher=teacher, negatives=(4,), negative_distill=1.0)
    for k, v in store.saved.items():
        np.testing.assert_allclose(v, tail_arrays()[k], atol=1e-5)
    assert store.info["negative_distill"] == 1.0
    tr = ConvTrainer(ConvTail(tail_arrays()), "full", "sgd", lr=0.5)
    train(tr, x, y, store, "c", 30, batch=4, teacher=teacher, negatives=(4,), negative_distill=0.0)
    assert max(float(np.abs(v - tail_arrays()[k]).max()) for k, v in store.saved.items()) > 1e-2  # labels move it
    with pytest.raises(EdgelearnError, match="outside 0..1"):
        train(tr, x, y, store, "c", 3, batch=4, teacher=teacher, negatives=(4,), negative_distill=2.0)


def test_a_paused_balanced_run_resumes_to_the_same_result(tmp_path):
    from edge.adapt.store import AdaptStore

    class Bundle:
        model_id, version = "m", 1

    rng = np.random.default_rng(4)
    x = np.abs(rng.normal(0, 1, (40, 5, 3, 8))).astype(np.float32)
    y = np.concatenate([[0, 0, 1, 1, 2, 2], np.full(34, 4)])
    teacher = ConvTail(tail_arrays()).probs
    kw = dict(batch=4, teacher=teacher, negatives=(4,), negative_share=0.5, balance=True, negative_distill=0.3)
    results = []
    for pause_at in (None, 9):
        store = AdaptStore(tmp_path / f"s{pause_at}", Bundle())
        calls = iter(range(10 ** 6))
        tr = ConvTrainer(ConvTail(tail_arrays()), "full", "adam")
        res = train(tr, x, y, store, "c", 25, should_continue=(lambda: next(calls) != pause_at) if pause_at
                    else (lambda: True), **kw)
        if pause_at:
            assert res["status"] == "paused" and res["steps_done"] == 9
            # another sampling is another run: its checkpoint is not resumed
            tr2 = ConvTrainer(ConvTail(tail_arrays()), "full", "adam")
            assert train(tr2, x, y, AdaptStore(tmp_path / "other", Bundle()), "c", 25, **{**kw, "negative_share": 0.25}
                         )["steps_done"] == 25
            tr = ConvTrainer(ConvTail(tail_arrays()), "full", "adam")
            res = train(tr, x, y, store, "c", 25, **kw)
            assert res["steps_done"] == 25
        assert res["status"] == "done"
        results.append({k: tr.tail.delta[k].copy() for k in tr.names})
    for k in results[0]:
        np.testing.assert_allclose(results[1][k], results[0][k], atol=1e-6)


def test_ambient_windows_cut_long_audio_and_keep_a_bounded_uniform_sample(tmp_path):
    pcm = (np.arange(16000 * 10) % 30000 - 15000).astype(np.int16)
    wav = write_wav(tmp_path / "a.wav", pcm)
    w = ambient_windows([wav], hop_s=0.5)
    assert w.shape == (19, 16000) and w.dtype == np.int16
    for i in range(19):
        np.testing.assert_array_equal(w[i], pcm[i * 8000:i * 8000 + 16000])
    two = ambient_windows([wav, wav], hop_s=0.5, max_windows=7, seed=1)
    assert two.shape == (7, 16000)
    starts = {tuple(pcm[i * 8000:i * 8000 + 5]) for i in range(19)}
    assert all(tuple(r[:5]) in starts for r in two)  # every kept window is one of the file's
    np.testing.assert_array_equal(two, ambient_windows([wav, wav], hop_s=0.5, max_windows=7, seed=1))
    quiet = np.zeros(16000 * 3, np.int16)
    quiet[16000:32000] = 3000
    got = ambient_windows([write_wav(tmp_path / "q.wav", quiet)], hop_s=0.5, min_rms=1000)
    assert len(got) == 3  # the three windows that overlap the loud second by at least half
    with pytest.raises(EdgelearnError):
        ambient_windows([write_wav(tmp_path / "z.wav", np.zeros(16000 * 2, np.int16))], min_rms=10)


def test_augment_keeps_each_clip_first_and_mixes_noise_at_the_asked_snr():
    rng = np.random.default_rng(0)
    t = np.arange(16000) / 16000
    clip = np.zeros(16000, np.float32)
    clip[4000:12000] = 8000 * np.sin(2 * np.pi * 440 * t[4000:12000])
    clips = np.stack([clip, clip * 0.5]).astype(np.int16)
    out = augment(clips, 6, rng, speed=(1.0, 1.0), shift_s=0.0, gain_db=(0, 0), snr_db=(10, 10), clean_share=0.0)
    assert out.shape == (12, 16000) and out.dtype == np.int16
    np.testing.assert_array_equal(out[0], clips[0])
    np.testing.assert_array_equal(out[6], clips[1])
    for row, c in ((out[1], clips[0]), (out[7], clips[1])):
        noise = row.astype(np.float64) - c
        speech = np.sqrt(np.mean(c[4000:12000].astype(np.float64) ** 2))
        assert 8.5 < 20 * np.log10(speech / np.sqrt(np.mean(noise ** 2))) < 11.5
    a = augment(clips, 4, np.random.default_rng(5))
    np.testing.assert_array_equal(a, augment(clips, 4, np.random.default_rng(5)))
    assert not np.array_equal(a[1], a[0])
    with pytest.raises(EdgelearnError):
        augment(clips[:, :100], 2, rng)


def test_augment_noise_colours_tilt_the_spectrum_and_white_alone_keeps_the_old_copies():
    """``colours`` draws each copy's synthetic noise from white, pink or brown; ("white",), the
    default, draws no colour, so its copies are the ones augment always made."""
    from edge.adapt.ambient import coloured_noise

    def tilt(x):     # power in 40-400 Hz over 2-4 kHz (rfft bins of 1 Hz)
        f = np.abs(np.fft.rfft(x)) ** 2
        return f[40:400].mean() / f[2000:4000].mean()

    rng = np.random.default_rng(0)
    t = [tilt(coloured_noise(rng, c, (16000,))) for c in ("white", "pink", "brown")]
    assert 0.7 < t[0] < 1.4 and 5 < t[1] < 50 < t[2]
    clips = (np.random.default_rng(1).standard_normal((2, 16000)) * 3000).astype(np.int16)
    a = augment(clips, 4, np.random.default_rng(5))
    np.testing.assert_array_equal(a, augment(clips, 4, np.random.default_rng(5), colours=("white",)))
    b = augment(clips, 4, np.random.default_rng(5), colours=("white", "pink", "brown"))
    assert b.shape == a.shape and not np.array_equal(a[1:4], b[1:4])
    with pytest.raises(EdgelearnError, match="colours"):
        augment(clips, 2, rng, colours=("purple",))


@pytest.mark.skipif(shutil.which("espeak-ng") is None or shutil.which("flite") is None,
                    reason="espeak-ng or flite not installed")
def test_adapting_with_negatives_keeps_other_speech_unknown():
    """The shipped tail adapted to 3 clips per command of Flite's awb (a voice no model trained on):
    without negatives it forgets ``_unknown_`` on held-out other words (by awb itself and by an
    espeak-ng voice); with other speech as ``_unknown_`` (balanced batches, 3/4 negatives) it
    keeps it, and still names every one of its own clips."""
    from edge import features as F
    from edge.adapt import Backbone, load_tail
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from host.data import synth
    from host.data.corpus import CorpusConfig, assign_splits
    from host.data.words import COMMANDS10, FILLERS

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    km, bb = KeywordModel(bundle), Backbone(bundle)
    split = assign_splits(synth.all_voices(), CorpusConfig())
    voices = [v for v in synth.all_voices() if split[v.id] == "test" and v.synth == "espeak"][:4]
    awb = synth.Voice("flite", "awb")

    def feats(voice, texts, rates=(1.0,)):
        pcm = synth.render(voice, [(t, r, 1.0) for t in texts for r in rates])
        return bb(km.features(np.stack([F.fit_to_window(p) for p in pcm])))

    pos = feats(awb, COMMANDS10, rates=(0.9, 1.0, 1.1))
    ypos = np.repeat([km.labels.index(w) for w in COMMANDS10], 3)
    neg = np.concatenate([feats(voices[1], FILLERS[:25]), feats(voices[2], FILLERS[25:45])])
    held = np.concatenate([feats(voices[3], FILLERS[45:60]), feats(awb, FILLERS[45:60])])
    unk, sil = km.labels.index("_unknown_"), km.labels.index("_silence_")

    def adapted(with_negatives):
        x, y = (np.concatenate([pos, neg]), np.concatenate([ypos, np.full(len(neg), unk)])) if with_negatives \
            else (pos, ypos)
        tr = ConvTrainer(ConvTail(load_tail(bundle), qparams=bb.qparams), "full", "sgd")
        store = MemStore()
        train(tr, x, y, store, "c", 400, balance=True, negatives=(unk, sil),
              negative_share=0.75 if with_negatives else None)
        return ConvTail(load_tail(bundle), store.saved, qparams=bb.qparams)

    base = ConvTail(load_tail(bundle), qparams=bb.qparams).probs(held)[:, unk].mean()
    without, with_neg = adapted(False), adapted(True)
    p_without, p_with = without.probs(held)[:, unk].mean(), with_neg.probs(held)[:, unk].mean()
    assert p_without < 0.5 < base  # the known failure: the tail forgets _unknown_
    assert p_with > 0.8 and p_with > base
    assert (with_neg.probs(pos).argmax(axis=1) == ypos).all()  # and it learnt the voice


def test_training_windows_augment_word_clips_and_label_ambient_unknown():
    from edge.adapt.recipe import negative_ids, train_options, training_windows

    labels = ["yes", "no", "_silence_", "_unknown_"]
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((5, 16000)) * 1000).astype(np.int16)
    y = np.array([0, 0, 1, 2, 3])
    amb = (rng.standard_normal((7, 16000)) * 500).astype(np.int16)
    xw, yy = training_windows(w, y, labels, ambient=amb, augment=4)
    assert xw.shape == (3 * 4 + 2 + 7, 16000) and xw.dtype == np.int16
    np.testing.assert_array_equal(yy, [0] * 8 + [1] * 4 + [2, 3] + [3] * 7)
    np.testing.assert_array_equal(xw[0], w[0])   # each word clip itself first, then its copies
    np.testing.assert_array_equal(xw[12], w[3])  # negatives once, unchanged
    np.testing.assert_array_equal(xw[14:], amb)
    np.testing.assert_array_equal(xw, training_windows(w, y, labels, ambient=amb, augment=4)[0])  # cacheable
    assert len(training_windows(w, y, labels)[0]) == 5
    assert negative_ids(labels) == (3, 2)
    assert train_options(labels)["negatives"] == (3, 2) and train_options(labels)["negative_share"] == 0.75
    with pytest.raises(EdgelearnError, match="no _unknown_"):
        training_windows(w, y, ["yes", "no", "_silence_", "x"], ambient=amb)
    # the speaker recipe's noisy ambient: each ambient window, then one changed copy of each
    xn, yn = training_windows(w, y, labels, ambient=amb, augment=4, noisy_ambient=True)
    assert xn.shape == (3 * 4 + 2 + 2 * 7, 16000) and (yn[14:] == 3).all()
    np.testing.assert_array_equal(xn[:21], xw)
    assert all(not np.array_equal(xn[21 + i], amb[i]) for i in range(7))
    from edge.adapt.ambient import augment   # the copies are those of augment(n=2) after each clip itself
    np.testing.assert_array_equal(xn[21:], augment(amb, 2, np.random.default_rng([0, 1]))[1::2])
    np.testing.assert_array_equal(xn, training_windows(w, y, labels, ambient=amb, augment=4, noisy_ambient=True)[0])


def test_recipe_options_of_the_wrong_type_are_one_sentence():
    from edge.adapt.recipe import resolve

    assert resolve("speaker", steps=500, negative_share=np.float32(0.5))["steps"] == 500
    for bad, what in ((dict(steps="500"), "whole number"), (dict(verify=1), "true or false"),
                      (dict(negative_share="x"), "a number"), (dict(strategy=3), "a name"),
                      (dict(augment=2.5), "whole number")):
        with pytest.raises(EdgelearnError, match=what):
            resolve("speaker", **bad)


def test_speaker_recipe_commits_a_version_with_its_replay_and_refuses_unknown_options(tmp_path):
    from edge.adapt.recipe import resolve
    from edge.adapt.store import AdaptStore
    from edge.bundle import load_bundle
    from edge.device import Device
    from edge.kws import DEFAULT_BUNDLE, default_trusted_keys
    from edge.portable.replay import ReplayBuffer

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    labels = list(bundle.labels)
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((4, 16000)) * 2000).astype(np.int16)
    y = ["yes", "yes", "stop", "stop"]
    amb = (rng.standard_normal((6, 16000)) * 300).astype(np.int16)
    dev = Device(tmp_path / "st", bundle)
    res = dev.adapt((w, y), recipe="speaker", ambient=amb, steps=4, augment=2, force=True)
    assert res["status"] == "done" and res["version"] == 1 and res["n"] == 4 * 2 + 2 * 6  # ambient + noisy copies
    assert (res["recipe"], res["strategy"]) == ("speaker", "full")
    assert "dw4_w" in res["tensors"] and AdaptStore(tmp_path / "st", bundle).current("default") == 1
    rb = ReplayBuffer.from_bytes((tmp_path / "st" / "replay_tail.bin").read_bytes())
    assert rb.class_counts()[labels.index("_unknown_")] > 0
    assert res["verified"] == ["stop", "yes"] and (tmp_path / "st" / "adapt" / "default" / "verify.json").is_file()
    # no recipe is what `device adapt` always did: the clips as given, bias-only, no second stage
    res = dev.adapt((w, y), steps=2, force=True)
    assert (res["recipe"], res["strategy"], res["n"], res["verified"]) == ("plain", "bias-only", 4, [])
    with pytest.raises(EdgelearnError, match="unknown adaptation recipe"):
        dev.adapt((w, y), recipe="speeker", force=True)
    with pytest.raises(EdgelearnError, match="unknown recipe options"):
        resolve("speaker", stpes=4)
    with pytest.raises(EdgelearnError, match="out of range"):
        dev.adapt((w, y), recipe="speaker", negative_share=1.5, force=True)
    assert AdaptStore(tmp_path / "st", bundle).current("default") == 2  # the refused runs wrote nothing


def test_device_adapt_cli_speaker_recipe_then_detection_runs_both_stages(tmp_path, capsys):
    """`device adapt --recipe speaker --ambient WAV` from the command line; the state's detector
    (what `device detect`, the agent and the Wyoming server run) then takes the adapted commands
    through their second stage, the other commands as before."""
    import json

    from edge.cli import main
    from edge.device import Device
    from host.data.synth import pcm_to_wav_bytes

    rng = np.random.default_rng(2)
    data = tmp_path / "data"
    for word in ("yes", "no"):
        (data / word).mkdir(parents=True)
        for i in range(3):
            pcm = (rng.standard_normal(16000) * 2000).astype(np.int16)
            (data / word / f"{i}.wav").write_bytes(pcm_to_wav_bytes(pcm))
    amb = tmp_path / "room.wav"
    amb.write_bytes(pcm_to_wav_bytes((rng.standard_normal(16000 * 4) * 300).astype(np.int16)))
    st = tmp_path / "st"
    assert main(["device", "adapt", "--state", str(st), "--data", str(data), "--recipe", "speaker",
                 "--ambient", str(amb), "--steps", "3", "--augment", "2", "--force"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["recipe"] == "speaker" and res["verified"] == ["no", "yes"] and res["n"] == 6 * 2 + 2 * 7
    det, _ = Device(st).detector(replay=False)
    assert type(det.custom).__name__ == "VerifiedCommands" and det.custom.n_base == 2
    assert sorted(det.names[-2:]) == ["no", "yes"] and not {"no", "yes"} & set(det.names[:-2])
    assert len(det.names) == 10  # the eight others still reported, first stage only
    det, _ = Device(st).detector(keywords=["yes", "up"], threshold={"yes": 0.8, "up": 0.6}, replay=False)
    assert det.names == ["up", "yes"] and list(det.thresholds) == pytest.approx([0.6, 0.8])
    with pytest.raises(SystemExit):
        main(["device", "adapt", "--state", str(st), "--data", str(data), "--recipe", "nope"])
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("espeak-ng") is None or shutil.which("flite") is None,
                    reason="espeak-ng or flite not installed")
def test_verified_commands_run_both_stages_in_the_unchanged_detector(tmp_path):
    """The speaker recipe commits verifier entries with the version; load_verified gives the Detector the
    commands as two-stage keywords: the voice's commands are found, the same stream's other words
    are not, and entries of another version (or a damaged file) are never used."""
    from edge import features as F
    from edge.adapt import TailModel
    from edge.adapt.store import AdaptStore
    from edge.adapt.verified import entries_file, load_verified
    from edge.bundle import load_bundle
    from edge.detect import Detector, detect_pcm
    from edge.kws import DEFAULT_BUNDLE, default_trusted_keys
    from host.data import synth
    from host.data.words import FILLERS

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    labels = list(bundle.labels)
    awb = synth.Voice("flite", "awb")
    words = ["yes", "stop", "left"]
    clips = synth.render(awb, [(w, r, 1.0) for w in words for r in (0.9, 1.0, 1.1)])
    windows = np.stack([F.fit_to_window(c) for c in clips])
    y = np.repeat([labels.index(w) for w in words], 3)
    amb = np.stack([F.fit_to_window(c) for c in synth.render(awb, [(w, 1.0, 1.0) for w in FILLERS[:40]])])
    st = tmp_path / "st"
    from edge.device import Device

    res = Device(st, bundle).adapt((windows, y), recipe="speaker", ambient=amb, steps=300, augment=4, force=True)
    assert res["verified"] == sorted(words)
    vc = load_verified(st, bundle)
    assert vc is not None and vc.names == sorted(words)
    assert vc.versions == [8, 8, 8]  # edge.verify.COMMANDS_VERSION: the noise range from the median frame
    rng = np.random.default_rng(0)
    said = words * 2
    heard = synth.render(awb, [(w, r, 1.0) for w, r in zip(said, (0.95, 1.05) * 3)])
    others = synth.render(awb, [(w, 1.0, 1.0) for w in FILLERS[40:52]])
    parts = []
    for u in heard + others:  # the commands first, then twelve other words (none trained on)
        parts += [np.zeros(int(rng.uniform(0.8, 1.1) * 16000), np.float32), u.astype(np.float32)]
    pcm = np.concatenate(parts + [np.zeros(16000, np.float32)])
    pcm = np.clip(pcm + rng.standard_normal(len(pcm)) * 3, -32768, 32767).astype(np.int16)
    tm = TailModel(bundle, AdaptStore(st, bundle).load())
    events = detect_pcm(Detector(tm, keywords=[], custom=vc), pcm)
    cut = (sum(len(p) for p in parts[:2 * len(heard)])) / 16000
    assert [e["keyword"] for e in events if e["time_s"] < cut + 0.5] == said
    assert all(e["time_s"] < cut + 0.5 for e in events)  # nothing on the other words
    # another version of the context (here: trained again without verify) has no entries
    Device(st, bundle).adapt((windows, y), recipe="speaker", ambient=amb, steps=2, augment=1, verify=False,
                             force=True)
    assert load_verified(st, bundle) is None
    (st / entries_file("default")).write_bytes(b"{not json")
    with pytest.raises(EdgelearnError, match="damaged"):
        load_verified(st, bundle)
