"""Prototype enrolment and bias-only adaptation on ``array('f')``, for every runtime.

A custom keyword is a *prototype*: the L2-normalised mean of the encoder
embeddings of its enrolment clips. Each keyword ``k`` has a one-vs-rest score

    p_k(e) = sigmoid(gain * (cos(e, proto_k) - threshold_k) + bias_k)

and fires when ``p_k >= 0.5``, i.e. when ``cos >= threshold_k - bias_k / gain``.
``threshold_k`` comes from calibration against negatives (the Pi uses the
bundle's negative bank; see ``edge.enroll``); ``bias_k`` starts at 0 and is
the only thing bias-only adaptation trains (TinyTL's idea at its smallest):
a confirmed detection (label k) or a correction (label -1, "not a keyword")
moves it by SGD on the logistic loss, ``bias_k -= lr * (p_k - y_k)``, so the
effective threshold follows the user without touching the prototype.

Outliers among enrolment clips: each clip's cosine to the prototype of the
*other* clips; a clip is an outlier when it is below ``min_cos`` or more than
``k_mad`` median absolute deviations below the median (with a floor on the
deviation, since 5 clips of one phrase often agree almost perfectly).

Serialised form (``to_bytes``/``from_bytes``)::

    b"EPH1" | u16 dim | u16 count | f32 gain | count x (f32 threshold, f32 bias, dim x f32 proto)

API (stable; the ESP32 firmware uses it):

    l2_normalize(vec, out=None) -> array('f')        dot(a, b) -> float
    prototype(embs) -> array('f')                     embs: list of float sequences
    loo_cosines(embs) -> array('f')                   cos of each clip to the others' prototype
    find_outliers(embs, min_cos=0.5, k_mad=4.0, mad_floor=0.02) -> [index, ...]
    ProtoHead(dim, max_classes=8, gain=20.0)
      .add(proto, threshold) -> k    .set_threshold(k, t)    .count
      .cosines(emb, out=None)        emb need not be normalised
      .probs(emb, out=None)          p_k for each class
      .best(emb) -> (k, p_k)         k = -1 when nothing reaches 0.5
      .adapt_bias(emb, label, lr=0.5) -> loss     label -1 = negative
      .update_prototype(k, emb, rate=0.1)
      .to_bytes() / ProtoHead.from_bytes(data)

    >>> head = ProtoHead(64)
    >>> k = head.add(prototype(clip_embeddings), threshold=0.82)
    >>> k_hit, p = head.best(embedding)
"""

import array
import math
import struct

from edge.portable.compat import const, zeros

_HDR = "<4sHHf"
_HDR_BYTES = const(12)


def _zeros(n):
    return zeros("f", n)


def dot(a, b):
    s = 0.0
    for i in range(len(a)):
        s += a[i] * b[i]
    return s


def l2_normalize(vec, out=None):
    n = len(vec)
    if out is None:
        out = _zeros(n)
    norm = math.sqrt(dot(vec, vec))
    inv = 1.0 / norm if norm > 1e-12 else 0.0
    for i in range(n):
        out[i] = vec[i] * inv
    return out


def prototype(embs):
    """L2-normalised mean of the L2-normalised embeddings."""
    if not embs:
        raise ValueError("prototype needs at least one embedding")
    dim = len(embs[0])
    acc = _zeros(dim)
    tmp = _zeros(dim)
    for e in embs:
        if len(e) != dim:
            raise ValueError("embeddings differ in length (%d vs %d)" % (len(e), dim))
        l2_normalize(e, tmp)
        for i in range(dim):
            acc[i] += tmp[i]
    return l2_normalize(acc, acc)


def loo_cosines(embs):
    """Cosine of each embedding to the prototype of all the others (leave-one-out)."""
    n = len(embs)
    out = _zeros(n)
    if n < 2:
        return out
    dim = len(embs[0])
    normed = [l2_normalize(e) for e in embs]
    total = _zeros(dim)
    for v in normed:
        for i in range(dim):
            total[i] += v[i]
    rest = _zeros(dim)
    for j in range(n):
        for i in range(dim):
            rest[i] = total[i] - normed[j][i]
        l2_normalize(rest, rest)
        out[j] = dot(rest, normed[j])
    return out


def _median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def find_outliers(embs, min_cos=0.5, k_mad=4.0, mad_floor=0.02):
    cos = loo_cosines(embs)
    if len(embs) < 3:
        return []
    med = _median(cos)
    mad = _median([abs(c - med) for c in cos])
    cut = med - k_mad * (mad if mad > mad_floor else mad_floor)
    return [j for j in range(len(embs)) if cos[j] < min_cos or cos[j] < cut]


def _sigmoid(z):
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    ez = math.exp(z)
    return ez / (1.0 + ez)


class ProtoHead:
    def __init__(self, dim, max_classes=8, gain=20.0):
        self.dim = dim
        self.max_classes = max_classes
        self.gain = gain
        self.count = 0
        self.protos = _zeros(dim * max_classes)
        self.thresholds = _zeros(max_classes)
        self.bias = _zeros(max_classes)
        self._tmp = _zeros(dim)

    def add(self, proto, threshold):
        if self.count >= self.max_classes:
            raise ValueError("the head holds %d keywords already; remove one first" % self.max_classes)
        if len(proto) != self.dim:
            raise ValueError("prototype has %d values, the head %d" % (len(proto), self.dim))
        k = self.count
        l2_normalize(proto, self._tmp)
        off = k * self.dim
        for i in range(self.dim):
            self.protos[off + i] = self._tmp[i]
        self.thresholds[k] = threshold
        self.bias[k] = 0.0
        self.count += 1
        return k

    def set_threshold(self, k, threshold):
        self.thresholds[k] = threshold

    def cosines(self, emb, out=None):
        if out is None:
            out = _zeros(self.count)
        e = l2_normalize(emb, self._tmp)
        for k in range(self.count):
            off = k * self.dim
            s = 0.0
            for i in range(self.dim):
                s += self.protos[off + i] * e[i]
            out[k] = s
        return out

    def probs(self, emb, out=None):
        out = self.cosines(emb, out)
        for k in range(self.count):
            out[k] = _sigmoid(self.gain * (out[k] - self.thresholds[k]) + self.bias[k])
        return out

    def best(self, emb):
        p = self.probs(emb)
        k_best, p_best = -1, 0.0
        for k in range(self.count):
            if p[k] >= 0.5 and p[k] > p_best:
                k_best, p_best = k, p[k]
        return k_best, p_best

    def adapt_bias(self, emb, label, lr=0.5):
        """One SGD step on the biases (one-vs-rest logistic loss); returns the loss."""
        p = self.probs(emb)
        loss = 0.0
        for k in range(self.count):
            y = 1.0 if k == label else 0.0
            q = p[k] if y else 1.0 - p[k]
            loss -= math.log(q if q > 1e-12 else 1e-12)
            self.bias[k] -= lr * (p[k] - y)
        return loss

    def update_prototype(self, k, emb, rate=0.1):
        """Move prototype k towards a confirmed example (running mean on the sphere)."""
        e = l2_normalize(emb, self._tmp)
        off = k * self.dim
        for i in range(self.dim):
            self.protos[off + i] = (1.0 - rate) * self.protos[off + i] + rate * e[i]
        view = _zeros(self.dim)
        for i in range(self.dim):
            view[i] = self.protos[off + i]
        l2_normalize(view, view)
        for i in range(self.dim):
            self.protos[off + i] = view[i]

    def to_bytes(self):
        parts = [struct.pack(_HDR, b"EPH1", self.dim, self.count, self.gain)]
        for k in range(self.count):
            parts.append(struct.pack("<ff", self.thresholds[k], self.bias[k]))
            off = k * self.dim
            parts.append(bytes(self.protos[off:off + self.dim]))
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data, max_classes=8):
        if len(data) < _HDR_BYTES:
            raise ValueError("prototype head data too short (%d bytes)" % len(data))
        magic, dim, count, gain = struct.unpack_from(_HDR, data, 0)
        if magic != b"EPH1":
            raise ValueError("not a prototype head (magic %r)" % (magic,))
        want = _HDR_BYTES + count * (8 + 4 * dim)
        if len(data) != want:
            raise ValueError("prototype head data is %d bytes, expected %d" % (len(data), want))
        head = cls(dim, max(max_classes, count), gain)
        off = _HDR_BYTES
        for k in range(count):
            t, b = struct.unpack_from("<ff", data, off)
            off += 8
            head.thresholds[k] = t
            head.bias[k] = b
            # array('f') is native float32, little-endian on every supported board
            head.protos[k * dim:(k + 1) * dim] = array.array("f", data[off:off + 4 * dim])
            off += 4 * dim
        head.count = count
        return head
