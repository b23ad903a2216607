"""Which part of the second stage's step features babble moves: backbone, MFCC frames or phone
posteriors, each alone and in other mixes, at the same share of hard negatives passed. Development
data only (issue 17).

The development phrases and voices of ``scripts/enroll_noise.py --big`` (never the peers' wake
words); each keyword's templates made as enrolment makes them (``Verifier.templates`` of the 5
centred clips). Positives: each held-out render centred in its window (as ``babble_where.py``),
clean and with white or babble noise over the whole window at 20 and 10 dB. Negatives: per keyword,
the ``HARD`` windows (0.1 s hops) of the Allison *development* half and of the voice's own other
words, each also with babble 10 dB under it, that its first stage scores highest, what reaches the second stage in a stream. Per mix of
the step cosine (``edge.verify.WEIGHTS_5``'s three shares) and per keyword, the distance that
``NEG_PASS`` of its hard negatives stay under is the threshold; one line per mix: the share of
positives under it per condition (mean over the 36 keyword models). No stream, no noise-range
thresholds: it isolates which features hold under babble, not what the detector does.

Measured 2026-12-04 (session 30), hard negatives passed 0 % (the threshold at the closest of them,
no other one passing); positives passed clean / white 20 / babble 20 / white 10 / babble 10 dB:

    shipped (0.7, 0.1, 0.2)     100.0 / 99.5 / 76.9 / 78.7 / 33.8
    backbone                    100.0 / 93.5 / 60.2 / 52.3 / 21.8
    MFCC                        100.0 / 97.2 / 65.3 / 75.9 / 41.2
    phones                      100.0 / 98.6 / 78.7 / 91.2 / 46.8
    the calibrated thresholds   100.0 / 90.3 /  9.7 / 98.6 /  0.0   (0 % of the hard negatives pass)

The features separate three quarters of the babble positives at 20 dB from every hard negative; the
thresholds enrolment calibrates keep a tenth (docs/edge-runtime.md, "Babble and the second stage").

    $ .venv/bin/python scripts/verify_where.py     # ~5 min
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.babble_where import PHRASES, VOICES  # noqa: E402
from scripts.enroll_noise import renders  # noqa: E402

HARD = 300                        # hard negatives per keyword
NEG_PASS = (0.0, 0.01, 0.03)      # shares of them a threshold lets pass (0: under the closest)
MIXES = {"shipped (0.7, 0.1, 0.2)": (0.7, 0.1, 0.2), "backbone": (1.0, 0.0, 0.0), "MFCC": (0.0, 1.0, 0.0),
         "phones": (0.0, 0.0, 1.0), "backbone + phones (0.5, 0, 0.5)": (0.5, 0.0, 0.5),
         "MFCC + phones (0, 0.5, 0.5)": (0.0, 0.5, 0.5), "(0.4, 0.2, 0.4)": (0.4, 0.2, 0.4)}
CONDITIONS = ("clean", "white 20", "babble 20", "white 10", "babble 10")


def hop_windows(pcm: np.ndarray, hop: int = 1600) -> np.ndarray:
    n = (len(pcm) - 16000) // hop + 1
    return np.stack([pcm[i * hop: i * hop + 16000] for i in range(n)])


def main() -> int:
    from bench import _base_streams as B
    from bench import _realspeech as R
    from edge import enroll as E
    from edge import features as F
    from edge import verify as V
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from host.data import noise as N
    from host.data import synth as S

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    km = KeywordModel(bundle)
    ver = V.Verifier(bundle)
    version = ver.version
    pool = B.babble_pool()
    rng = np.random.default_rng(0)
    dev, _ = R.concat([p for p in R.load_prompts() if p.split == "dev"])
    dev = np.asarray(dev, np.int16)
    dev_feats = km.features(np.concatenate([hop_windows(dev), hop_windows(babbled(dev, 10, pool, rng))]))
    dev_emb, _ = km.infer(dev_feats)
    passed = {(m, q): {c: [] for c in CONDITIONS} for m in MIXES for q in NEG_PASS}
    calibrated = {c: [] for c in CONDITIONS + ("hard negatives",)}

    def distances(raw_seqs, templates, weights):
        V.WEIGHTS_5 = weights
        return ver.distance(ver.unit(raw_seqs, version), ver.prepare(templates, version), version=version)

    for vi, v in enumerate(VOICES):
        own = B.other_speech(S.Voice(*v), n=220, seed=80 + vi, avoid={w for ph in PHRASES for w in ph.split()})
        own = np.asarray(own, np.int16)
        own_feats = km.features(np.concatenate([hop_windows(own), hop_windows(babbled(own, 10, pool, rng))]))
        own_emb, _ = km.infer(own_feats)
        neg_feats = np.concatenate([dev_feats, own_feats])
        neg_emb = np.concatenate([dev_emb, own_emb])
        state = E.DeviceState(Path(tempfile.mkdtemp()), bundle.model_id, bundle.version, [], bundle)
        enrol = {}
        for pi, ph in enumerate(PHRASES):
            enrol[ph] = [E.prepare_clip(c, ph) for c in renders(v, ph, 5, 10 * vi + pi)]
            E.enroll(km, state, ph, enrol[ph], verify=False, save=False)
        head = state.custom(verify=False)
        neg_scores = head.scores(neg_emb)
        for pi, ph in enumerate(PHRASES):
            k = state.names().index(ph)
            templates = ver.templates(np.asarray(enrol[ph]), km.scale)
            hard = neg_feats[np.argsort(neg_scores[:, k])[::-1][:HARD]]
            windows = {c: [] for c in CONDITIONS}
            for c in renders(v, ph, 6, 900 + 10 * vi + pi):
                w = E.prepare_clip(c, ph).astype(np.float32)
                first, last = E.speech_bounds(w.astype(np.int16))
                power = float((w[first * F.HOP_LENGTH: last * F.HOP_LENGTH + F.FRAME_LENGTH] ** 2).mean())
                windows["clean"].append(w)
                for snr in (20, 10):
                    for kind in ("white", "babble"):
                        z = (N.babble(rng, pool, 1, n=F.SAMPLE_RATE)[0] if kind == "babble"
                             else N.coloured_noise(rng, "white", (1, F.SAMPLE_RATE))[0])
                        windows[f"{kind} {snr}"].append(w + z * np.sqrt(power / 10 ** (snr / 10) / (z ** 2).mean()))
            raw_neg = ver.raw(hard, version)
            pos_feats = {c: km.features(np.clip(x, -32768, 32767).astype(np.int16)) for c, x in windows.items()}
            raw_pos = {c: ver.raw(f, version) for c, f in pos_feats.items()}
            V.WEIGHTS_5 = MIXES["shipped (0.7, 0.1, 0.2)"]
            levels, _, _ = ver.calibrate(np.asarray(enrol[ph]), templates, km.scale, rng)
            calibrated["hard negatives"].append(float(np.mean(
                distances(raw_neg, templates, V.WEIGHTS_5) <= V.threshold_at(levels, hard, version))))
            for c, f in pos_feats.items():
                calibrated[c].append(float(np.mean(
                    distances(raw_pos[c], templates, V.WEIGHTS_5) <= V.threshold_at(levels, f, version))))
            for m, weights in MIXES.items():
                dn = distances(raw_neg, templates, weights)
                dp = {c: distances(r, templates, weights) for c, r in raw_pos.items()}
                for q in NEG_PASS:
                    t = np.quantile(dn, q)
                    for c in CONDITIONS:
                        passed[m, q][c].append(float(np.mean(dp[c] <= t)))
        print(f"voice {v} done", file=sys.stderr, flush=True)
    for q in NEG_PASS:
        print(f"hard negatives passed {100 * q:.0f} %: positives passed, " + " / ".join(CONDITIONS))
        for m in MIXES:
            print(f"  {m:34s} " + " / ".join(f"{100 * np.mean(passed[m, q][c]):5.1f}" for c in CONDITIONS))
    print("the thresholds enrolment calibrates (shipped mix): positives passed " + " / ".join(CONDITIONS)
          + " / hard negatives passed")
    print("  " + " / ".join(f"{100 * np.mean(calibrated[c]):5.1f}" for c in calibrated))
    return 0


def babbled(pcm: np.ndarray, snr_db: float, pool, rng) -> np.ndarray:
    """``pcm`` with babble ``snr_db`` below its own level: negative speech in a room of talkers."""
    from host.data import noise as N

    x = pcm.astype(np.float32)
    z = N.babble(rng, pool, 1, n=len(x))[0]
    z *= float(np.sqrt((x ** 2).mean())) * 10 ** (-snr_db / 20) / max(float(np.sqrt((z ** 2).mean())), 1e-6)
    return np.clip(x + z, -32768, 32767).astype(np.int16)


if __name__ == "__main__":
    sys.exit(main())
