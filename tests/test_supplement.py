"""The shipped recipe's supplement (host/data/supplement.py), its operating point in the manifest, and the
Detector that reads it: what `edgelearn model` adds to training goes to the training split only, in
a fixed order; a missing engine or language is one sentence naming the package; a bundle's own
thresholds are every Detector's default and a malformed table is refused."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edge.detect import THRESHOLD, Detector, bundle_thresholds
from edge.errors import EdgelearnError
from host.data import realneg, supplement, synth
from host.data.corpus import Corpus


def tiny_corpus():
    rng = np.random.default_rng(0)
    rows = [("yes", "keyword", "espeak:en-us+m1", "train"), ("apple", "filler", "espeak:en-us+m1", "train"),
            ("yes", "keyword", "espeak:en-gb+f2", "test"), ("no", "keyword", "festival:cmu_us_slt_arctic_hts", "test"),
            ("apple", "filler", "espeak:en-029+m3", "val")]
    pcm = [rng.integers(-3000, 3000, 4000 + 100 * i).astype(np.int16) for i in range(len(rows))]
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in pcm])])
    meta = {k: [r[j] for r in rows] for j, k in enumerate(("text", "kind", "voice", "split"))}
    return Corpus(np.concatenate(pcm), offsets, meta,
                  {"seed": 0, "rate": [0.8, 1.25], "pitch": [0.8, 1.25], "words": ["yes", "no"], "fillers": ["apple"]})


@pytest.fixture
def stub_engines(monkeypatch):
    """Both engines 'installed', renders of each job's text length, two real windows per language."""
    rendered = []

    def render_jobs(jobs, label):
        rendered.append(jobs)
        return {key: np.full(1000 + len(t), 2000, np.int16) for _v, t, _r, _p, key in jobs}

    monkeypatch.setattr(synth, "check_installed", lambda names: None)
    monkeypatch.setattr(synth, "render_jobs", render_jobs)
    monkeypatch.setattr(realneg, "missing", lambda langs: None)
    monkeypatch.setattr(realneg, "windows", lambda langs: [np.full(16000, 3, np.int16)] * (2 * len(langs)))
    return rendered


def test_supplement_goes_to_the_training_split_only_in_a_fixed_order(stub_engines):
    c = tiny_corpus()
    out, synths = supplement.supplemented(c, supplement.Supplement())
    assert synths == ("espeak", "festival", "rhvoice", "pico", "asterisk")
    n = len(c.text)
    assert [out.utterance(i).tolist() for i in range(n)] == [c.utterance(i).tolist() for i in range(n)]
    assert list(out.split[:n]) == list(c.split) and set(out.split[n:]) == {"train"}
    added = list(zip(out.voice[n:], out.kind[n:]))
    voices = [f"rhvoice:{v}" for v in synth.RHVOICE_VOICES] + [f"pico:{v}" for v in synth.PICO_VOICES]
    # every engine voice: 12 renders of each of 2 words, 3 of the one filler, engines in the recipe's order
    assert [v for v, _ in added[:len(voices) * 27]] == [v for v in voices for _ in range(12 * 2 + 3)]
    # then the real windows, then the everyday speech of the corpus's own training voice, as _unknown_
    real = added.index(("asterisk:fr,it", "filler"))
    assert added[real:real + 4] == [("asterisk:fr,it", "filler")] * 4
    everyday = added[real + 4:]
    assert everyday and set(everyday) == {("espeak:en-us+m1", "filler")}
    assert all(len(out.utterance(i)) == 16000 for i in range(len(out.text) - len(everyday), len(out.text)))
    everyday_jobs, engine_jobs = stub_engines[:2]
    assert {j[0].id for j in everyday_jobs} == {"espeak:en-us+m1"} and len(everyday_jobs) == 20
    assert {t for _v, t, *_ in engine_jobs} == {"yes", "no", "apple"}  # the engines never say the everyday phrases
    again, _ = supplement.supplemented(c, supplement.Supplement())
    assert np.array_equal(again.audio, out.audio)  # the draws come from the corpus's seed
    assert stub_engines[:2] == stub_engines[2:]


def test_rows_added_before_the_supplement_are_not_texts_for_the_engines(stub_engines):
    # train_variant's experiments add _unknown_ windows named "everyday 12"; an engine must not say them
    c = tiny_corpus()
    supplement.supplemented(c, supplement.Supplement(real_negatives=(), everyday=0))
    grown = supplement.with_supplement(c, {("espeak:en-us+m1", f"everyday {i}", "filler", i):
                                           np.full(16000, 5, np.int16) for i in range(3)})
    supplement.supplemented(grown, supplement.Supplement(real_negatives=(), everyday=0))
    assert stub_engines[1] == stub_engines[0]
    assert {t for _v, t, *_ in stub_engines[1]} == {"yes", "no", "apple"}


def test_an_empty_supplement_is_the_corpus(stub_engines):
    c = tiny_corpus()
    out, synths = supplement.supplemented(c, supplement.Supplement(engines=(), real_negatives=(), everyday=0))
    assert out is c and synths == ("espeak", "festival") and stub_engines == []


def test_festivals_other_voices_join_as_festival_voices(stub_engines, monkeypatch):
    """Festival's rab and don (``--festival-extra``): rendered by Festival under their own voice ids,
    after the non-free engines' and drawn from a stream of their own (the engines' draws unchanged);
    Festival is not named twice among the synthesizers trained on."""
    monkeypatch.setattr(synth, "check_festival_voices", lambda names: None)
    c = tiny_corpus()
    base = supplement.Supplement(real_negatives=(), everyday=0)
    plus = supplement.Supplement(engines=base.engines + (("festival", (2, 1)),), real_negatives=(), everyday=0)
    out, synths = supplement.supplemented(c, plus)
    assert synths == ("espeak", "festival", "rhvoice", "pico")
    jobs = stub_engines[0]
    fest = [j for j in jobs if j[0].synth == "festival"]
    assert [j[0].id for j in fest] == [f"festival:{v}" for v in synth.FESTIVAL_EXTRA_VOICES for _ in range(2 * 2 + 1)]
    supplement.supplemented(c, base)
    assert jobs[:len(jobs) - len(fest)] == stub_engines[1]   # the engines' own draws unchanged
    assert set(out.voice[len(c.text):]) >= {f"festival:{v}" for v in synth.FESTIVAL_EXTRA_VOICES}


def test_a_missing_festival_voice_names_its_package(monkeypatch, tmp_path):
    (tmp_path / "english" / "kal_diphone").mkdir(parents=True)
    monkeypatch.setattr(synth, "FESTIVAL_VOICE_DIRS", (str(tmp_path), str(tmp_path / "absent")))
    monkeypatch.setattr(synth, "check_installed", lambda names: None)
    synth.check_festival_voices(["kal_diphone"])
    with pytest.raises(EdgelearnError, match=r"Festival voice\(s\) not installed: rab_diphone, don_diphone"
                                             r".*apt-get install festvox-rablpc16k festvox-don"):
        supplement.check(supplement.Supplement(engines=(("festival", (12, 3)),), real_negatives=()))


def test_a_missing_engine_or_language_is_one_sentence(monkeypatch):
    monkeypatch.setattr(synth.shutil, "which", lambda b: None)
    with pytest.raises(EdgelearnError, match=r"not installed: pico, rhvoice.*apt-get install .*non-free"):
        supplement.check(supplement.Supplement())
    monkeypatch.setattr(synth, "check_installed", lambda names: None)
    with pytest.raises(EdgelearnError, match="real negatives language 'xx' has no prompts here; use some of"):
        supplement.check(supplement.Supplement(real_negatives=("xx",)))
    monkeypatch.setattr(realneg, "missing", lambda langs: "install Debian's asterisk-core-sounds-it-wav")
    with pytest.raises(EdgelearnError, match="asterisk-core-sounds-it-wav; or run scripts/model_deps.sh"):
        supplement.check(supplement.Supplement())


def test_recipe_writes_its_supplement_and_operating_point_to_the_card():
    from host.model_card import _operating, _supplement
    from host.recipe import OPERATING, operating_point

    op = operating_point()
    assert op["thresholds"] == OPERATING and "68 minutes" in op["chosen_on"]
    assert set(OPERATING) == {"yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"}
    assert set(operating_point(0.8)["thresholds"].values()) == {0.8}
    manifest = {"extra": {"recipe": supplement.Supplement().describe(), "operating": op}}
    text = _supplement(manifest)
    assert "bdl and clb" in text and "SVOX Pico" in text and "CC-BY-SA-3.0" in text and "CC-BY-3.0" in text
    assert "20 phrases of 2-5 words per espeak-ng training voice" in text
    assert f"yes {OPERATING['yes']:g}, no {OPERATING['no']:g}" in _operating(manifest)
    assert _supplement({"extra": {}}) == "Synthetic speech only.\n" and _operating({"extra": {}}) == ""


@pytest.mark.parametrize("bad", [{"yes": 0.8}, {**{w: 0.8 for w in ("yes", "no", "up", "down", "left", "right",
                                                                      "on", "off", "stop")}, "go": 1.5}, 0.0])
def test_an_operating_point_without_every_command_in_range_is_refused(bad):
    from host.recipe import operating_point

    with pytest.raises(EdgelearnError, match="a threshold in \\(0, 1\\] for each of the ten commands"):
        operating_point(bad)


def test_model_threshold_argument_is_a_number_or_a_json_table(tmp_path):
    from host.commands.model import threshold_arg

    assert threshold_arg(None) is None and threshold_arg("0.85") == 0.85
    (tmp_path / "t.json").write_text('{"yes": 0.8}')
    assert threshold_arg(str(tmp_path / "t.json")) == {"yes": 0.8}
    with pytest.raises(EdgelearnError, match="neither a number nor a readable JSON file; give e.g."):
        threshold_arg(str(tmp_path / "missing.json"))
    (tmp_path / "l.json").write_text("[0.8]")
    with pytest.raises(EdgelearnError, match="holds no JSON object"):
        threshold_arg(str(tmp_path / "l.json"))


class Model:
    """A keyword model stand-in: labels, and a bundle whose manifest may carry an operating point."""

    labels = ["yes", "no", "up", "_silence_", "_unknown_"]

    def __init__(self, operating=None):
        extra = {"labels12": ["yes", "no", "up", "_silence_", "_unknown_"]}
        if operating is not None:
            extra["operating"] = operating
        self.bundle = SimpleNamespace(manifest={"version": 2, "labels": self.labels, "extra": extra})


def test_a_bundles_own_operating_point_is_the_detectors_default():
    assert np.allclose(Detector(Model()).thresholds, THRESHOLD)
    own = {"thresholds": {"yes": 0.8, "no": 0.9}}
    assert np.allclose(Detector(Model(own)).thresholds, [0.8, 0.9, THRESHOLD])  # "up" has none of its own
    assert np.allclose(Detector(Model(own), keywords=["no", "up"]).thresholds, [0.9, THRESHOLD])
    assert np.allclose(Detector(Model(own), threshold=0.5).thresholds, 0.5)  # an explicit one wins
    assert bundle_thresholds(Model(own).bundle.manifest) == {"yes": 0.8, "no": 0.9}


@pytest.mark.parametrize("bad", [{"thresholds": {"maybe": 0.8}}, {"thresholds": {"yes": 1.5}},
                                 {"thresholds": {"yes": True}}, {"thresholds": []}, "0.8"])
def test_a_malformed_operating_point_is_refused_in_one_sentence(bad):
    with pytest.raises(EdgelearnError, match=r"operating point \(manifest extra.operating\) is malformed; install "
                                             "another version, or pass --threshold"):
        Detector(Model(bad))


@pytest.mark.parametrize("args, says", [
    (["--threshold", "1.5"], "an operating point needs a threshold in (0, 1] for each of the ten commands"),
    (["--threshold", "nope.json"], "--threshold 'nope.json' is neither a number nor a readable JSON file"),
    ([], "speech synthesizer(s) not installed: pico, rhvoice"),
])
def test_edgelearn_model_refuses_bad_input_in_one_sentence_before_any_work(tmp_path, args, says):
    """`edgelearn model` with a bad operating point, or without the recipe's engines (PATH holds none),
    says so in one line before rendering or training anything, and writes nothing."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    r = subprocess.run([sys.executable, "-m", "edge.cli", "model", "--out", str(tmp_path / "out"),
                        "--work", str(tmp_path / "work"), "--key", str(tmp_path / "k" / "release.key"),
                        "--pubkey-out", str(tmp_path / "pub"), *args],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not any((tmp_path / d).exists() for d in ("out", "work", "k", "pub"))


def test_edgelearn_model_trains_the_recipe_on_the_recipes_seed(monkeypatch, tmp_path):
    """Version 3's weights are seed 1 of the recipe (host/recipe.py SEED): `edgelearn model` without
    --reuse trains the supplemented corpus with it, for the recipe's epochs."""
    import host.data.corpus
    import host.train
    from host import recipe

    class Trained(Exception):
        pass

    seen = {}

    def fake_train(work, **kw):
        seen.update(kw, work=work)
        raise Trained

    monkeypatch.setattr(supplement, "check", lambda sup: None)
    monkeypatch.setattr(supplement, "supplemented", lambda corpus, sup: ((corpus, sup), ("espeak", "asterisk")))
    monkeypatch.setattr(host.data.corpus, "build_corpus", lambda: "the corpus")
    monkeypatch.setattr(host.train, "train", fake_train)
    with pytest.raises(Trained):
        recipe.rebuild(tmp_path / "out", work=tmp_path / "work", key=tmp_path / "k" / "release.key")
    assert seen["seed"] == recipe.SEED == 1 and seen["epochs"] == recipe.EPOCHS and seen["work"] == tmp_path / "work"
    assert seen["corpus"] == ("the corpus", supplement.Supplement()) and seen["synths"] == ("espeak", "asterisk")
    assert supplement.Supplement().everyday == 20
