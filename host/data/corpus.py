"""The synthetic keyword-spotting corpus: render, split by speaker, cache, make eval clips.

Every voice (one synthesizer speaker, see :mod:`host.data.synth`) belongs to
exactly one split, chosen deterministically from the seed: espeak-ng voices go
to train/val/test, one Festival voice is held out for test, and Flite (a third
engine never trained on) is the ``unseen`` split. Utterances are stored clean
and trimmed; :meth:`Corpus.eval_clips` places them in a 1 s window and mixes
in white/pink/brown noise or babble at a random SNR, deterministically.

    >>> corpus = build_corpus(seed=0)              # renders once, then loads the cache
    >>> x, y = corpus.eval_clips("test")           # (N, 16000) int16, ids into LABELS
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from edge.atomic import replace_dir
from host.data import noise as N
from host.data import synth
from host.data.words import CUSTOM_PHRASES, FILLERS, LABELS, SILENCE, SPEECH_COMMANDS, UNKNOWN

FORMAT = 3  # bump when rendering or the file layout changes
SPLITS = ("train", "val", "test", "unseen")


def default_cache_dir() -> Path:
    """``$EDGELEARN_CACHE``; else, in a source checkout, ``<checkout>/.cache/edgelearn``; else (installed
    from a wheel) the user's cache, ``$XDG_CACHE_HOME/edgelearn`` or ``~/.cache/edgelearn``."""
    env = os.environ.get("EDGELEARN_CACHE")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "host" / "data").is_dir():
        return root / ".cache" / "edgelearn"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "edgelearn"


@dataclass
class CorpusConfig:
    seed: int = 0
    keyword_renders: dict = field(default_factory=lambda: {"espeak": 3, "festival": 12, "flite": 4})
    filler_renders: dict = field(default_factory=lambda: {"espeak": 1, "festival": 3, "flite": 1})
    custom_renders: dict = field(default_factory=lambda: {"espeak": 2, "festival": 4, "flite": 3})
    espeak_test: int = 10
    espeak_val: int = 8
    rate: tuple = (0.8, 1.25)
    pitch: tuple = (0.8, 1.25)
    synths: tuple = ("espeak", "festival", "flite")
    words: list = field(default_factory=lambda: list(SPEECH_COMMANDS))
    fillers: list = field(default_factory=lambda: list(FILLERS))
    custom: list = field(default_factory=lambda: list(CUSTOM_PHRASES))
    voices_limit: int = 0  # >0: only this many espeak voices (tests)

    def key(self) -> str:
        blob = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def assign_splits(voices: list[synth.Voice], cfg: CorpusConfig) -> dict[str, str]:
    rng = np.random.default_rng(cfg.seed)
    out: dict[str, str] = {}
    esp = [v for v in voices if v.synth == "espeak"]
    order = rng.permutation(len(esp))
    for rank, i in enumerate(order):
        split = ("test" if rank < cfg.espeak_test else
                 "val" if rank < cfg.espeak_test + cfg.espeak_val else "train")
        out[esp[i].id] = split
    fest = [v for v in voices if v.synth == "festival"]
    for rank, i in enumerate(rng.permutation(len(fest))):
        out[fest[i].id] = "test" if rank == 0 else "train"
    for v in voices:
        if v.synth == "flite":
            out[v.id] = "unseen"
    return out


class Progress:
    """A one-line progress display on stderr (no dependency)."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done, self.t0 = total, label, 0, time.time()
        self._shown = 0.0

    def step(self, n: int = 1) -> None:
        if synth.stopping():  # interrupted: no progress line after the command's last word
            return
        self.done += n
        now = time.time()
        if now - self._shown < 0.5 and self.done < self.total:
            return
        self._shown = now
        el = now - self.t0
        eta = el / self.done * (self.total - self.done) if self.done else 0
        sys.stderr.write(f"\r{self.label}: {self.done}/{self.total} ({el:.0f}s, ~{eta:.0f}s left)   ")
        if self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


class Corpus:
    """Clean utterances plus their metadata; eval clips are derived deterministically."""

    def __init__(self, audio: np.ndarray, offsets: np.ndarray, meta: dict, config: dict):
        self.audio, self.offsets, self.config = audio, offsets, config
        self.text = np.asarray(meta["text"])
        self.kind = np.asarray(meta["kind"])
        self.voice = np.asarray(meta["voice"])
        self.split = np.asarray(meta["split"])
        self.seed = int(config.get("seed", 0))

    def __len__(self) -> int:
        return len(self.text)

    def utterance(self, i: int) -> np.ndarray:
        return self.audio[self.offsets[i]:self.offsets[i + 1]]

    def select(self, split=None, kinds=("keyword", "filler"), synths=None) -> np.ndarray:
        m = np.isin(self.kind, kinds)
        if split is not None:
            m &= np.isin(self.split, [split] if isinstance(split, str) else list(split))
        if synths is not None:
            m &= np.isin(np.array([v.split(":")[0] for v in self.voice]), list(synths))
        return np.nonzero(m)[0]

    def label_of(self, i: int) -> int:
        return LABELS.index(self.text[i]) if self.kind[i] == "keyword" else LABELS.index(UNKNOWN)

    def eval_clips(self, split: str, synths=None, silence_share: float = 1 / 37,
                   clean_share: float = 0.2, snr=(5.0, 30.0)):
        """Fixed 1 s clips for a split: (x int16 (N, 16000), y ids into LABELS, voice ids)."""
        idx = self.select(split, synths=synths)
        if idx.size == 0:
            raise ValueError(f"no utterances in split {split!r} for synthesizers {synths}")
        rng = np.random.default_rng([self.seed, SPLITS.index(split) if split in SPLITS else 9, 7])
        pool = [self.utterance(i) for i in self.select(split, kinds=("filler",))] or \
               [self.utterance(i) for i in idx]
        n_sil = max(1, int(round(len(idx) * silence_share)))
        x = np.stack([N.place(rng, self.utterance(i)) for i in idx] +
                     [np.zeros(16000, np.float32)] * n_sil)
        y = np.array([self.label_of(i) for i in idx] + [LABELS.index(SILENCE)] * n_sil)
        voices = np.array([self.voice[i] for i in idx] + ["noise"] * n_sil)
        x = add_background(rng, x, pool, speech_rows=len(idx), clean_share=clean_share, snr=snr)
        return np.clip(np.round(x), -32768, 32767).astype(np.int16), y, voices

    def custom_clips(self, splits=("test", "unseen"), snr=(10.0, 30.0), clean_share=0.3):
        """Custom phrases (never trained on) from held-out voices: (x int16, phrase, voice)."""
        idx = self.select(splits, kinds=("custom",))
        rng = np.random.default_rng([self.seed, 99])
        pool = [self.utterance(i) for i in self.select(splits, kinds=("filler",))]
        x = np.stack([N.place(rng, self.utterance(i)) for i in idx])
        x = add_background(rng, x, pool, speech_rows=len(idx), clean_share=clean_share, snr=snr)
        return (np.clip(np.round(x), -32768, 32767).astype(np.int16), self.text[idx],
                self.voice[idx])


def add_background(rng, x: np.ndarray, pool, speech_rows: int, clean_share=0.2,
                   snr=(5.0, 30.0)) -> np.ndarray:
    """Mix noise into speech rows at random SNR; give silence rows noise at random level."""
    n = x.shape[0]
    kinds = rng.integers(0, 4, n)  # white, pink, brown, babble
    bg = np.empty_like(x)
    for k, colour in enumerate(N.COLOURS):
        rows = np.nonzero(kinds == k)[0]
        if rows.size:
            bg[rows] = N.coloured_noise(rng, colour, (rows.size, x.shape[1]))
    rows = np.nonzero(kinds == 3)[0]
    if rows.size:
        bg[rows] = N.babble(rng, pool, rows.size, x.shape[1])
    out = x.copy()
    sp = np.arange(n) < speech_rows
    noisy = sp & (rng.random(n) >= clean_share)
    if noisy.any():
        out[noisy] = N.mix_at_snr(x[noisy], bg[noisy], rng.uniform(*snr, noisy.sum()))
    sil = ~sp
    if sil.any():
        # Background only: coloured noise up to -20 dBFS, babble no louder than
        # -45 dBFS (louder babble is speech, and would be label noise).
        top = np.where(kinds[sil] == 3, -45.0, -20.0)
        level = 32767.0 * 10 ** (rng.uniform(-70, top) / 20)  # dBFS RMS
        out[sil] = bg[sil] * level[:, None]
    return out


def _jobs_for(voice: synth.Voice, cfg: CorpusConfig, rng) -> list[tuple]:
    jobs = []
    for kind, texts, renders in (("keyword", cfg.words, cfg.keyword_renders),
                                 ("filler", cfg.fillers, cfg.filler_renders),
                                 ("custom", cfg.custom, cfg.custom_renders)):
        for t in texts:
            for _ in range(renders[voice.synth]):
                jobs.append((t, float(rng.uniform(*cfg.rate)), float(rng.uniform(*cfg.pitch)), kind))
    return jobs


def render_all(cfg: CorpusConfig, workers: int = 2, progress: bool = True):
    voices = [v for v in synth.all_voices() if v.synth in cfg.synths]
    if cfg.voices_limit:
        esp = [v for v in voices if v.synth == "espeak"][: cfg.voices_limit]
        voices = esp + [v for v in voices if v.synth != "espeak"]
    synth.check_installed({v.synth for v in voices})
    splits = assign_splits(voices, cfg)
    plan = {v: _jobs_for(v, cfg, np.random.default_rng([cfg.seed, i]))
            for i, v in enumerate(voices)}
    bar = Progress(sum(len(j) for j in plan.values()), "data synth") if progress else None
    results: dict[synth.Voice, list] = {}

    def work(v):
        jobs = plan[v]
        if v.synth == "festival":  # batch per voice; chunk so progress moves
            out = []
            for a in range(0, len(jobs), 60):
                out += synth.render(v, [j[:3] for j in jobs[a:a + 60]])
                if bar:
                    bar.step(len(jobs[a:a + 60]))
            return out
        out = []
        for j in jobs:
            out += synth.render(v, [j[:3]])
            if bar:
                bar.step()
        return out

    # Longest tasks (Festival) first so the pool finishes together.
    order = sorted(voices, key=lambda v: -len(plan[v]) * (5 if v.synth == "festival" else 1))
    # Ctrl-C (or a failed render) cancels the queued voices and kills the running synthesizers.
    with synth.pooled(work, order, workers=workers) as rendered:
        for v, res in rendered:
            results[v] = res
    audio, offsets, meta = [], [0], {"text": [], "kind": [], "voice": [], "split": []}
    for v in voices:
        for (text, _r, _p, kind), pcm in zip(plan[v], results[v]):
            audio.append(pcm)
            offsets.append(offsets[-1] + len(pcm))
            meta["text"].append(text)
            meta["kind"].append(kind)
            meta["voice"].append(v.id)
            meta["split"].append(splits[v.id])
    return np.concatenate(audio), np.array(offsets, dtype=np.int64), meta


def build_corpus(cfg: CorpusConfig | None = None, cache_dir=None, workers: int = 2,
                 progress: bool = True, force: bool = False) -> Corpus:
    """Render the corpus (or load it from the cache) and return it."""
    cfg = cfg or CorpusConfig()
    cache = Path(cache_dir or default_cache_dir()) / f"corpus-{cfg.key()}"
    if cache.exists() and not force:
        try:
            return load_corpus(cache)
        except (OSError, ValueError, KeyError):
            shutil.rmtree(cache, ignore_errors=True)  # a damaged cache is rebuilt
    audio, offsets, meta = render_all(cfg, workers=workers, progress=progress)
    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "audio.npy", audio)
    np.save(tmp / "offsets.npy", offsets)
    (tmp / "meta.json").write_text(json.dumps(meta))
    (tmp / "config.json").write_text(json.dumps(asdict(cfg), indent=1))
    replace_dir(tmp, cache)
    return load_corpus(cache)


def load_corpus(path) -> Corpus:
    path = Path(path)
    audio = np.load(path / "audio.npy", mmap_mode="r")
    offsets = np.load(path / "offsets.npy")
    meta = json.loads((path / "meta.json").read_text())
    config = json.loads((path / "config.json").read_text())
    if len(offsets) != len(meta["text"]) + 1 or offsets[-1] != len(audio):
        raise ValueError(f"corpus cache {path} is inconsistent")
    return Corpus(np.asarray(audio), offsets, meta, config)
