"""Building the phrase second stage into a bundle (host/phrase_stage.py; ``edgelearn model`` runs it,
scripts/build_phrase_stage.py on an existing bundle): the cutoffs are the lowest that keep the
negatives' candidates out, the bundle is signed again and loads as a device loads it, the model
card has one section however often it runs, and without development prompts nothing changes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from edge.kws import DEFAULT_BUNDLE

pytestmark = pytest.mark.skipif(not (DEFAULT_BUNDLE / "manifest.json").exists(),
                                reason="models/kws-dscnn-s not built yet (make model)")
NEAR_MISSES = ("yesterday", "nobody", "upper", "downtown", "lefty", "righteous", "only", "office", "stopwatch",
               "golden", "yes sir", "go on")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A bare copy of the shipped bundle (no phrase models, signed with a throwaway key whose .pub
    is beside it), the shipped phrase models as trained files, and ~40 s of near misses said by two
    training voices as the negatives."""
    from test_phrase_stage_wiring import strip_phrase_stage

    from host.data.synth import Voice, render

    tmp = tmp_path_factory.mktemp("phrase_build")
    models = tmp / "models"
    models.mkdir()
    bare, priv, cfg = strip_phrase_stage(tmp, models_to=models)
    files = {c: [models / f"{c}{'_%d' % i if i else ''}.tflite" for i in range(len(names))]
             for c, names in cfg["models"].items()}
    parts = []
    for v in ("en-us+m1", "en-gb+f4"):
        for clip in render(Voice("espeak", v), [(w, 1.0, 1.0) for w in NEAR_MISSES]):
            parts += [clip.astype(np.float32), np.zeros(12000, np.float32)]
    x = np.concatenate(parts)
    x += np.random.default_rng(0).standard_normal(x.size).astype(np.float32) * 3
    return {"bare": bare, "key": priv, "files": files, "negatives": [(x.astype(np.int16), None)],
            "shipped": cfg}


def _copy(world, tmp_path):
    d = tmp_path / "b"
    shutil.copytree(world["bare"], d)
    return d


def test_cutoffs_are_the_lowest_that_keep_the_negatives_out(world, tmp_path):
    from edge.bundle import load_bundle
    from host import phrase_stage as P

    bundle = load_bundle(world["bare"], trusted_keys=world["key"].with_suffix(".pub"))
    cfg = P.choose(bundle, world["files"], world["negatives"], "near misses")
    assert set(cfg["cutoffs"]) == set(world["files"]) and cfg["after_s"] == P.AFTER_S
    assert cfg["first_stage"] == P.FIRST_STAGE and cfg["chosen_on"].endswith("near misses")
    stage = P.Stage(world["files"])
    cands = P.candidates(bundle, stage, world["negatives"][0][0], P.FIRST_STAGE)
    assert cands, "the near misses open no candidate: the test would not test anything"
    for c, cut in cfg["cutoffs"].items():
        assert cut in P.GRID
        mine = [e for e in P.accepted(cands, P.FIRST_STAGE, {c: cut}) if e["keyword"] == c]
        assert not mine or cut == 1.0, (c, cut, mine)  # none gets through, but a saturated output
        i = P.GRID.index(cut)
        if i:  # one step lower lets one through: the lowest such cutoff
            lower = [e for e in P.accepted(cands, P.FIRST_STAGE, {c: P.GRID[i - 1]}) if e["keyword"] == c]
            assert lower, (c, cut)


def test_the_stage_goes_into_the_bundle_signed_and_loads_as_a_device_loads_it(world, tmp_path):
    from edge.bundle import load_bundle
    from edge.device_detect import default_stage
    from edge.phrase_stage import PhraseConfirm
    from host import phrase_stage as P

    d = _copy(world, tmp_path)
    pub = world["key"].with_suffix(".pub")
    cfg = P.choose(load_bundle(d, trusted_keys=pub), world["files"], world["negatives"], "near misses")
    for _ in range(2):  # run again: one card section, the same bundle
        P.add_to_bundle(d, world["files"], cfg, world["key"], recipe={"seed": 0})
    b = load_bundle(d, trusted_keys=pub)
    assert b.manifest["extra"]["phrase_stage"] == {**cfg, "recipe": {"seed": 0}}
    assert (d / "MODEL_CARD.md").read_text().count(P.CARD_HEADING.strip()) == 1
    stage = default_stage(b)
    assert isinstance(stage, PhraseConfirm) and stage.cutoffs == cfg["cutoffs"]
    assert all((d / name).read_bytes() == f.read_bytes() for c, fs in world["files"].items()
               for name, f in zip(P.bundle_names(c, len(fs)), fs))
    assert all(len(fs) == 2 for fs in world["files"].values())
    one = {c: fs[:1] for c, fs in world["files"].items()}  # one seed each now: the second files go
    P.add_to_bundle(d, one, {**cfg, "models": {c: P.bundle_names(c, 1) for c in one}}, world["key"])
    assert not list(d.glob("phrase_*_1.tflite")) and len(list(d.glob("phrase_*.tflite"))) == 10
    assert load_bundle(d, trusted_keys=pub).manifest["extra"]["phrase_stage"]["models"]["yes"] == ["phrase_yes.tflite"]


def test_build_uses_the_development_negatives_and_without_them_changes_nothing(world, tmp_path, monkeypatch,
                                                                                 capsys):
    from edge.bundle import load_bundle
    from host import phrase_stage as P

    d = _copy(world, tmp_path)
    before = {f.name: f.read_bytes() for f in d.iterdir()}
    monkeypatch.setattr(P, "development_negatives", lambda: None)
    assert P.build(d, tmp_path / "work", world["key"], files=world["files"]) is None
    assert "no phrase second stage" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in d.iterdir()} == before
    monkeypatch.setattr(P, "development_negatives", lambda: (world["negatives"], "near misses"))
    cfg = P.build(d, tmp_path / "work", world["key"], files=world["files"])
    assert cfg is not None and not (tmp_path / "work").exists()  # files given: nothing trained
    got = load_bundle(d, trusted_keys=world["key"].with_suffix(".pub")).manifest["extra"]["phrase_stage"]
    assert got["cutoffs"] == cfg["cutoffs"] and got["recipe"]["user_clips"] == 0


def test_edgelearn_model_builds_the_stage_unless_told_not_to(monkeypatch):
    import argparse

    from host.commands import model

    seen = []
    monkeypatch.setattr(model, "rebuild", lambda *a, **k: seen.append(k) or "key")
    for argv, want in (([], True), (["--no-phrase-models"], False)):
        p = argparse.ArgumentParser()
        model.add_arguments(p)
        assert model.run(p.parse_args(argv)) == 0
        assert seen.pop()["phrase"] is want


def test_the_shipped_cutoffs_are_what_this_code_chooses_on_the_shipped_footing():
    """The shipped ``extra.phrase_stage`` names this module's constants (a change to them without a
    rebuild of the shipped bundle would leave the two apart)."""
    from host import phrase_stage as P

    cfg = json.loads((DEFAULT_BUNDLE / "manifest.json").read_text())["extra"]["phrase_stage"]
    assert (cfg["first_stage"], cfg["before_s"], cfg["after_s"], cfg["target_fa_h"]) == \
        (P.FIRST_STAGE, P.BEFORE_S, P.AFTER_S, P.TARGET_FA_H)
    assert set(cfg["cutoffs"].values()) <= set(P.GRID)


def test_training_has_the_voices_outside_the_corpus_say_each_command(monkeypatch, tmp_path):
    """Each seed's model of a command is the ESPHome recipe with ``OTHER_VOICES`` (RHVoice's and Pico's
    voices saying it and the corpus's words, since session 44), no user clip."""
    from host import phrase_stage as P
    from host.export import esphome as E

    seen = []
    monkeypatch.setattr(E, "export_esphome", lambda c, wavs, d, cfg, **k: seen.append((c, cfg.seed, cfg.other_voices,
                                                                                       k["clips"], k["min_clips"])))
    files = P.train(["yes"], tmp_path, corpus=object())
    assert seen == [("yes", s, P.OTHER_VOICES, [], 0) for s in P.SEEDS_TRAIN]
    assert files == {"yes": [tmp_path / f"s{s}" / "yes" / "yes.tflite" for s in P.SEEDS_TRAIN]}
