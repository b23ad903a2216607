"""Rebuild the shipped bundle from nothing but Debian's synthesizers (``rebuild``); ``edgelearn
model`` (``host/commands/model.py``) runs it.

Corpus -> train -> int8 TFLite + ONNX -> the verifier's phone model (``host/phones.py``) ->
negative bank -> model card -> signed bundle. Intermediate products go to ``work`` (default ``build/kws``);
``reuse`` skips steps whose outputs are already there.

    >>> rebuild(Path("models/kws-dscnn-s"), key=Path("~/.config/edgelearn/release.key").expanduser())
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from edge.errors import EdgelearnError
from host.tail_export import PREFIX_FILE, PREFIX_LAYER

MODEL_ID = "kws-dscnn-s"
DEFAULT_KEY = Path.home() / ".config" / "edgelearn" / "release.key"
NEGATIVES = 1600
VERSION = 3  # 1: the corpus alone (to 2026-12-05); 2: + RHVoice, SVOX Pico and real negatives; 3: + everyday speech
EPOCHS = 70
# training's seed (initial weights, batches, augmentation). Version 3's weights are seed 1: of the two
# seeds of its recipe measured on development data (docs/frontend-and-model.md, "Everyday running
# speech as `_unknown_`") the better at the shipping point; seed 0 was the worse of its pair clean.
SEED = 1
TRAIN_MINUTES = 150.0  # a cap, not the plan: 70 epochs took 36 min on two cores alone (2026-12-04 and -05)
# The base commands' default operating point, written to the manifest (extra.operating) and used by
# every Detector that is given no threshold (edge.detect.bundle_thresholds). Chosen on development data
# only, for version 3's int8 encoder (2026-12-05): `scripts/curve_variants.py build/bundle-v3
# --english-max 3.65`'s best point at issue 17's rate, <= 0.5 false accepts per hour on the pooled real
# development speech (the English half of Asterisk's Allison, 16 min, and the three translated speakers,
# 52 min: no event in 68 minutes): per-keyword thresholds calibrated (edge.operating.calibrate) to
# 0.5 FA/h on that speech and the synthetic word pairs, mean recall 35.6 / 23.9 / 4.4 % on the Flite
# development streams against 6.7 / 1.7 / 0 % for the best single threshold there (0.95; 0.85 and 0.9
# had one event each; version 2's table on its own encoder: 31.7 / 13.9 / 1.7 %, the same run). A
# place that tolerates more trades it back with `device calibrate` / `--sensitivity` or `--threshold`.
# A model retrained from scratch needs its own: `edgelearn model --threshold T|FILE`.
OPERATING = {"yes": 0.88, "no": 0.79, "up": 0.6, "down": 0.92, "left": 0.8, "right": 0.83, "on": 0.77,
             "off": 0.75, "stop": 0.8, "go": 0.77}


def ensure_key(key: Path, pub_dir: Path) -> Path:
    """Use the signing key, creating it on first use; publish its public half in pub_dir."""
    import shutil

    from host.keys import generate_keypair

    if not key.exists():
        sys.stderr.write(f"model: creating signing key {key} (keep it private; never commit it)\n")
        generate_keypair(key.parent, name=key.stem)
    pub = key.with_suffix(".pub")
    pub_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pub, pub_dir / pub.name)
    return key


def negative_bank(km_predict, corpus, scale, n=NEGATIVES, seed=3) -> np.ndarray:
    """Embeddings of speech that is no custom keyword, and of noise, from training voices."""
    from host.augment import features_for

    emb = km_predict(features_for(negative_windows(corpus, n, seed), scale))
    return emb.astype(np.float16)


def negative_windows(corpus, n=NEGATIVES, seed=3) -> np.ndarray:
    """The negative bank's 1 s windows (float, int16 range): ``n`` words of training voices placed
    in a window, then an eighth as many silent rows, all with background noise."""
    from host.data import noise as N
    from host.data.corpus import add_background

    rng = np.random.default_rng(seed)
    idx = corpus.select("train", kinds=("keyword", "filler"))
    pick = rng.choice(idx, min(n, idx.size), replace=False)
    pool = [corpus.utterance(i) for i in corpus.select("train", kinds=("filler",))]
    x = np.stack([N.place(rng, corpus.utterance(i)) for i in pick] +
                 [np.zeros(16000, np.float32)] * (len(pick) // 8))
    x = add_background(rng, x, pool, speech_rows=len(pick))
    return np.clip(x, -32768, 32767)


def tensor_io(path: Path) -> tuple[list, list]:
    from edge.backends import load

    be = load(path, num_threads=1)

    def desc(t):
        d = {"name": t.name, "shape": [int(s) for s in t.shape], "dtype": np.dtype(t.dtype).name}
        if t.scale:
            d.update(scale=float(t.scale), zero_point=int(t.zero_point))
        if d["shape"] and d["shape"][-1] == 64:
            d["role"] = "embedding"
        elif len(d["shape"]) == 2:
            d["role"] = "probs"
        return d

    return [desc(t) for t in be.inputs], [desc(t) for t in be.outputs]


def operating_point(thresholds=None) -> dict:
    """The manifest's ``extra.operating``: every command's threshold (``thresholds``: one for all, or
    {command: threshold}; default ``OPERATING``) and how it was chosen."""
    from host.data.words import COMMANDS10

    thresholds = OPERATING if thresholds is None else thresholds
    table = thresholds if isinstance(thresholds, dict) else {w: thresholds for w in COMMANDS10}
    if set(table) != set(COMMANDS10) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1 for v in table.values()):
        raise EdgelearnError("an operating point needs a threshold in (0, 1] for each of the ten commands "
                             f"({', '.join(COMMANDS10)})", fix="give one number, or a JSON object with all ten")
    thr = {w: float(table[w]) for w in COMMANDS10}
    how = ("the shipped table: curve_variants' best point at <= 0.5 real development false accepts per hour, "
           "no event in 68 minutes (host/recipe.py)" if thresholds is OPERATING else "given to `edgelearn model`")
    return {"thresholds": thr, "chosen_on": how}


def build_manifest(work: Path, version: int, scale, train_m: dict, quant_m: dict, cross: dict | None,
                   recipe: dict | None = None, operating: dict | None = None) -> dict:
    from edge import features as F
    from host.data.words import LABELS, LABELS12

    parts = []
    for name, fname, fmt, prec in (("encoder", "encoder_int8.tflite", "tflite", "int8"),
                                   ("encoder-onnx", "encoder_int8.onnx", "onnx", "int8"),
                                   ("encoder-fp32", "encoder_fp32.tflite", "tflite", "float32")):
        ins, outs = tensor_io(work / fname)
        parts.append({"name": name, "role": "encoder", "file": fname, "format": fmt,
                      "placement": "cpu", "precision": prec, "inputs": ins, "outputs": outs})
    ins, outs = tensor_io(work / "backbone_int8.tflite")
    for o in outs:
        o["role"] = "features"
    parts.append({"name": "backbone", "role": "backbone", "file": "backbone_int8.tflite",
                  "format": "tflite", "placement": "cpu", "precision": "int8", "inputs": ins,
                  "outputs": outs})
    ins, outs = tensor_io(work / PREFIX_FILE)
    for o in outs:
        o["role"] = "tail_prefix"
    parts.append({"name": "tail-prefix", "role": "tail-prefix", "file": PREFIX_FILE, "format": "tflite",
                  "placement": "cpu", "precision": "int8", "inputs": ins, "outputs": outs, "cut": PREFIX_LAYER})
    ins, outs = tensor_io(work / "phones_int8.tflite")
    outs[0]["role"] = "phone_posteriors"
    phones_m = json.loads((work / "phones_metrics.json").read_text())
    parts.append({"name": "phones", "role": "phones", "file": "phones_int8.tflite", "format": "tflite",
                  "placement": "cpu", "precision": "int8", "inputs": ins, "outputs": outs,
                  "phones": phones_m["phones"], "notation": "espeak-ng (-x), folded; see host/phones.py"})
    return {
        "model_id": MODEL_ID, "version": version, "labels": LABELS,
        "frontend": {**F.PARAMS, "normalize": {"kind": "window-mean-removal+scale",
                                               "scale": [float(s) for s in scale]}},
        "target": "generic",
        "partitions": parts,
        "trainable": {"strategy": "prototypes+bias", "embedding_dim": 64,
                      "tail": {"file": "tail.npz", "cut": "pw3_relu", "backbone": "backbone",
                               "layers": ["dw4 (depthwise 3x3, BN folded)", "relu",
                                          "pw4 (1x1, BN folded)", "relu", "global average pool",
                                          "classifier (dense 64->37)", "softmax"],
                               "arrays": ["dw4_w", "dw4_b", "pw4_w", "pw4_b", "cls_w", "cls_b"]}},
        "quantization": {"scheme": "full-integer int8, per-channel weights",
                         "calibration": "600 training-split clips", "fallback_layers": quant_m["fallback"]},
        "extra": {"labels12": LABELS12, "negatives": {"file": "negatives.npy", "dtype": "float16"},
                  **({"recipe": recipe} if recipe else {}), **({"operating": operating} if operating else {}),
                  "metrics": {"train": train_m, "quant": quant_m, "cross_synth": cross,
                              "phones": {k: v for k, v in phones_m.items() if k != "phones"}},
                  "model_card": "MODEL_CARD.md"},
    }


def rebuild(out: Path, work: Path = Path("build") / "kws", key: Path = DEFAULT_KEY,
            pubkey_out: Path = Path("models") / "keys", version: int = VERSION, epochs: int = EPOCHS,
            reuse: bool = False, supplement=None, threshold=None, phrase: bool = True) -> Path:
    """Rebuild the shipped bundle into ``out`` (intermediate products in ``work``; ``reuse``: skip
    steps whose outputs are already there), signed with ``key`` (created if missing, its public
    half written to ``pubkey_out``); returns the key it signed with. ``supplement``: what is added
    to the corpus's training split (``host.data.supplement.Supplement``, default the shipped
    recipe's); ``threshold``: the commands' default operating point written to the manifest (one
    number, {command: threshold}, or None: ``OPERATING``); ``phrase``: add the base commands'
    phrase second stage (``host.phrase_stage``; models trained in ``work/phrase``, kept for
    ``reuse``)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from host import model_card
    from host.bundle import build_bundle
    from host.data.corpus import build_corpus
    from host.data.supplement import Supplement, check, supplemented
    from host.quantize import quantize
    from host.train import train

    supplement = Supplement() if supplement is None else supplement
    operating = operating_point(threshold)  # a bad table or a missing engine is refused before hours of work
    check(supplement)
    corpus, synths = supplemented(build_corpus(), supplement)
    if not (reuse and (work / "model.keras").exists()):
        train(work, epochs=epochs, corpus=corpus, synths=synths, max_minutes=TRAIN_MINUTES, seed=SEED)
        if threshold is None:
            sys.stderr.write("model: new weights get the shipped weights' operating point (host/recipe.py "
                             "OPERATING); choose theirs on development data with scripts/curve_variants.py "
                             "and rebuild with --reuse --threshold FILE\n")
    if not (reuse and (work / "quant_metrics.json").exists()):
        quantize(work, work, corpus=corpus)
    if not (reuse and (work / "tail.npz").exists() and (work / PREFIX_FILE).exists()):
        from tensorflow import keras

        from host.quantize import calibration_features
        from host.tail_export import export_prefix, export_tail

        scale0 = json.loads((work / "frontend.json").read_text())["scale"]
        model, calib = keras.models.load_model(work / "model.keras"), calibration_features(corpus, scale0)
        if reuse and (work / "tail.npz").exists():
            export_prefix(model, calib, work)  # a build from before the tail prefix: add it alone
        else:
            export_tail(model, calib, work)
    scale = json.loads((work / "frontend.json").read_text())["scale"]
    if not (reuse and (work / "phones_int8.tflite").exists()):
        from host.data.corpus import default_cache_dir
        from host.phones import train_phones

        train_phones(work, scale, default_cache_dir())
    train_m = json.loads((work / "metrics.json").read_text())
    quant_m = json.loads((work / "quant_metrics.json").read_text())
    cross_p = Path("bench/results/cross_synth.json")
    cross = json.loads(cross_p.read_text()) if cross_p.exists() else None

    from edge.backends import load
    enc = load(work / "encoder_int8.tflite")
    emb_i = [i for i, t in enumerate(enc.outputs) if t.shape[-1] == 64][0]
    np.save(work / "negatives.npy",
            negative_bank(lambda f: enc.run(f[..., None])[emb_i], corpus, scale))
    manifest = build_manifest(work, version, scale, train_m, quant_m, cross, recipe=supplement.describe(),
                              operating=operating)
    (work / "MODEL_CARD.md").write_text(model_card.render(manifest, train_m, quant_m, cross))
    key = ensure_key(key, pubkey_out)
    files = {n: work / n for n in ("encoder_int8.tflite", "encoder_int8.onnx", "encoder_fp32.tflite",
                                   "backbone_int8.tflite", PREFIX_FILE, "phones_int8.tflite", "tail.npz",
                                   "negatives.npy", "MODEL_CARD.md")}
    build_bundle(out, files, manifest, key)
    if phrase:
        from host import phrase_stage

        phrase_stage.build(out, work / "phrase", key)  # on the corpus alone, as the shipped models (session 42)
    return key
