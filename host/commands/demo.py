"""``edgelearn demo``: the end-to-end demo on the shipped model.

1. Devices: verify the shipped, signed bundle, synthesise clips with voices the
   model never trained on (Flite, held-out espeak-ng voices), and print what
   the int8 encoder heard, with LiteRT and ONNX Runtime side by side.
2. Cloud fallback: start the serving shim on the same bundle (loopback) and
   send the least confident clip's features to its cascade endpoint.
3. Fleet: a small fleet of simulated Pi devices federates over loopback HTTP
   (real clients, real aggregator) and publishes signed model versions, while
   two MicroPython boards (the real firmware on the unix port) enrol their own
   keywords, adapt and report; the report with plots is written to ``--out``.
   The serving shim then loads the newest version and answers from it. The first run renders the
   synthetic corpus (a few minutes, cached); ``--no-fleet`` skips this stage.

    $ edgelearn demo [--out demo-out] [--no-fleet]
"""

from __future__ import annotations

import time
from pathlib import Path

from host.demo import cloud_fallback, fleet, make_clips, serve_new_version


def add_arguments(p) -> None:
    p.add_argument("--bundle", type=Path, default=None, help="bundle: a directory, .zip or a shipped bundle's name "
                                                              "(default: the shipped kws-dscnn-s)")
    p.add_argument("--pubkey", type=Path, default=None,
                   help="trusted public key file or directory (added to the shipped release keys)")
    p.add_argument("--save", type=Path, default=None, help="also write the clips here as WAV")
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="where the fleet report goes")
    p.add_argument("--no-fleet", action="store_true", help="skip the federated fleet stage")
    p.add_argument("--no-cloud", action="store_true", help="skip the serving-shim stage")


def run(args) -> int:
    from edge.bundle import load_bundle
    from edge.kws import KeywordModel, resolve_trusted_keys
    from host.bundle import bundle_arg
    from host.data.words import label12

    path = bundle_arg(args.bundle)  # None: the shipped model; a shipped bundle's name works too
    # the keys every other command trusts: --pubkey (or $EDGELEARN_KEYS) plus the shipped release keys
    keys = resolve_trusted_keys(args.pubkey)
    bundle = load_bundle(path, trusted_keys=keys)
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
    if not args.no_cloud:
        cloud_fallback(path, keys, models["LiteRT int8"], clips)
    if not args.no_fleet:
        latest, keys = fleet(args.out, models["LiteRT int8"])
        if not args.no_cloud:
            serve_new_version(latest, keys, models["LiteRT int8"], clips)
    return 0
