"""scripts/train_variant.py: extra renders go to training voices only; eval clips do not move."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from host.data.corpus import Corpus

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("train_variant", ROOT / "scripts" / "train_variant.py")
tv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tv)


def tiny_corpus():
    rng = np.random.default_rng(0)
    rows = [("yes", "keyword", "espeak:en-us+m1", "train"), ("no", "keyword", "espeak:en-us+m1", "train"),
            ("apple", "filler", "espeak:en-us+m1", "train"), ("yes", "keyword", "festival:kal_diphone", "train"),
            ("apple", "filler", "festival:kal_diphone", "train"),
            ("yes", "keyword", "espeak:en-gb+f2", "test"), ("apple", "filler", "espeak:en-gb+f2", "test"),
            ("no", "keyword", "festival:cmu_us_slt_arctic_hts", "test"),
            ("yes", "keyword", "espeak:en-029+m3", "val"), ("apple", "filler", "espeak:en-029+m3", "val")]
    pcm = [rng.integers(-3000, 3000, 4000 + 100 * i).astype(np.int16) for i in range(len(rows))]
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in pcm])])
    meta = {k: [r[j] for r in rows] for j, k in enumerate(("text", "kind", "voice", "split"))}
    return Corpus(np.concatenate(pcm), offsets, meta, {"seed": 0})


def test_jobs_are_for_training_voices_only_with_their_counts_and_pitch():
    c = tiny_corpus()
    extra = {("keyword", "espeak"): 2, ("keyword", "festival"): 3, ("filler", "festival"): 1}
    jobs = tv.supplement_jobs(c, ["yes", "no"], extra, (0.8, 1.25), (0.8, 1.25), (1.15, 1.5))
    per = {}
    for voice, text, rate, pitch, (vid, t, kind, _r) in jobs:
        assert vid == voice.id and t == text and 0.8 <= rate <= 1.25
        assert (1.15 <= pitch <= 1.5) if voice.synth == "festival" else (0.8 <= pitch <= 1.25)
        per[(vid, kind)] = per.get((vid, kind), 0) + 1
    assert per == {("espeak:en-us+m1", "keyword"): 4, ("festival:kal_diphone", "keyword"): 6,
                   ("festival:kal_diphone", "filler"): 1}
    # the same seed plans the same draws; keys are unique
    assert [j[2:] for j in jobs] == [j[2:] for j in tv.supplement_jobs(
        c, ["yes", "no"], extra, (0.8, 1.25), (0.8, 1.25), (1.15, 1.5))]
    assert len({j[4] for j in jobs}) == len(jobs)


def test_near_misses_are_unknown_renders_by_training_voices_and_never_a_command():
    from host.data.words import COMMANDS10, FILLERS, LABELS

    c = tiny_corpus()
    jobs = tv.near_miss_jobs(c, 2, (0.8, 1.25), (0.8, 1.25))
    words = {w for ws in tv.NEAR_MISSES.values() for w in ws}
    assert set(tv.NEAR_MISSES) == set(COMMANDS10)
    assert not words & (set(LABELS) | set(FILLERS))  # none is a word the model names, nor a filler already
    per = {}
    for voice, text, _rate, _pitch, (vid, t, kind, _r) in jobs:
        assert vid == voice.id and t == text and t in words and kind == "filler"
        per[vid] = per.get(vid, 0) + 1
    assert per == {"espeak:en-us+m1": 2 * len(words), "festival:kal_diphone": 6 * len(words)}
    assert len({j[4] for j in jobs}) == len(jobs)
    # keys never collide with supplement_jobs' (both may run in one variant)
    extra = {("filler", "espeak"): 3, ("filler", "festival"): 9}
    assert not {j[4] for j in jobs} & {j[4] for j in tv.supplement_jobs(c, [], extra, (1, 1), (1, 1))}


def test_supplement_adds_training_rows_and_leaves_eval_clips_alone():
    c = tiny_corpus()
    rendered = {("festival:kal_diphone", "no", "keyword", 0): np.full(3000, 7, np.int16),
                ("espeak:en-us+m1", "apple", "filler", 0): np.full(2000, -5, np.int16)}
    m = tv.with_supplement(c, rendered)
    assert len(m) == len(c) + 2
    assert len(m.select("train")) == len(c.select("train")) + 2
    new = m.select("train")[-2:]
    assert sorted((m.text[i], m.voice[i], len(m.utterance(i))) for i in new) == [
        ("apple", "espeak:en-us+m1", 2000), ("no", "festival:kal_diphone", 3000)]
    for i in range(len(c)):
        np.testing.assert_array_equal(m.utterance(i), c.utterance(i))
    for split in ("val", "test"):
        for a, b in zip(c.eval_clips(split), m.eval_clips(split)):
            np.testing.assert_array_equal(a, b)


def test_bad_numbers_are_one_clear_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        tv.main(["out", "--extra", "5,18,x"])
    assert e.value.code == 2
    assert "want 4 comma-separated numbers, got '5,18,x'" in capsys.readouterr().err
    assert tv.numbers(2)("1.15,1.5") == (1.15, 1.5)
    with pytest.raises(SystemExit):   # a negative count of renders would silently render none
        tv.main(["out", "--festival-extra=-1,3"])
    assert "want 2 counts of renders, 0 or more, got '-1,3'" in capsys.readouterr().err


def test_piper_rows_make_a_test_corpus_of_their_own():
    rows = {("piper:joe", "yes", "keyword", 0): np.full(3000, 9, np.int16),
            ("piper:joe", "apple", "filler", 0): np.full(2500, -4, np.int16)}
    c = tv.as_test_corpus(rows)
    assert list(c.split) == ["test", "test"] and list(c.voice) == ["piper:joe"] * 2
    assert len(c.utterance(0)) == 3000 and len(c.utterance(1)) == 2500
    x, y, voices = c.eval_clips("test")
    assert x.shape == (3, 16000) and list(voices) == ["piper:joe", "piper:joe", "noise"]  # + silence


def test_evaluate_needs_a_trained_model(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        tv.main([str(tmp_path), "--evaluate"])
    assert e.value.code == 2
    assert "has no model.keras and frontend.json to evaluate" in capsys.readouterr().err


def test_per_word_counts_one_voices_answers():
    from host.data.words import LABELS

    c = tiny_corpus()

    def predict(feats):  # answers "down" for every clip
        probs = np.zeros((len(feats), len(LABELS)), np.float32)
        probs[:, LABELS.index("down")] = 1.0
        return None, probs

    out = tv.per_word(predict, c, [1.0] * 10, "festival:cmu_us_slt_arctic_hts")
    assert out == {"no": (0.0, [("down", 1)])}  # slt's one test clip; words it lacks are left out


def test_evaluate_refuses_training_only_options(tmp_path, capsys):
    (tmp_path / "model.keras").write_text("x")
    (tmp_path / "frontend.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        tv.main([str(tmp_path), "--evaluate", "--extra", "5,18,1,3"])
    assert e.value.code == 2
    assert "--extra and --piper train only change training" in capsys.readouterr().err


def test_world_conversions_are_training_rows_of_the_chosen_voices_only(monkeypatch):
    from host.data import voiceconv

    monkeypatch.setattr(voiceconv, "_convert_job", lambda job: job[0][::-1].copy())
    c = tiny_corpus()
    rows = voiceconv.converted_rows(c, ["festival:kal_diphone"], copies=2, workers=1)
    assert sorted(k[1:3] for k in rows) == [("apple", "filler")] * 2 + [("yes", "keyword")] * 2
    assert all(k[0] == "festival:kal_diphone+world" for k in rows)
    merged = tv.with_supplement(c, rows)
    assert list(merged.split[-4:]) == ["train"] * 4 and len(merged.text) == len(c.text) + 4
    assert c.eval_clips("test")[0].shape == merged.eval_clips("test")[0].shape  # eval clips do not move


def test_world_conversion_moves_pitch_and_keeps_length():
    pw = pytest.importorskip("pyworld")
    from host.data.voiceconv import convert

    t = np.arange(8000) / 16000
    vowel = (np.sin(2 * np.pi * 120 * t) + 0.5 * np.sin(2 * np.pi * 240 * t) + 0.3 * np.sin(2 * np.pi * 360 * t))
    pcm = (vowel * 8000).astype(np.int16)
    out = convert(pcm, f0_scale=1.8, formant_scale=1.0)
    assert out.dtype == np.int16 and len(out) == len(pcm)
    f0, _ = pw.dio(out.astype(np.float64) / 32768, 16000)
    assert 190 < np.median(f0[f0 > 0]) < 240


def test_engine_jobs_are_each_engines_usable_voices_with_their_own_draws():
    jobs = tv.engine_jobs("rhvoice", ["yes", "no"], ["apple"], (3, 1), (0.8, 1.25), (0.8, 1.25))
    assert {j[0].id for j in jobs} == {"rhvoice:bdl", "rhvoice:clb"}
    per_voice = [j for j in jobs if j[0].name == "clb"]
    assert [j[4][1:] for j in per_voice] == [("yes", "keyword", 0), ("yes", "keyword", 1), ("yes", "keyword", 2),
                                              ("no", "keyword", 0), ("no", "keyword", 1), ("no", "keyword", 2),
                                              ("apple", "filler", 0)]
    assert all(0.8 <= j[2] <= 1.25 and 0.8 <= j[3] <= 1.25 for j in jobs)
    assert len({(j[2], j[3]) for j in jobs}) == len(jobs)   # drawn per render, not copied
    assert tv.engine_jobs("rhvoice", ["yes"], ["apple"], (0, 0), (1, 1), (1, 1)) == []
    pico = tv.engine_jobs("pico", ["yes", "no"], ["apple"], (3, 1), (0.8, 1.25), (0.8, 1.25))
    assert {j[0].id for j in pico} == {"pico:en-US", "pico:en-GB"} and len(pico) == len(jobs)
    assert not {(j[2], j[3]) for j in pico} & {(j[2], j[3]) for j in jobs}   # a stream of their own


def test_everyday_speech_is_one_second_unknown_windows_of_training_voices(monkeypatch):
    from host.data import synth
    from host.data.words import COMMANDS10

    asked = []

    def fake_render_jobs(jobs, label):      # 1.5 s of speech-loud noise per phrase, no synthesizer
        asked.extend(jobs)
        rng = np.random.default_rng(1)
        return {j[4]: rng.integers(-4000, 4000, 24000).astype(np.int16) for j in jobs}

    monkeypatch.setattr(synth, "render_jobs", fake_render_jobs)
    c = tiny_corpus()
    rows = tv.everyday_windows(c, 4)
    by_voice = {}
    for voice, text, _rate, _pitch, (vid, _k) in asked:
        assert vid == voice.id and 2 <= len(text.split()) <= 5
        for w in text.split():
            assert not any(w.startswith(cmd) or (len(cmd) >= 3 and cmd in w) for cmd in COMMANDS10), w
        by_voice[vid] = by_voice.get(vid, 0) + 1
    # training voices only, Festival three times as many phrases
    assert by_voice == {"espeak:en-us+m1": 4, "festival:kal_diphone": 12}
    assert rows and all(k[2] == "filler" and len(v) == 16000 and v.dtype == np.int16 for k, v in rows.items())
    assert {k[0] for k in rows} == set(by_voice)
    # 1 s windows of each voice's run of phrases (1.5 s each, with pauses): about one per 1.7 s of it
    assert 4 <= sum(k[0] == "espeak:en-us+m1" for k in rows) <= 6
    merged = tv.with_supplement(c, rows)
    assert set(merged.split[len(c.text):]) == {"train"}
    assert c.eval_clips("test")[0].shape == merged.eval_clips("test")[0].shape


def test_everyday_words_are_none_of_the_words_benchmarks_speak():
    from host.data.words import FILLERS, SPEECH_COMMANDS
    from scripts._variant_data import everyday_words

    # the benchmarks' negative word pairs come from phone_words.txt, their keywords from the corpus's
    # words: everyday speech must teach none of them
    phone = set((ROOT / "host" / "data" / "phone_words.txt").read_text().split())
    every = set(everyday_words())
    assert len(every) > 7000 and not every & phone and not every & (set(FILLERS) | set(SPEECH_COMMANDS))
