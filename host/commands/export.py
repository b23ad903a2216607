"""``edgelearn export``: a custom keyword for another wake-word runtime.

    $ edgelearn export esphome --keyword "hey jarvis" --wav a.wav b.wav c.wav d.wav e.wav --out esphome/

writes ``esphome/hey_jarvis.tflite`` and ``esphome/hey_jarvis.json`` (micro_wake_word's v2
manifest): copy both next to the device's YAML and name the JSON under ``micro_wake_word: models:``.
The work is ``host/export/esphome.py``.

    $ edgelearn export voices --state state/ --keyword "hey jarvis"

teaches a keyword the device enrolled other voices (its phrase models and a head on the phrase said
by the corpus's voices, written into the state; ``host/custom_voices.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="target", required=True)
    e = sub.add_parser("esphome", help="a streaming int8 model + v2 manifest for ESPHome's micro_wake_word")
    e.add_argument("--keyword", required=True, help='the wake phrase, e.g. "hey jarvis"')
    e.add_argument("--wav", action="extend", nargs="+", default=[], type=Path, metavar="WAV",
                   help="16 kHz mono 16-bit clips of you saying the phrase (5 or more: --wav a.wav b.wav ..., "
                        "or repeat --wav)")
    e.add_argument("--out", required=True, type=Path, help="folder for <keyword>.tflite and <keyword>.json")
    e.add_argument("--author", default="edgelearn", help="the manifest's author")
    e.add_argument("--website", help="the manifest's website (optional)")
    e.add_argument("--languages", default="en", help="comma list for trained_languages (default: en)")
    e.add_argument("--epochs", type=int, default=30, help="training epochs, 1 or more (default 30)")
    e.add_argument("--seed", type=int, default=0)
    v = sub.add_parser("voices", help="teach a keyword the device enrolled to hear other voices: phrase models "
                                      "and a head trained on its phrase said by the corpus's voices (~6 min)")
    v.add_argument("--state", required=True, type=Path, help="the device's state directory (as `device enroll`)")
    v.add_argument("--keyword", required=True, help="an enrolled keyword's name")
    v.add_argument("--bundle", type=Path, help="the bundle the keyword was enrolled on (default: the state's)")


def check_options(args) -> None:
    """One EdgelearnError naming the first bad option, before the corpus is rendered or anything trains."""
    from edge.errors import EdgelearnError
    from host.export.esphome_config import MIN_CLIPS

    if args.epochs < 1:
        raise EdgelearnError(f"--epochs {args.epochs} is below 1", fix="give a number of epochs, e.g. 30")
    if args.out.exists() and not args.out.is_dir():
        raise EdgelearnError(f"--out {args.out} is a file, not a folder",
                             fix="give a folder for <keyword>.tflite and <keyword>.json")
    where = args.out
    while not where.exists() and where != where.parent:
        where = where.parent
    if where.is_dir() and not os.access(where, os.W_OK):  # found now, not after minutes of training
        raise EdgelearnError(f"--out {args.out} cannot be written ({where} is not writable)",
                             fix="give a folder you can write to")
    if args.website is not None:
        url = urlsplit(args.website)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise EdgelearnError(f"--website {args.website} is not a web address",
                                 fix="give one like https://example.org (ESPHome's manifest schema checks it)")
    if len(args.wav) < MIN_CLIPS:
        raise EdgelearnError(f"{len(args.wav)} clip(s) of the phrase given, {MIN_CLIPS} or more are needed",
                             fix="record more and pass them all: --wav a.wav b.wav c.wav d.wav e.wav")
    if not [x for x in args.languages.split(",") if x.strip()]:
        raise EdgelearnError("--languages is empty", fix="give a comma list of language codes, e.g. en")


def run(args) -> int:
    if args.target == "voices":
        return run_voices(args)
    from host.export.esphome import ExportConfig, export_esphome

    check_options(args)

    cfg = ExportConfig(seed=args.seed, epochs=args.epochs, author=args.author, website=args.website,
                       languages=tuple(x.strip() for x in args.languages.split(",") if x.strip()))
    res = export_esphome(args.keyword, args.wav, args.out, cfg)
    micro = res.manifest["micro"]
    print(f"model: {res.model_path} ({res.model_bytes} bytes; ops {', '.join(res.ops)})")
    print(f"manifest: {res.manifest_path} (cutoff {micro['probability_cutoff']}, sliding window "
          f"{micro['sliding_window_size']}, tensor arena {micro['tensor_arena_size']} bytes; "
          f"TFLite Micro ran it in {res.arena_bytes})")
    print(f"trained from {res.n_windows['user_clips']} clips of yours and {res.n_windows['synthetic_renders']} "
          f"synthetic renders in {res.train_cpu_s:.0f} CPU s")
    return 0


def run_voices(args) -> int:
    from edge.errors import EdgelearnError
    from host.custom_voices import teach

    if not args.state.is_dir():
        raise EdgelearnError(f"--state {args.state} is not a state directory",
                             fix="give the directory `edgelearn device enroll --state` wrote")
    rep = teach(args.state, args.bundle, args.keyword)
    real = f"; trained against real {' and '.join(rep['real_speech'])} speech too" if rep.get("real_speech") else ""
    print(f"keyword {rep['keyword']!r}: phrase models {', '.join(rep['models'])} (cutoff {rep['cutoff']}{real}), "
          f"a head on the phrase said by {rep['voices']} voices beside yours ({rep['heads']} heads, first stage "
          f"{rep['threshold']:.3f}, opened {rep['lower']:g} lower in logit for the models); {rep['cpu_s']:.0f} CPU s")
    return 0
