"""Corpus: speaker-disjoint, deterministic splits; eval clips; the user-folder loader's errors."""

import shutil
import wave

import numpy as np
import pytest

from edge.errors import EdgelearnError
from host.data.corpus import CorpusConfig, assign_splits, build_corpus
from host.data import synth
from host.data.folder import load_folder
from host.data.words import CUSTOM_PHRASES, FILLERS, LABELS, SPEECH_COMMANDS

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None or shutil.which("flite") is None,
                                  reason="espeak-ng/flite not installed (scripts/bootstrap.sh installs them)")


def test_full_plan_is_speaker_disjoint_and_deterministic():
    voices = synth.all_voices()
    assert len([v for v in voices if v.synth == "espeak"]) >= 24
    assert len({v.id for v in voices}) == len(voices)
    a = assign_splits(voices, CorpusConfig(seed=0))
    b = assign_splits(voices, CorpusConfig(seed=0))
    c = assign_splits(voices, CorpusConfig(seed=1))
    assert a == b and a != c
    # each voice in exactly one split; every split has voices; Flite only in `unseen`
    assert set(a.values()) == {"train", "val", "test", "unseen"}
    assert all(s == "unseen" for v, s in a.items() if v.startswith("flite:"))
    fest = [s for v, s in a.items() if v.startswith("festival:")]
    assert fest.count("test") == 1 and fest.count("train") == 2


def test_word_lists():
    assert len(SPEECH_COMMANDS) == 35 and len(LABELS) == 37
    homophones = {"know", "write", "for", "won", "to", "too", "fore"}
    assert not homophones & set(FILLERS)
    assert not set(CUSTOM_PHRASES) & set(SPEECH_COMMANDS + FILLERS)


@needs_espeak
def test_small_corpus_build_cache_and_clips(tmp_path):
    cfg = CorpusConfig(seed=0, voices_limit=10, words=["yes", "no"], fillers=["apple", "river"],
                       custom=["banana"], synths=("espeak", "flite"), espeak_test=2, espeak_val=2)
    c = build_corpus(cfg, cache_dir=tmp_path, progress=False)
    assert (tmp_path / f"corpus-{cfg.key()}" / "audio.npy").exists()
    # speaker-disjoint
    by_voice = {}
    for v, s in zip(c.voice, c.split):
        by_voice.setdefault(v, set()).add(s)
    assert all(len(s) == 1 for s in by_voice.values())
    # the cache is reused and identical
    c2 = build_corpus(cfg, cache_dir=tmp_path, progress=False)
    np.testing.assert_array_equal(c.audio, c2.audio)
    x, y, v = c.eval_clips("test")
    x2, y2, _ = c2.eval_clips("test")
    assert x.shape[1] == 16000 and x.dtype == np.int16
    np.testing.assert_array_equal(x, x2)
    assert set(LABELS[i] for i in y) <= {"yes", "no", "_unknown_", "_silence_"}
    assert "_silence_" in {LABELS[i] for i in y}
    assert not np.isin(c.select("train"), c.select(kinds=("custom",))).any()
    xc, phrase, _ = c.custom_clips(("test", "unseen"))
    assert set(phrase) == {"banana"} and len(xc) == len(phrase)


def _wav(path, rate=16000, channels=1, n=16000):
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x10\x00" * n * channels)


def test_folder_loader(tmp_path):
    _wav(tmp_path / "yes" / "a.wav")
    _wav(tmp_path / "no" / "b.wav", n=12000)
    _wav(tmp_path / "_background_noise_" / "n.wav", n=48000)
    ds = load_folder(tmp_path, expect=["yes", "no"])
    assert ds.labels == ["no", "yes"] and ds.x.shape == (2, 16000) and len(ds.noise) == 1
    with pytest.raises(EdgelearnError, match="missing class folder.*stop"):
        load_folder(tmp_path, expect=["yes", "stop"])


def test_folder_loader_lists_every_bad_file(tmp_path):
    _wav(tmp_path / "yes" / "ok.wav")
    _wav(tmp_path / "yes" / "rate.wav", rate=8000)
    _wav(tmp_path / "no" / "stereo.wav", channels=2)
    (tmp_path / "no" / "trunc.wav").write_bytes((tmp_path / "yes" / "ok.wav").read_bytes()[:5000])
    with pytest.raises(EdgelearnError) as e:
        load_folder(tmp_path)
    msg = str(e.value)
    assert "3 problem(s)" in msg and "8000 Hz" in msg and "2 channels" in msg and "truncated" in msg
    with pytest.raises(EdgelearnError, match="not a directory"):
        load_folder(tmp_path / "nope")


def test_default_cache_dir_checkout_wheel_and_env(tmp_path, monkeypatch):
    from pathlib import Path

    from host.data import corpus

    monkeypatch.delenv("EDGELEARN_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    root = Path(corpus.__file__).resolve().parents[2]
    assert corpus.default_cache_dir() == root / ".cache" / "edgelearn"  # a source checkout
    # installed from a wheel: no checkout around the package
    monkeypatch.setattr(corpus, "__file__", str(tmp_path / "site-packages" / "host" / "data" / "corpus.py"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert corpus.default_cache_dir() == tmp_path / "home" / ".cache" / "edgelearn"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert corpus.default_cache_dir() == tmp_path / "xdg" / "edgelearn"
    monkeypatch.setenv("EDGELEARN_CACHE", str(tmp_path / "mine"))
    assert corpus.default_cache_dir() == tmp_path / "mine"


def test_ctrl_c_between_two_results_cancels_the_queue_even_with_its_traceback_kept():
    """Ctrl-C lands in the consumer's own code (between two results of ``pool_map``) and something
    keeps the traceback (so the generator is not collected): ``pooled`` still closes it, so the
    queued renders are cancelled and only those already running finish (the hang a full test run
    under load once showed: `data synth` rendering its whole queue after SIGINT)."""
    import threading

    gate, calls, kept = threading.Event(), [], []

    def render(i):
        calls.append(i)
        if i >= 2:
            gate.wait(30)   # held until the consumer has gone (a guard against a hang, not a timing)
        return i

    before = set(threading.enumerate())
    try:
        with synth.pooled(render, range(200), workers=2) as results:
            for _item, _res in results:
                raise KeyboardInterrupt
    except KeyboardInterrupt as e:
        kept.append(e)   # its traceback holds the consumer's frame and so the generator
    gate.set()
    for t in set(threading.enumerate()) - before:
        t.join(30)
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert len(calls) <= 4, calls   # the two workers' items when it was interrupted, not the queue
