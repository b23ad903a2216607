"""What a healthy answer looks like: the fixed probe input and the checks on its output.

Used at warm-up (a version whose first answer fails is never served) and by
the periodic deep check of every replica (host/serve/pool.py).

    >>> probe = known_input(spec)                      # same every run
    >>> why = check_output(outputs, "logits", golden)  # "" when plausible
"""

from __future__ import annotations

import math

import numpy as np

from host.serve.protocol import DTYPES, ModelSpec


def known_input(spec: ModelSpec, rows: int = 2) -> dict[str, np.ndarray]:
    """A fixed, seeded input for warm-up and deep checks (same every run)."""
    rng = np.random.default_rng(20261107)
    out = {}
    for t in spec.inputs:
        shape = [rows if d == -1 and i == 0 else (1 if d == -1 else d) for i, d in enumerate(t.shape)]
        out[t.name] = rng.standard_normal(shape).astype(DTYPES[t.datatype])
    return out


def to_probabilities(scores: np.ndarray) -> np.ndarray:
    """Class probabilities from a score output that is either logits or already a softmax.

    An int8 softmax (QDQ, scale 1/256) sums to 1 only within its rounding, so
    "already probabilities" allows 0.1 of slack; logits that happen to be
    non-negative and sum to about 1 across every row are not a practical case.
    """
    s = scores.astype(np.float64)
    if s.min() >= 0 and np.allclose(s.sum(-1), 1, atol=0.1):
        p = s
    else:
        p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def check_output(outs: dict[str, np.ndarray], score_output: str | None, golden: dict | None) -> str:
    """Empty string if the answer is plausible, else why not."""
    for k, v in outs.items():
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            return f"output {k} has NaN/Inf"
    if score_output is not None and score_output in outs:
        s = outs[score_output]
        probs = to_probabilities(s)
        entropy = float(-(probs * np.log(np.clip(probs, 1e-12, 1))).sum(-1).mean())
        # A flat distribution on a fixed random input means the weights are gone
        # (zeroed, or a constant output): the model answers but knows nothing.
        if s.shape[-1] > 1 and entropy > 0.999 * math.log(s.shape[-1]):
            return f"output {score_output} is uniform (entropy {entropy:.3f} nats = log {s.shape[-1]})"
    if golden is not None:
        for k, ref in golden.items():
            if k in outs and ref.dtype.kind == "f" and not np.allclose(outs[k], ref, rtol=1e-3, atol=1e-3):
                return f"output {k} differs from this version's reference answer (max |diff| " \
                       f"{float(np.abs(outs[k] - ref).max()):.3g})"
    return ""
