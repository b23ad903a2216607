"""Where babble costs a custom keyword's first stage: over the whole window, only outside the phrase,
or only during it; white noise the same three ways. Development data only (issue 17).

The development phrases and voices of ``scripts/enroll_noise.py --big`` (never the peers' wake
words), enrolled through ``edge.enroll.enroll`` with the first stage alone; each held-out render
centred in its 1 s window as enrolment centres it, the noise scaled against the phrase's own power.
One line per (SNR, noise, where): the share of renders the first stage misses at its threshold.
Window by window, no stream: it isolates what the head sees, not what the detector does around it.

Measured 2026-12-04 (216 renders per row; clean 9.7 % missed):

    20 dB  white   all 11.6 %   outside 50.9 %   inside 37.0 %
    20 dB  babble  all 54.2 %   outside 41.7 %   inside 42.6 %
    10 dB  white   all 35.6 %   outside 86.1 %   inside 58.8 %
    10 dB  babble  all 90.7 %   outside 63.4 %   inside 80.6 %

Steady white noise over the whole window costs 2 points at 20 dB; the same noise only around the
phrase costs 41, only during it 27. The head, trained on copies with steady noise, hears where
noise starts and stops, and babble starts and stops all the time. Copies with bursts of noise for
the head (``enroll_noise.py``'s "bursty-noise" variant) did not move babble: docs/edge-runtime.md.

Session 29 (2026-12-04), the whole window only, clean / white 20 / babble 20 / white 10 / babble 10 dB:
an encoder pulled to clean embeddings (``train_variant.py --teacher shipped``, 40 epochs) 13.0 / 8.8 /
69.4 / 33.8 / 94.0 %, its reference (the recipe, 40 epochs) 15.7 / 19.4 / 74.1 / 35.6 / 96.3 %; the
shipped encoder scored over the phrase's span + 0.06 s (``--span-mask 0.06 --fill mean``) 8.8 / 9.7 /
41.2 / 35.6 / 81.5 %. docs/edge-runtime.md, "Babble: an encoder pulled to clean embeddings".

    $ .venv/bin/python scripts/babble_where.py         # ~3 min
    # an encoder trained by scripts/train_variant.py instead of the shipped one (float Keras, its
    # own feature scale, and a negative bank made from it as `edgelearn model` makes the bundle's)
    $ .venv/bin/python scripts/babble_where.py --model build/var-plain40
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.enroll_noise import PHRASES, renders, span_frames  # noqa: E402

PHRASES = PHRASES + ("jupiter", "computer", "lantern", "cinnamon", "thunder", "dolphin")
VOICES = (("flite", "rms"), ("flite", "kal16"), ("festival", "ked_diphone"))


class TrainedEncoder:
    """What ``edge.enroll.enroll`` needs of a KeywordModel, from a training run's directory
    (``model.keras``, ``frontend.json``), with a negative bank made from that encoder
    (``host.recipe.negative_bank``, as the bundle's): development only, never shipped."""

    def __init__(self, path: Path, bundle):
        from tensorflow import keras

        from edge import features as F
        from host.data.corpus import build_corpus
        from host.recipe import negative_bank

        self._F, self.labels = F, bundle.labels
        self.model = keras.models.load_model(path / "model.keras")
        self.scale = np.asarray(json.loads((path / "frontend.json").read_text())["scale"], np.float32)
        bank = path / "negatives_dev.npy"
        if not bank.exists():  # a cache: written whole or not at all, so a killed run never leaves half a bank
            from edge.atomic import atomic_file

            with atomic_file(bank) as fh:
                np.save(fh, negative_bank(lambda f: self.infer(f)[0], build_corpus(progress=False), self.scale))
        self.bundle = type("Bank", (), {"manifest": {"extra": {"negatives": {"file": str(bank)}}},
                                        "path": staticmethod(lambda name: name), "model_id": bundle.model_id})()

    def features(self, pcm):
        return self._F.normalize(self._F.mfcc(pcm), self.scale)

    def infer(self, feats):
        emb, probs = self.model.predict(np.asarray(feats, np.float32)[..., None], batch_size=1024, verbose=0)
        return emb, probs


class SpanMasked:
    """A KeywordModel whose windows keep only their middle ``frames`` frames, so that what surrounds
    a phrase cannot move its embedding: before the cepstra and the window's mean removal, the
    log-mel energies of the frames outside are replaced by ``fill``: ``silence`` (digital silence,
    as enrolment pads a clip), ``floor`` (each band's quietest frame of the span) or ``mean`` (the
    span's mean: the window's mean removal becomes the span's own; the only one a detector keeping
    cepstra can compute, ``scripts/enroll_noise.py``'s ``span_window``). Enrolment and scoring both
    go through it; the negative bank stays the bundle's (unmasked) one. An experiment, never shipped."""

    def __init__(self, km, fill: str):
        from edge import features as F

        self.km, self.fill, self._F = km, fill, F
        self.bundle, self.labels, self.infer = km.bundle, km.labels, km.infer
        self.frames = F.N_FRAMES

    def features(self, pcm):
        F = self._F
        mel = np.log(np.maximum(F.frames_to_mel(F.frame(F.to_float(np.asarray(pcm)))), F.LOG_FLOOR))
        a = (F.N_FRAMES - self.frames) // 2
        if self.frames < F.N_FRAMES:
            span = mel[..., a:a + self.frames, :]
            fill = {"silence": lambda: np.full_like(mel[..., :1, :], np.log(F.LOG_FLOOR)),
                    "floor": lambda: span.min(axis=-2, keepdims=True),
                    "mean": lambda: span.mean(axis=-2, keepdims=True)}[self.fill]()
            mel = np.concatenate([np.broadcast_to(fill, mel[..., :a, :].shape), span,
                                  np.broadcast_to(fill, mel[..., a + self.frames:, :].shape)], axis=-2)
        return F.normalize((mel @ F._DCT).astype(np.float32), self.km.scale)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=None,
                   help="a scripts/train_variant.py output directory to measure instead of the shipped encoder")
    p.add_argument("--span-mask", type=float, default=None, metavar="MARGIN_S",
                   help="score only the middle of each window: the longest enrolment clip's speech plus "
                        "MARGIN_S on each side (SpanMasked)")
    p.add_argument("--fill", choices=("silence", "floor", "mean"), default="silence",
                   help="what --span-mask puts outside the span")
    args = p.parse_args(argv)
    from bench import _base_streams as B
    from edge import enroll as E
    from edge import features as F
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from host.data import noise as N

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    km = KeywordModel(bundle) if args.model is None else TrainedEncoder(args.model, bundle)
    if args.span_mask is not None:
        km = SpanMasked(km, args.fill)
    spans = {}
    pool = B.babble_pool()
    rng = np.random.default_rng(0)
    missed = {}

    def heard(head, k, x):
        emb, _ = km.infer(km.features(np.clip(x, -32768, 32767).astype(np.int16)[None]))
        return bool(head.scores(emb)[0][k] >= head.thresholds[k])

    for vi, v in enumerate(VOICES):
        state = E.DeviceState(Path(tempfile.mkdtemp()), bundle.model_id, bundle.version, [], bundle)
        for pi, ph in enumerate(PHRASES):
            clips = renders(v, ph, 5, 10 * vi + pi)
            if args.span_mask is not None:
                km.frames = spans[v, ph] = span_frames(clips, ph, args.span_mask, step=1)
            E.enroll(km, state, ph, clips, verify=False, save=False)
        head = state.custom(verify=False)
        for pi, ph in enumerate(PHRASES):
            k = state.names().index(ph)
            if args.span_mask is not None:
                km.frames = spans[v, ph]
            for c in renders(v, ph, 6, 900 + 10 * vi + pi):
                w = E.prepare_clip(c, ph).astype(np.float32)
                first, last = E.speech_bounds(w.astype(np.int16))
                a, b = first * F.HOP_LENGTH, last * F.HOP_LENGTH + F.FRAME_LENGTH
                power = float((w[a:b] ** 2).mean())
                inside = np.zeros(F.SAMPLE_RATE, np.float32)
                inside[a:b] = 1.0
                missed.setdefault("clean", []).append(not heard(head, k, w))
                for snr in (20, 10):
                    for kind in ("white", "babble"):
                        z = (N.babble(rng, pool, 1, n=F.SAMPLE_RATE)[0] if kind == "babble"
                             else N.coloured_noise(rng, "white", (1, F.SAMPLE_RATE))[0])
                        z *= np.sqrt(power / 10 ** (snr / 10) / (z ** 2).mean())
                        for where, m in (("all", 1.0), ("outside", 1.0 - inside), ("inside", inside)):
                            missed.setdefault(f"{snr} dB  {kind:6s}  {where}", []).append(not heard(head, k, w + z * m))
    for key, m in missed.items():
        print(f"{key:28s} {100 * np.mean(m):5.1f} % missed of {len(m)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
