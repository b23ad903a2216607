"""What ``edgelearn export voices`` trains its phrase models against and says it did
(``host.custom_voices.teach``, the export itself faked: the models' training is
tests/test_export_esphome.py's, their use at detection tests/test_custom_voices.py's)."""

from __future__ import annotations

import shutil

import pytest

from devstate_helpers import make_keyword_clips
from voices_helpers import NAME, entry as _entry
from edge import custom_voices as CV
from edge.device import Device

MODEL = b"phrase model bytes (the export is faked; teach writes them as they come)"


@pytest.fixture(scope="module")
def enrolled(tmp_path_factory):
    """A state with NAME enrolled from 5 buzz clips (kept, as ``export voices`` reads them)."""
    root = tmp_path_factory.mktemp("enrolled")
    Device(root / "st").enroll(NAME, make_keyword_clips(root / "clips"))
    return root / "st"


def test_the_real_prompts_train_the_models_where_installed_and_are_said_missing_otherwise(monkeypatch):
    """``export voices`` trains against Debian's French and Italian prompts where they are installed
    (and its entry then opens ``CV.LOWER_REAL`` logit lower, its cutoff ``CV.CUTOFF_REAL``); without
    them it says which packages and trains as before, at the recipe's point."""
    from host import custom_voices as HCV
    from host.data import realneg

    said = []
    monkeypatch.setattr(realneg, "missing", lambda langs: None)
    assert HCV.real_speech(said.append) == HCV.REAL_SPEECH == ("fr", "it") and said == []
    monkeypatch.setattr(realneg, "missing", lambda langs: "real-speech negatives need Debian's asterisk-core-sounds-fr-wav")
    assert HCV.real_speech(said.append) == ()
    assert len(said) == 1 and "asterisk-core-sounds-fr-wav" in said[0] and "model_deps.sh" in said[0]
    assert CV.LOWER_REAL > CV.LOWER == 0.0 and CV.CUTOFF_REAL <= CV.CUTOFF
    assert CV.point(HCV.REAL_SPEECH) == {"lower": CV.LOWER_REAL, "cutoff": CV.CUTOFF_REAL}
    assert CV.point(()) == CV.point([]) == {"lower": CV.LOWER, "cutoff": CV.CUTOFF}


def _faked_export(monkeypatch, tmp_path, model: bytes) -> list:
    """``export_esphome`` faked for ``teach``: each call's ``ExportConfig`` kept (the list returned),
    ``model`` written as the model it trained."""
    from types import SimpleNamespace

    from host.export import esphome as E

    cfgs = []

    def fake_export(name, wavs, out, cfg, corpus=None, clips=None):
        cfgs.append(cfg)
        path = tmp_path / f"m{len(cfgs)}.tflite"
        path.write_bytes(model)
        return SimpleNamespace(model_path=path)

    monkeypatch.setattr(E, "export_esphome", fake_export)
    return cfgs


def test_models_trained_against_real_speech_are_three_draws_at_the_three_models_point(enrolled, tmp_path,
                                                                                        monkeypatch):
    """Against the real prompts ``export voices`` trains seeds 0, 1 and 2 (``CV.SEEDS_REAL``: three
    draws' mean gives a majority where two disagree, session 51) and writes the point chosen for
    three; without them two draws at the recipe's point, as before."""
    import dataclasses

    from host import custom_voices as HCV
    from host.export import esphome as E
    from host.data import synth as S

    cfgs = _faked_export(monkeypatch, tmp_path, MODEL)
    cfg = E.ExportConfig(real_speech=("fr", "it"), log=lambda m: None)
    for real, want in ((("fr", "it"), CV.SEEDS_REAL), ((), CV.SEEDS)):
        st = tmp_path / f"st{len(real)}"
        shutil.copytree(enrolled, st)
        cfgs.clear()
        rep = HCV.teach(st, None, NAME, cfg=dataclasses.replace(cfg, real_speech=real), corpus=None,
                        voices=[S.Voice("espeak", "en-us")])
        assert [(c.seed, tuple(c.real_speech)) for c in cfgs] == [(s, real) for s in want] and CV.seeds(real) == want
        v = _entry(st)["voices"]
        assert [m.rsplit("_", 1)[1] for m in v["models"]] == [f"{s}.tflite" for s in want]
        assert all((st / m).read_bytes() == MODEL for m in v["models"])
        assert {k: v[k] for k in ("lower", "cutoff")} == CV.point(real) == {k: rep[k] for k in ("lower", "cutoff")}
    assert CV.SEEDS_REAL == (0, 1, 2) and CV.SEEDS == (0, 1) and CV.point(("fr",))["cutoff"] == CV.CUTOFF_REAL


def test_export_voices_trains_against_the_users_clips_with_their_halves_swapped(enrolled, tmp_path, monkeypatch):
    """Without a config ``export voices`` trains every phrase model with ``USER_SWAPPED`` (2) swapped
    copies per augmented user clip among its negatives (session 52: fewer false accepts on synthetic
    talk); the export recipe's default stays off."""
    from host import custom_voices as HCV
    from host.data import synth as S
    from host.export import esphome as E

    cfgs = _faked_export(monkeypatch, tmp_path, MODEL)
    st = tmp_path / "st"
    shutil.copytree(enrolled, st)
    HCV.teach(st, None, NAME, corpus=None, voices=[S.Voice("espeak", "en-us")], log=lambda m: None)
    assert len(cfgs) == len(CV.seeds(cfgs[0].real_speech)) >= 2
    assert [c.user_swapped for c in cfgs] == [HCV.USER_SWAPPED] * len(cfgs) and HCV.USER_SWAPPED == 2
    assert [c.seed for c in cfgs] == list(CV.seeds(cfgs[0].real_speech)) and E.ExportConfig().user_swapped == 0


def test_export_voices_says_what_it_trained_against(enrolled, monkeypatch, capsys):
    """The command's one line names the models, the opening and, where it was used, the real speech."""
    from edge.cli import main
    from host import custom_voices as HCV

    rep = {"keyword": NAME, "voices": 48, "models": ["st/voices/a_0.tflite", "st/voices/a_1.tflite"],
           **CV.point(["fr", "it"]), "real_speech": ["fr", "it"], "heads": 2, "threshold": 0.5, "cpu_s": 1.0}
    monkeypatch.setattr(HCV, "teach", lambda *a, **k: rep)
    assert main(["export", "voices", "--state", str(enrolled), "--keyword", NAME]) == 0
    out = capsys.readouterr().out
    assert "trained against real fr and it speech too" in out and f"opened {CV.LOWER_REAL:g} lower in logit" in out
    monkeypatch.setattr(HCV, "teach", lambda *a, **k: {**rep, "real_speech": [], "lower": 0.0})
    assert main(["export", "voices", "--state", str(enrolled), "--keyword", NAME]) == 0
    out = capsys.readouterr().out
    assert "real" not in out and "opened 0 lower in logit" in out
