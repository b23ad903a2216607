"""``edgelearn data``: build the synthetic corpus, or check a folder of your own.

    $ edgelearn data synth                 # render (or load from cache) and summarise
    $ edgelearn data synth --export out/   # also write it out in the Speech Commands layout
    $ edgelearn data check my_clips/ --expect yes,no
"""

from __future__ import annotations

import collections
from pathlib import Path


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("synth", help="render the synthetic corpus (cached)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--workers", type=int, default=2)
    s.add_argument("--force", action="store_true", help="render again even if cached")
    s.add_argument("--export", type=Path, help="write eval clips as ROOT/<split>/<word>/<clip>.wav")
    c = sub.add_parser("check", help="load a folder in the Speech Commands layout and report problems")
    c.add_argument("folder", type=Path)
    c.add_argument("--expect", help="comma list of words that must be present")


def run(args) -> int:
    if args.action == "check":
        from host.data.folder import load_folder

        ds = load_folder(args.folder, expect=args.expect.split(",") if args.expect else None)
        counts = collections.Counter(ds.labels[i] for i in ds.y)
        print(f"{args.folder}: {len(ds.y)} clips in {len(ds.labels)} classes, {len(ds.noise)} noise files")
        for lab in ds.labels:
            print(f"  {lab:<12} {counts[lab]}")
        return 0
    from host.data.corpus import CorpusConfig, build_corpus

    corpus = build_corpus(CorpusConfig(seed=args.seed), workers=args.workers, force=args.force)
    table = collections.Counter(zip(corpus.split, corpus.kind))
    voices = collections.defaultdict(set)
    for v, s in zip(corpus.voice, corpus.split):
        voices[s].add(v)
    print(f"corpus: {len(corpus)} utterances from {len(set(corpus.voice))} voices")
    for split in ("train", "val", "test", "unseen"):
        kinds = ", ".join(f"{table[(split, k)]} {k}" for k in ("keyword", "filler", "custom"))
        print(f"  {split:<7} {len(voices[split]):>2} voices: {kinds}")
    if args.export:
        from edge.audio import write_wav
        from host.data.words import LABELS

        for split in ("train", "val", "test", "unseen"):
            if split == "train":
                continue  # training clips are drawn fresh every epoch; export the fixed sets
            x, y, v = corpus.eval_clips(split)
            for i, (clip, lab, voice) in enumerate(zip(x, y, v)):
                d = args.export / split / LABELS[lab]
                d.mkdir(parents=True, exist_ok=True)
                write_wav(d / f"{voice.replace(':', '_').replace('+', '_')}_{i:05d}.wav", clip)
        print(f"exported val/test/unseen clips to {args.export}")
    return 0
