"""The MFCC front end for MicroPython: ``edge/features.py`` without numpy.

Same definition (docs/design.md, "Contracts"): 480-sample frames every 320,
periodic Hann, FFT 512, power, 40 HTK-mel triangles 20-4000 Hz, ln with a
1e-6 floor, orthonormal DCT-II to 10 coefficients. The FFT uses ``ulab`` when
the firmware has it and otherwise a pure-Python one: the 512-point real FFT
as a 256-point complex radix-2 FFT plus the real-split pass (half the work of
a 512-point complex one). The mel filterbank is stored sparsely (each
triangle's first bin and weights, ~250 numbers instead of 257x40), so the
tables take ~5 KB of heap (half the Hann window, cosine twiddles only; the power
spectrum is computed in place for the 128 bins the filterbank reads) and a frame
allocates nothing that outlives it.

    from edge.portable.mfcc import MfccStream, FeatureRing
    ring = FeatureRing()                       # the last 49 frames
    stream = MfccStream(ring)
    stream.push(pcm_int16_array)               # any length; returns how many frames were added
    ring.normalized_into(scale, feats)         # (49*10) floats: window mean removed, / scale
"""

import math

from edge.portable.compat import const, zeros

SAMPLE_RATE = 16000
FRAME_LENGTH = 480
HOP_LENGTH = 320
N_FFT = 512
N_MELS = 40
FMIN = 20.0
FMAX = 4000.0
N_MFCC = 10
LOG_FLOOR = 1e-6
N_FRAMES = 49
_HALF = 256          # complex FFT size used for the 512-point real FFT
_BINS = 257
# the mel triangles end below 4000 Hz = bin 128: the power spectrum is only needed (and only
# computed) for bins 0..127, into the FFT's own buffer (see Mfcc._split_power)
_MEL_BINS = const(128)

try:
    from ulab import numpy as _np  # type: ignore
except ImportError:
    _np = None


def backend():
    """``"ulab"`` when the ulab FFT is used, else ``"python"``."""
    return "python" if _np is None else "ulab"


def _hz_to_mel(hz):
    return 2595.0 * math.log10(1.0 + hz / 700.0)


def _mel_to_hz(mel):
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def _f(n):
    return zeros("f", n)


class Tables:
    """Window, twiddles, sparse mel filterbank and DCT basis, built once per process."""

    def __init__(self):
        # Half of the periodic Hann window: w[n] = w[480 - n], so w[0..240] is all of it
        # (the board's heap keeps 1 KB instead of 2)
        self.window = _f(FRAME_LENGTH // 2 + 1)
        for n in range(FRAME_LENGTH // 2 + 1):
            self.window[n] = 0.5 - 0.5 * math.cos(2.0 * math.pi * n / FRAME_LENGTH)
        # the real-split twiddles for 512 points; the 256-point FFT's are every second one
        # (2*pi*k/256 and 2*pi*(2k)/512 are the same double: scaling by 2 is exact). Only the
        # cosines are stored: sin(2 pi k/512) = cos(2 pi |k - 128|/512)
        self.cos512 = _f(_BINS)
        for k in range(_BINS):
            self.cos512[k] = math.cos(2.0 * math.pi * k / N_FFT)
        bits = 8
        self.rev = zeros("B", _HALF)
        for i in range(_HALF):
            r = 0
            v = i
            for _ in range(bits):
                r = (r << 1) | (v & 1)
                v >>= 1
            self.rev[i] = r
        self._mel()
        self.dct = _f(N_MELS * N_MFCC)
        for n in range(N_MELS):
            for k in range(N_MFCC):
                v = math.cos(math.pi / N_MELS * (n + 0.5) * k) * math.sqrt(2.0 / N_MELS)
                self.dct[n * N_MFCC + k] = v * math.sqrt(0.5) if k == 0 else v

    def _mel(self):
        # two passes (count, then fill a preallocated array): a list of boxed floats
        # would cost ~12 KB of transient heap at boot
        lo = _hz_to_mel(FMIN)
        hi = _hz_to_mel(FMAX)
        self.mel_start = zeros("H", N_MELS)
        self.mel_len = zeros("H", N_MELS)
        self.mel_w = None
        for fill in (False, True):
            pos = 0
            for m in range(N_MELS):
                a = _mel_to_hz(lo + (hi - lo) * m / (N_MELS + 1))
                c = _mel_to_hz(lo + (hi - lo) * (m + 1) / (N_MELS + 1))
                b = _mel_to_hz(lo + (hi - lo) * (m + 2) / (N_MELS + 1))
                first = -1
                n = 0
                for k in range(_BINS):
                    hz = SAMPLE_RATE / 2 * k / (_BINS - 1)
                    w = min((hz - a) / (c - a), (b - hz) / (b - c))
                    if w > 0.0:
                        if first < 0:
                            first = k
                        if fill:
                            self.mel_w[pos + n] = w
                        n += 1
                    elif first >= 0:
                        break
                self.mel_start[m] = max(first, 0)
                self.mel_len[m] = n
                pos += n
                if first + n > _MEL_BINS:  # the in-place power spectrum stops there
                    raise ValueError("mel triangle %d reaches bin %d; FMAX must stay <= 4000 Hz" % (m, first + n))
            if not fill:
                self.mel_w = _f(pos)


_TABLES = None


def tables():
    global _TABLES
    if _TABLES is None:
        _TABLES = Tables()
    return _TABLES


class Mfcc:
    """One frame at a time: ``frame_into(pcm, start, out, off)`` writes 10 coefficients."""

    def __init__(self):
        self.t = tables()
        self.re = _f(_HALF)
        self.im = _f(_HALF)
        self.mel = _f(N_MELS)

    def frame_into(self, pcm, start, out, off=0):
        """MFCC of ``pcm[start:start+480]`` (int16 values) into ``out[off:off+10]``."""
        t = self.t
        win, re, im, rev = t.window, self.re, self.im, t.rev
        if _np is not None:
            return self._frame_ulab(pcm, start, out, off)
        scale = 1.0 / 32768.0
        # even samples -> real part, odd -> imaginary, in bit-reversed order; the window's
        # second half is its first read backwards, and samples 480..511 are zero padding
        for k in range(FRAME_LENGTH // 4):
            n = 2 * k
            j = rev[k]
            re[j] = pcm[start + n] * scale * win[n]
            im[j] = pcm[start + n + 1] * scale * win[n + 1]
        for k in range(FRAME_LENGTH // 4, FRAME_LENGTH // 2):
            n = 2 * k
            j = rev[k]
            re[j] = pcm[start + n] * scale * win[FRAME_LENGTH - n]
            im[j] = pcm[start + n + 1] * scale * win[FRAME_LENGTH - 1 - n]
        for k in range(FRAME_LENGTH // 2, _HALF):
            j = rev[k]
            re[j] = 0.0
            im[j] = 0.0
        self._fft256()
        self._split_power()
        self._mel_log_dct(out, off)

    def _frame_ulab(self, pcm, start, out, off):
        t = self.t
        x = _np.zeros(N_FFT)
        win = t.window
        for n in range(FRAME_LENGTH):
            x[n] = pcm[start + n] / 32768.0 * win[n if n <= FRAME_LENGTH // 2 else FRAME_LENGTH - n]
        r, i = _np.fft.fft(x)
        p = self.re
        for k in range(_MEL_BINS):
            p[k] = r[k] * r[k] + i[k] * i[k]
        self._mel_log_dct(out, off)

    def _fft256(self):
        re, im = self.re, self.im
        c = self.t.cos512
        size = 2
        step = _HALF
        while size <= _HALF:
            half = size >> 1
            k = 0
            # twiddle-major: each twiddle is read once per stage (255 reads a frame, not 1024);
            # butterflies of a stage are independent, so the result is the same bit for bit
            for base in range(half):
                wr = c[k]
                wi = -c[k - 128] if k >= 128 else -c[128 - k]   # -sin(2 pi k/512)
                for j in range(base, _HALF, size):
                    l = j + half
                    tr = re[l] * wr - im[l] * wi
                    ti = re[l] * wi + im[l] * wr
                    re[l] = re[j] - tr
                    im[l] = im[j] - ti
                    re[j] += tr
                    im[j] += ti
                k += step
            size <<= 1
            step >>= 1

    def _split_power(self):
        # X[k] = (Z[k] + conj Z[N-k]) / 2 - i e^{-2 pi i k/512} (Z[k] - conj Z[N-k]) / 2
        # in place: bin k reads Z[k] and Z[256 - k], and for k < 128 the second is never a bin
        # written before (bins 129..255 are not needed), so the power goes into re[k]
        re, im = self.re, self.im
        c = self.t.cos512
        for k in range(_MEL_BINS):
            a = k if k < _HALF else 0
            b = (_HALF - k) % _HALF
            er = 0.5 * (re[a] + re[b])
            ei = 0.5 * (im[a] - im[b])
            orr = 0.5 * (im[a] + im[b])
            oi = -0.5 * (re[a] - re[b])
            wr = c[k]
            wi = -c[k - 128] if k >= 128 else -c[128 - k]
            xr = er + orr * wr - oi * wi
            xi = ei + orr * wi + oi * wr
            re[k] = xr * xr + xi * xi

    def _mel_log_dct(self, out, off):
        t = self.t
        p, mel, w = self.re, self.mel, t.mel_w   # the power spectrum, from _split_power
        starts, lens = t.mel_start, t.mel_len
        pos = 0
        for m in range(N_MELS):
            acc = 0.0
            k0 = starts[m]
            for j in range(lens[m]):
                acc += p[k0 + j] * w[pos + j]
            pos += lens[m]
            mel[m] = math.log(acc if acc > LOG_FLOOR else LOG_FLOOR)
        dct = t.dct
        for k in range(N_MFCC):
            acc = 0.0
            for n in range(N_MELS):
                acc += mel[n] * dct[n * N_MFCC + k]
            out[off + k] = acc


class FeatureRing:
    """The last ``N_FRAMES`` MFCC frames in a preallocated float array, oldest overwritten."""

    def __init__(self, frames=N_FRAMES):
        self.frames = frames
        self.data = _f(frames * N_MFCC)
        self.head = 0        # slot the next frame goes to
        self.count = 0       # frames ever written (saturates at frames only for full())

    def slot(self):
        return self.head * N_MFCC

    def advance(self):
        self.head = self.head + 1 if self.head + 1 < self.frames else 0
        self.count += 1

    def full(self):
        return self.count >= self.frames

    def reset(self):
        self.head = 0
        self.count = 0

    def normalized_into(self, scale, out):
        """Oldest-first window with the per-coefficient mean removed and divided by ``scale``."""
        d, n, head = self.data, self.frames, self.head
        for k in range(N_MFCC):
            acc = 0.0
            for f in range(n):
                acc += d[f * N_MFCC + k]
            mean = acc / n
            inv = 1.0 / scale[k]
            for f in range(n):
                src = (head + f) % n
                out[f * N_MFCC + k] = (d[src * N_MFCC + k] - mean) * inv
        return out


class MfccStream:
    """Push int16 audio of any length; each completed hop writes one frame into ``ring``.

    Frame ``k`` covers stream samples ``[320 k, 320 k + 480)`` as in
    ``edge.features.MfccStream``; only the last 480 samples are kept.
    """

    def __init__(self, ring):
        self.ring = ring
        self.mfcc = Mfcc()
        self.buf = zeros("h", FRAME_LENGTH)
        self.fill = 0
        self.frames_emitted = 0

    def push(self, pcm, start=0, end=None):
        """Consume ``pcm[start:end]`` (int16 values); returns the number of new frames."""
        end = len(pcm) if end is None else end
        buf, ring = self.buf, self.ring
        new = 0
        i = start
        while i < end:
            take = FRAME_LENGTH - self.fill
            if take > end - i:
                take = end - i
            f = self.fill
            for j in range(take):
                buf[f + j] = pcm[i + j]
            self.fill += take
            i += take
            if self.fill == FRAME_LENGTH:
                self.mfcc.frame_into(buf, 0, ring.data, ring.slot())
                ring.advance()
                new += 1
                for j in range(FRAME_LENGTH - HOP_LENGTH):  # keep the 160-sample overlap
                    buf[j] = buf[HOP_LENGTH + j]
                self.fill = FRAME_LENGTH - HOP_LENGTH
        self.frames_emitted += new
        return new

    def reset(self):
        self.fill = 0
        self.frames_emitted = 0
