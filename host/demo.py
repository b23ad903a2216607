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
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="where the fleet report goes")
    p.add_argument("--no-fleet", action="store_true", help="skip the federated fleet stage")
    p.add_argument("--no-cloud", action="store_true", help="skip the serving-shim stage")


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
    if not args.no_cloud:
        cloud_fallback(path, args.pubkey or default_trusted_keys(), models["LiteRT int8"], clips)
    if not args.no_fleet:
        latest, keys = fleet(args.out)
        if not args.no_cloud:
            serve_new_version(latest, keys, models["LiteRT int8"], clips)
    return 0


def ask_shim(bundle_dir, keys, endpoint: str, name: str, x: np.ndarray, parameters=None):
    """Start the serving shim on a bundle (loopback), send one OIP v2 request, return (url, outputs)."""
    import httpx

    from host.serve.app import Server
    from host.serve.cli import BackgroundServer
    from host.serve.config import ServeConfig

    body = {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                        "data": x.astype(np.float32).ravel().tolist()}]}
    if parameters:
        body["parameters"] = parameters
    server = Server(ServeConfig(replicas=1), trusted_keys=[str(keys)])
    with BackgroundServer(server, bundle=str(bundle_dir)) as url:
        r = httpx.post(f"{url}{endpoint}", json=body, timeout=60)
        r.raise_for_status()
        return url + endpoint, {o["name"]: o["data"] for o in r.json()["outputs"]}


def cloud_fallback(bundle_path, keys, km, clips) -> None:
    """The least confident clip goes to the serving shim's cascade endpoint."""
    feats = [km.features(x) for _w, _v, x in clips]
    scores = [float(km.infer(f[None])[1].max()) for f in feats]
    i = int(np.argmin(scores))
    print(f"\ncloud fallback: device was unsure of {clips[i][0]!r} ({scores[i]:.2f}); asking the serving shim")
    url, out = ask_shim(bundle_path, keys, f"/v2/cascade/{km.bundle.model_id}", "features",
                        feats[i][None, :, :, None])
    print(f"cloud fallback: {url} answered {out['label'][0]!r} (confidence {float(out['confidence'][0]):.2f})")


def fleet(out: Path):
    import shutil

    from host.fleet.plots import summary, write_report
    from host.fleet.simulate import SimConfig, simulate

    target = out / "fleet"
    if target.exists():
        shutil.rmtree(target)
    print("\nfleet: 12 simulated Pi devices federate a fresh classifier head over loopback HTTP, and 2 "
          "MicroPython boards (unix port) each enrol their own custom keyword, adapt and report")
    res = simulate(SimConfig(devices=12, rounds=3, clients_per_round=6, mcu_devices=2), target)
    paths = write_report(res, target)
    print("\n" + "\n".join(summary(res, paths["html"])))
    state = target / "agg"
    versions = sorted((d for d in (state / "bundles").iterdir() if d.is_dir()), key=lambda d: int(d.name[1:]))
    return versions[-1], state / "keys"


def serve_new_version(bundle_dir: Path, keys: Path, km, clips) -> None:
    """The serving shim loads the fleet's newest signed version and answers from its federated head."""
    from edge.bundle import load_bundle

    b = load_bundle(bundle_dir, trusted_keys=keys)
    word, _voice, x = clips[0]
    emb = km.infer(km.features(x)[None])[0]
    _url, out = ask_shim(bundle_dir, keys, f"/v2/split/{b.model_id}", "embedding", emb, {"partition": "fl-head"})
    print(f"serving: version {b.version} (signed by the aggregator) is live; its federated head heard "
          f"{word!r} as {out['label'][0]!r} ({float(out['confidence'][0]):.2f})")
