"""Top-k sparsification with error feedback, the client side of the ``TOPK_INT8`` codec.

Only the k largest-magnitude entries of (update + residual) are sent, as
int8 with one scale; everything not sent, and the rounding error of what was,
is kept in a per-tensor float32 residual and added to the next round's update
(error feedback, Seide et al. 2014 / Stich et al. 2018), so nothing is lost
over rounds. The residual is the only state; ``reset()`` drops it after a
model change. Selection keeps a sorted list of k candidates (O(k) memory
besides the residual), ties going to the lower index.

    from edge.portable.wire import encode_update, TOPK_INT8, TopKEncoder
    enc = TopKEncoder(fraction=0.05)          # keep this object across rounds
    frame = encode_update(hdr, tensors, key, codec=TOPK_INT8, topk=enc)
"""

import array
import math
import struct

from edge.portable.quant import FLT_MAX, quantize_into, symmetric_scale
from edge.portable.wire_errors import EncodeError


class TopKEncoder:
    """Keeps ``k`` (or ``ceil(fraction * n)``, at least 1) entries per tensor and the residual of the rest."""

    def __init__(self, fraction=0.01, k=None):
        if k is not None and (not isinstance(k, int) or k < 1):
            raise EncodeError("TopKEncoder k=%r must be an int >= 1" % (k,))
        if not (0.0 < fraction <= 1.0):
            raise EncodeError("TopKEncoder fraction=%r must be in (0, 1]" % (fraction,))
        self.fraction = fraction
        self.k = k
        self.residuals = {}

    def k_for(self, n):
        """How many entries a tensor of ``n`` elements sends."""
        if n == 0:
            return 0
        k = self.k if self.k is not None else int(math.ceil(self.fraction * n))
        return max(1, min(n, k))

    def reset(self, name=None):
        """Forget the residual of ``name`` (or of every tensor), e.g. after a new base model."""
        if name is None:
            self.residuals = {}
        else:
            self.residuals.pop(name, None)

    def select(self, name, values):
        """``(name, sorted indices, scale)`` of the entries to send; changes no state.

        ``values`` must be an ``array('f')`` (the encoder converts).
        """
        n = len(values)
        r = self.residuals.get(name)
        if r is not None and len(r) != n:
            raise EncodeError("tensor %r had %d values in an earlier round and %d now" % (name, len(r), n),
                              fix="call TopKEncoder.reset() after changing the model")
        k = self.k_for(n)
        tmp = array.array("f", [0.0])
        top_a = []  # |v| of the candidates, descending
        top_i = []
        for i in range(n):
            if r is None:
                v = values[i]
            else:
                tmp[0] = values[i] + r[i]  # float32 sum, exactly as the numpy encoder computes it
                v = tmp[0]
            a = v if v >= 0 else -v
            if not a <= FLT_MAX:
                raise EncodeError("tensor %r plus its residual is not finite at index %d" % (name, i),
                                  fix="call TopKEncoder.reset(); the update diverged")
            if len(top_a) < k or a > top_a[-1]:
                lo, hi = 0, len(top_a)
                while lo < hi:  # first slot holding a smaller value: equal ones keep their lower index
                    mid = (lo + hi) // 2
                    if top_a[mid] >= a:
                        lo = mid + 1
                    else:
                        hi = mid
                top_a.insert(lo, a)
                top_i.insert(lo, i)
                if len(top_a) > k:
                    top_a.pop()
                    top_i.pop()
        top_i.sort()
        return (name, top_i, symmetric_scale(top_a[0] if top_a else 0.0))

    def write(self, values, selection, buf, off, rng, width):
        """Write the ``TOPK_INT8`` payload at ``buf[off:]`` and fold what was not sent into the residual."""
        name, idx, scale = selection
        n = len(values)
        k = len(idx)
        struct.pack_into("<If", buf, off, k, scale)
        off += 8
        fmt = "<H" if width == 2 else "<I"
        for i in idx:
            struct.pack_into(fmt, buf, off, i)
            off += width
        r = self.residuals.get(name)
        if r is None:
            r = array.array("f", bytes(4 * n))
            self.residuals[name] = r
        for i in range(n):
            r[i] = values[i] + r[i]
        sent = array.array("f", bytes(4 * k))
        for j in range(k):
            sent[j] = r[idx[j]]
        qoff = off
        off = quantize_into(sent, scale, buf, off, rng)
        tmp = array.array("f", [0.0])
        for j in range(k):
            q = buf[qoff + j]
            tmp[0] = (q - 256 if q > 127 else q) * scale
            r[idx[j]] = r[idx[j]] - tmp[0]
        return off
