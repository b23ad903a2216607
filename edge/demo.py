"""``edgelearn demo``: the end-to-end demo on the shipped model.

Verifies the shipped, signed bundle, synthesises a few clips with voices the
model never trained on (Flite, and held-out espeak-ng voices), adds noise, and
prints what the int8 encoder heard for each, with LiteRT and ONNX Runtime side
by side.

    $ edgelearn demo
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

WORDS = ["yes", "stop", "left", "go", "seven", "down", "banana", None]


def held_out_voices() -> list:
    """Flite (never trained on) and the corpus's test-split voices, alternating."""
    from host.data import synth
    from host.data.corpus import CorpusConfig, assign_splits

    split = assign_splits(synth.all_voices(), CorpusConfig())
    test = sorted((v for v in synth.all_voices() if split[v.id] == "test"), key=lambda v: v.id)
    flite = [v for v in synth.all_voices() if v.synth == "flite"]
    return [v for pair in zip(flite * 4, test[::2]) for v in pair]


def add_arguments(p) -> None:
    p.add_argument("--bundle", type=Path, default=None, help="bundle (default: models/kws-dscnn-s)")
    p.add_argument("--pubkey", type=Path, default=None, help="trusted public key file or directory")
    p.add_argument("--save", type=Path, default=None, help="also write the clips here as WAV")


def make_clips(seed: int = 7):
    from host.data import noise as N
    from host.data.synth import check_installed, render

    voices = held_out_voices()
    check_installed({v.synth for v in voices})
    rng = np.random.default_rng(seed)
    out = []
    for word, voice in zip(WORDS, voices):
        if word is None:
            x = N.coloured_noise(rng, "pink", (1, 16000))[0] * 300.0
            out.append(("(background noise)", "-", x))
            continue
        [pcm] = render(voice, [(word, 1.0, 1.0)])
        x = N.place(rng, pcm)
        x = N.mix_at_snr(x[None], N.coloured_noise(rng, "brown", (1, 16000)), [20.0])[0]
        out.append((word, voice.id, x))
    return [(w, v, np.clip(np.round(x), -32768, 32767).astype(np.int16)) for w, v, x in out]


def run(args) -> int:
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from host.data.words import label12

    path = args.bundle or DEFAULT_BUNDLE
    bundle = load_bundle(path, trusted_keys=args.pubkey or default_trusted_keys())
    print(f"bundle {bundle.model_id} v{bundle.version}: signature and {len(bundle.manifest['files'])} "
          f"file digests verified (key {bundle.key_id})")
    models = {"LiteRT int8": KeywordModel(bundle, backend="litert"),
              "ONNX Runtime int8": KeywordModel(bundle, backend="onnxruntime")}
    clips = make_clips()
    if args.save:
        from edge.audio import write_wav

        args.save.mkdir(parents=True, exist_ok=True)
        for i, (w, _v, x) in enumerate(clips):
            write_wav(args.save / f"{i}_{(w or 'noise').strip('()').replace(' ', '_')}.wav", x)
    print(f"\n{'said':<20}{'voice (never trained on)':<27}" + "".join(f"{n:<27}" for n in models))
    right = 0
    for word, voice, x in clips:
        cells = []
        for km in models.values():
            t = time.perf_counter()
            label, p = km.classify(x)
            ms = (time.perf_counter() - t) * 1e3
            cells.append(f"{label} ({p:.2f}, {ms:.1f} ms)")
        heard = km.classify(x)[0]
        expect = "_silence_" if word.startswith("(") else word
        ok = label12(heard) == label12(expect)
        right += ok
        print(f"{word:<20}{voice:<27}" + "".join(f"{c:<27}" for c in cells) + ("ok" if ok else "miss"))
    print(f"\n{right}/{len(clips)} heard right on the 12-class task (unknown words count as _unknown_).")
    return 0
