"""Does noise reduction in the front end make the encoder hear commands in noise? (issue 17, lever 1)

An experiment, not the shipped recipe: the shipped front end (``edge.features``) is MFCC with
per-window mean removal and no noise suppression. This script trains the shipped recipe on the
same corpus with a *denoised* front end and reports class-balanced command recall on clean clips
and on clips at fixed SNRs (white, pink, brown, babble), beside any model already trained:

    # the shipped model, on the same clips (reads encoder_fp32.tflite + manifest.json)
    $ .venv/bin/python scripts/denoise_variant.py models/kws-dscnn-s --evaluate
    # train with the denoised front end (40 epochs ~25 min on 2 cores), then report it
    $ .venv/bin/python scripts/denoise_variant.py build/var-denoise --epochs 40

The denoiser is per window and stateless, so training on 1 s clips and streaming see exactly the
same features: the 40 mel energies per frame as amplitudes (square roots), a per-channel noise
estimate (the ``--quantile`` over the window's 49 frames), subtracted with a floor of
``--floor`` times the frame's own amplitude (TensorFlow Lite Micro's noise reduction rule,
``min_signal_remaining`` 0.05, with a window statistic in place of its running mean), then log,
DCT and the usual mean removal. A clean clip padded with silence has a noise estimate of 0 and
is unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SNRS = (20.0, 10.0, 5.0)


def denoised_mfcc(quantile: float | None, floor: float, range_db: float | None = None):
    """An ``edge.features.mfcc`` replacement with per-window noise reduction on the mel amplitudes."""
    from edge import features as F

    def mfcc(samples, mel_fb=None):
        x = F.to_float(samples)
        if x.shape[-1] != F.WINDOW_SAMPLES:
            raise ValueError("the denoised front end is defined per 1 s window")
        amp = np.sqrt(F.frames_to_mel(F.frame(x), mel_fb))
        if quantile is not None:
            noise = np.quantile(amp, quantile, axis=-2, keepdims=True)
            amp = np.maximum(amp - noise, floor * amp)
        if range_db is not None:   # nothing deeper than range_db under the window's loudest cell
            amp = np.maximum(amp, amp.max(axis=(-2, -1), keepdims=True) * 10 ** (-range_db / 20))
        return F.mel_to_mfcc(amp * amp)

    return mfcc


def noisy_report(predict, corpus, scale) -> dict:
    """Class-balanced command recall (and 12-class balanced accuracy) per split, clean and per SNR."""
    from host.augment import features_for
    from host.evaluate import balanced12, command_recall, to12
    from host.data.words import COMMANDS10

    out = {}
    for split in ("test", "unseen"):
        for cond in ["clean"] + [f"{s:g}dB" for s in SNRS]:
            if cond == "clean":
                x, y, voices = corpus.eval_clips(split, clean_share=1.0)
            else:
                s = float(cond[:-2])
                x, y, voices = corpus.eval_clips(split, clean_share=0.0, snr=(s, s))
            _, probs = predict(features_for(x, scale))
            t, p = to12(y), to12(np.asarray(probs).argmax(1))
            synth = np.array([v.split(":")[0] for v in voices])
            row = {"bal12": balanced12(probs, y), "cmd": command_recall(probs, y)}
            # class-balanced command recall: mean over the 10 commands of their own recall
            row["cmd_balanced"] = float(np.mean([(p[t == k] == k).mean()
                                                 for k in range(len(COMMANDS10)) if (t == k).any()]))
            for sy in sorted(set(synth) - {"noise"}):
                m = synth == sy
                row[f"cmd_balanced_{sy}"] = float(np.mean([(p[m & (t == k)] == k).mean()
                                                          for k in range(len(COMMANDS10))
                                                          if (m & (t == k)).any()]))
            out[f"{split}/{cond}"] = row
    return out


def window_detector():
    """``edge.detect.Detector`` that computes each window's features from the window's own audio
    (``edge.features.mfcc`` of its 15,840 samples), so a per-window front end streams exactly as it
    was trained. The shipped Detector keeps a ring of per-frame MFCC, which a window statistic
    (the noise estimate, the window's loudest cell) cannot be folded into."""
    from edge import features as F
    from edge.detect import Detector

    span = (F.N_FRAMES - 1) * F.HOP_LENGTH + F.FRAME_LENGTH   # 15,840 samples: 49 frames

    class WindowDetector(Detector):
        def reset(self):
            super().reset()
            self.audio, self.audio_start = np.zeros(0, np.int16), 0

        def push(self, pcm):
            pcm = np.asarray(pcm, np.int16).reshape(-1)
            keep = max(0, len(self.audio) + len(pcm) - 2 * F.WINDOW_SAMPLES)
            self.audio = np.concatenate([self.audio, pcm])[keep:]
            self.audio_start += keep
            return super().push(pcm)

        def _window(self):
            end = (self.n_frames - 1) * F.HOP_LENGTH + F.FRAME_LENGTH - self.audio_start
            seg = np.concatenate([self.audio[end - span:end], np.zeros(F.WINDOW_SAMPLES - span, np.int16)])
            return F.mfcc(seg)

    return WindowDetector


def stream_report(model, windowed: bool, thresholds=(0.7,)) -> dict:
    """bench/kws_base's streams (Flite awb/rms/slt, clean/20/10 dB) and the *development* half of the
    real prompts at the fixed 0.7: what a user of the detector would get (the test half is kept for
    the benchmark). Other ``thresholds`` add the same two figures at each (``at``), so that two
    models can be compared at matched false accepts."""
    from bench import _base_streams as B
    from bench import _realspeech as R
    from bench import kws_base as K

    if windowed:
        K.Detector = window_detector()
    dev = R.load_prompts(which="dev")
    streams = B.voice_streams()
    pos = K.summarise(K.positives(model, 0.7, streams))
    fa = K.real_fa(model, 0.7, dev)
    out = {"recall_balanced_at_0.7": {c: round(r["balanced"], 4) for c, r in pos.items()},
           "per_voice": {c: r["per_voice"] for c, r in pos.items()},
           "real_dev_fa_per_hour": round(fa["fa_per_hour"], 2),
           "real_dev_in_sentence": f"{fa['in_sentence_found']}/{fa['in_sentence_said']}"}
    for t in (t for t in thresholds if t != 0.7):
        pos_t = K.summarise(K.positives(model, t, streams))
        out.setdefault("at", {})[str(t)] = {
            "recall_balanced": {c: round(r["balanced"], 4) for c, r in pos_t.items()},
            "real_dev_fa_per_hour": round(K.real_fa(model, t, dev)["fa_per_hour"], 2)}
    return out


def tflite_predict(path: Path):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path), num_threads=2)
    inp = it.get_input_details()[0]

    def predict(feats):
        it.resize_tensor_input(inp["index"], [len(feats), *inp["shape"][1:]])
        it.allocate_tensors()
        it.set_tensor(inp["index"], feats[..., None].astype(np.float32))
        it.invoke()
        outs = [it.get_tensor(o["index"]) for o in it.get_output_details()]
        probs = next(o for o in outs if o.shape[-1] != 64 or o.ndim != 2)
        emb = next((o for o in outs if o is not probs), probs)
        return emb, probs

    return predict


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--evaluate", action="store_true",
                   help="do not train: report the model in OUT (model.keras + frontend.json, or a "
                        "bundle's encoder_fp32.tflite + manifest.json) with the front end it was "
                        "trained with (--plain for the shipped one)")
    p.add_argument("--plain", action="store_true", help="the shipped front end (no denoising)")
    p.add_argument("--stream", action="store_true",
                   help="also stream bench/kws_base's Flite streams and the real prompts' development "
                        "half through the Detector at 0.7 (needs a model.keras build)")
    p.add_argument("--thresholds", default="0.7",
                   help="with --stream: comma-separated thresholds to report besides 0.7, e.g. 0.7,0.8,0.9")
    p.add_argument("--quantile", type=float, default=0.2)
    p.add_argument("--floor", type=float, default=0.05)
    p.add_argument("--log-floor", type=float, default=None,
                   help="the log's floor on the mel energies (shipped: edge.portable.mfcc.LOG_FLOOR, 1e-6)")
    p.add_argument("--no-subtract", action="store_true", help="no noise subtraction (--range-db only)")
    p.add_argument("--range-db", type=float, default=None,
                   help="clamp each window's mel energies to this many dB under its loudest")
    a = p.parse_args(argv)
    out = Path(a.out)
    try:
        thresholds = tuple(float(t) for t in a.thresholds.split(","))
    except ValueError:
        thresholds = ()
    if not thresholds or not all(0.0 < t < 1.0 for t in thresholds):
        p.error(f"--thresholds {a.thresholds!r}: give thresholds between 0 and 1, comma-separated, "
                "e.g. --thresholds 0.7,0.8,0.9")

    from edge import features as F
    from host.data.corpus import CorpusConfig, build_corpus

    if a.log_floor is not None:   # frames_to_mfcc and the denoiser read it at call time
        F.LOG_FLOOR = a.log_floor
    if not a.plain:
        # every 1 s feature of this process (training, its augmentation, its scale, every
        # evaluation) goes through the denoiser
        F.mfcc = denoised_mfcc(None if a.no_subtract else a.quantile, a.floor, a.range_db)
    corpus = build_corpus(CorpusConfig())
    if a.evaluate:
        if (out / "encoder_fp32.tflite").exists():
            scale = json.loads((out / "manifest.json").read_text())["frontend"]["normalize"]["scale"]
            predict = tflite_predict(out / "encoder_fp32.tflite")
        else:
            from tensorflow import keras

            model = keras.models.load_model(out / "model.keras")
            scale = json.loads((out / "frontend.json").read_text())["scale"]
            predict = lambda f: model.predict(f[..., None], batch_size=1024, verbose=0)  # noqa: E731
    else:
        from host.train import train

        res = train(out=out, epochs=a.epochs, corpus=corpus, max_minutes=60)
        model, scale = res["model"], res["scale"]
        predict = lambda f: model.predict(f[..., None], batch_size=1024, verbose=0)  # noqa: E731
    report = {"model": str(out), "log_floor": F.LOG_FLOOR, "front_end": "plain" if a.plain else
              {"denoise": {"quantile": None if a.no_subtract else a.quantile, "floor": a.floor,
                            "range_db": a.range_db}},
              "noisy": noisy_report(predict, corpus, scale)}
    if a.stream:
        from bench.kws_base import KerasVariant

        windowed = not a.plain
        report["stream"] = stream_report(KerasVariant(out), windowed, thresholds)
    name = "noisy_report.json" if not a.evaluate else "noisy_report_eval.json"
    if (out / "model.keras").exists():   # a build of this script (never the shipped bundle's folder)
        (out / name).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
