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

    $ .venv/bin/python scripts/babble_where.py         # ~3 min
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.enroll_noise import PHRASES, renders  # noqa: E402

PHRASES = PHRASES + ("jupiter", "computer", "lantern", "cinnamon", "thunder", "dolphin")
VOICES = (("flite", "rms"), ("flite", "kal16"), ("festival", "ked_diphone"))


def main() -> int:
    from bench import _base_streams as B
    from edge import enroll as E
    from edge import features as F
    from edge.bundle import load_bundle
    from edge.kws import DEFAULT_BUNDLE, KeywordModel, default_trusted_keys
    from host.data import noise as N

    bundle = load_bundle(DEFAULT_BUNDLE, trusted_keys=default_trusted_keys())
    km = KeywordModel(bundle)
    pool = B.babble_pool()
    rng = np.random.default_rng(0)
    missed = {}

    def heard(head, k, x):
        emb, _ = km.infer(km.features(np.clip(x, -32768, 32767).astype(np.int16)[None]))
        return bool(head.scores(emb)[0][k] >= head.thresholds[k])

    for vi, v in enumerate(VOICES):
        state = E.DeviceState(Path(tempfile.mkdtemp()), bundle.model_id, bundle.version, [], bundle)
        for pi, ph in enumerate(PHRASES):
            E.enroll(km, state, ph, renders(v, ph, 5, 10 * vi + pi), verify=False, save=False)
        head = state.custom(verify=False)
        for pi, ph in enumerate(PHRASES):
            k = state.names().index(ph)
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
