"""int8 quantisation helpers shared by the wire codec and the MCU kernels.

Scales are float32 values (what a frame or a ``.tflite`` stores); the maths on
them is IEEE double, as CPython and the MicroPython unix port both do, so the
same inputs give the same int8 bytes on both. Stochastic rounding draws from
``Lfib24``, a small generator defined here (not ``random``) because CPython and
MicroPython implement ``random`` differently and the stream must be identical
everywhere, including in the numpy encoder on the host.

The fixed-point helpers are TFLite's, formula for formula
(``tensorflow/lite/kernels/internal/quantization_util.cc`` and gemmlowp's
``fixedpoint.h``, default build without ``TFLITE_SINGLE_ROUNDING``).

    from edge.portable.quant import symmetric_scale, quantize, dequantize, Lfib24
    s = symmetric_scale(max(abs(v) for v in xs))
    q = quantize(xs, s, rng=Lfib24(seed=7))      # array('b'), unbiased stochastic rounding
    xs_hat = dequantize(q, s)                      # array('f')
    m, shift = quantize_multiplier(0.0123)         # TFLite requantisation multiplier
"""

import array
import math
import struct

from edge.portable.compat import const

INT32_MIN = const(-2147483648)
INT32_MAX = const(2147483647)
FLT_MAX = 3.4028234663852886e38
_LAG_LONG = const(55)
_LAG_SHORT = const(24)
_MASK24 = const(0xFFFFFF)
_WARMUP = const(220)
_TWO_POW_24 = 16777216.0


def f32(x):
    """``x`` rounded to the nearest float32, as a Python float (the value a frame stores)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def round_half_away(x):
    """``std::round``: halves go away from zero (Python's ``round`` goes to even)."""
    a = abs(x)
    r = math.floor(a)
    if a - r >= 0.5:
        r += 1
    return int(r) if x >= 0 else -int(r)


class Lfib24:
    """Additive lagged-Fibonacci generator x[n] = x[n-55] + x[n-24] mod 2**24 (Knuth, TAOCP 3.2.2).

    Chosen because it needs only 24-bit additions: on an ESP32 every value
    stays a small int (no heap), yet its period (about 2**78) and
    equidistribution are ample for rounding noise. Seeded from a 32-bit
    integer through xorshift32; the first 220 outputs are discarded.
    """

    def __init__(self, seed):
        if not isinstance(seed, int) or seed < 0 or seed > 0xFFFFFFFF:
            raise ValueError("seed must be an int in [0, 2**32), got %r" % (seed,))
        self.s = lfib24_state(seed)
        self.i = 0
        for _ in range(_WARMUP):
            self.next24()

    def next24(self):
        """The next output, an int in [0, 2**24)."""
        s = self.s
        i = self.i
        j = i + 31
        if j >= 55:
            j -= 55
        v = (s[i] + s[j]) & _MASK24
        s[i] = v
        self.i = i + 1 if i < 54 else 0
        return v

    def uniform(self):
        """The next output as a float in [0, 1) (exactly ``next24() / 2**24``)."""
        return self.next24() / _TWO_POW_24


def lfib24_state(seed):
    """The 55 initial 24-bit words for ``seed`` (xorshift32, top 24 bits, first word forced odd)."""
    z = seed or 0x9E3779B9  # xorshift32 has 0 as a fixed point
    s = array.array("i", bytes(4 * _LAG_LONG))
    for k in range(_LAG_LONG):
        z ^= (z << 13) & 0xFFFFFFFF
        z ^= z >> 17
        z ^= (z << 5) & 0xFFFFFFFF
        s[k] = z >> 8
    s[0] |= 1  # an odd word guarantees the full period of the additive generator
    return s


def symmetric_scale(max_abs, qmax=127):
    """float32 scale for symmetric quantisation (zero point 0): ``max_abs / qmax``, 0.0 for an all-zero tensor."""
    if not (max_abs >= 0.0) or max_abs > FLT_MAX:
        raise ValueError("max_abs must be finite and >= 0, got %r" % (max_abs,))
    if max_abs == 0.0:
        return 0.0  # also for -0.0 (a max taken as "v if v >= 0 else -v"): numpy's abs gives +0.0
    return f32(max_abs / qmax)


def asymmetric_params(rmin, rmax, qmin=-128, qmax=127):
    """(scale, zero_point) covering [rmin, rmax] and exactly 0.0, as TFLite's ChooseQuantizationParams."""
    if not (rmin <= rmax) or rmax > FLT_MAX or rmin < -FLT_MAX:
        raise ValueError("need finite rmin <= rmax, got %r, %r" % (rmin, rmax))
    rmin = min(rmin, 0.0)
    rmax = max(rmax, 0.0)
    if rmin == rmax:
        return 0.0, 0
    scale = (rmax - rmin) / (qmax - qmin)
    if f32(scale) == 0.0:  # a range below float32's smallest step quantises to all zero points
        return 0.0, 0
    zp_from_min = qmin - rmin / scale
    zp_from_max = qmax - rmax / scale
    err_min = abs(qmin) + abs(rmin / scale)
    err_max = abs(qmax) + abs(rmax / scale)
    zp = zp_from_min if err_min < err_max else zp_from_max
    if zp < qmin:
        nudged = qmin
    elif zp > qmax:
        nudged = qmax
    else:
        nudged = round_half_away(zp)
    return f32(scale), nudged


def quantize_into(values, scale, out, offset=0, rng=None, zero_point=0, qmin=-127, qmax=127):
    """Quantise ``values`` into ``out[offset:offset+len(values)]``; returns the new offset.

    ``out`` may be an ``array('b')`` (signed values) or a ``bytearray`` /
    byte ``memoryview`` (two's-complement bytes, as on the wire). With
    ``rng`` (an ``Lfib24``) rounding is stochastic, ``floor(x/scale + u)``,
    one draw per element even when ``scale`` is 0, so the stream position
    depends only on the element count; without it, halves round away from 0.
    No temporary list is built: this is the MCU path.
    """
    mask = -1 if isinstance(out, array.array) else 0xFF
    n = len(values)
    if scale == 0.0:
        for k in range(n):
            if rng is not None:
                rng.next24()
            out[offset + k] = zero_point & mask
        return offset + n
    if rng is None:
        for k in range(n):
            t = values[k] / scale
            a = abs(t)
            r = math.floor(a)
            q = int(r) + (1 if a - r >= 0.5 else 0)
            q = (q if t >= 0 else -q) + zero_point
            q = qmin if q < qmin else (qmax if q > qmax else q)
            out[offset + k] = q & mask
        return offset + n
    s = rng.s
    i = rng.i
    for k in range(n):
        j = i + 31
        if j >= 55:
            j -= 55
        v = (s[i] + s[j]) & _MASK24
        s[i] = v
        i = i + 1 if i < 54 else 0
        q = int(math.floor(values[k] / scale + v / _TWO_POW_24)) + zero_point
        q = qmin if q < qmin else (qmax if q > qmax else q)
        out[offset + k] = q & mask
    rng.i = i
    return offset + n


def quantize(values, scale, rng=None, zero_point=0, qmin=-127, qmax=127):
    """``values`` as a new ``array('b')``; see ``quantize_into``."""
    out = array.array("b", bytes(len(values)))
    quantize_into(values, scale, out, 0, rng, zero_point, qmin, qmax)
    return out


def dequantize(q, scale, zero_point=0, out=None):
    """``(q - zero_point) * scale`` as float32, into ``out`` (an ``array('f')``) if given."""
    n = len(q)
    if out is None:
        out = array.array("f", bytes(4 * n))
    for k in range(n):
        out[k] = (q[k] - zero_point) * scale
    return out


# --- TFLite fixed-point requantisation -------------------------------------

def _wrap32(x):
    x &= 0xFFFFFFFF
    return x - 0x100000000 if x & 0x80000000 else x


def _div_trunc(n, d):
    # C integer division truncates toward zero; Python's // floors.
    return n // d if n >= 0 else -((-n) // d)


def quantize_multiplier(real_multiplier):
    """TFLite QuantizeMultiplier: ``real ~= m * 2**(shift - 31)`` with int32 ``m`` in [2**30, 2**31)."""
    if real_multiplier == 0.0:
        return 0, 0
    q, shift = math.frexp(real_multiplier)
    q_fixed = round_half_away(q * 2147483648.0)
    if q_fixed > 2147483648 or q_fixed < -2147483648:
        raise ValueError("quantize_multiplier: %r is not a finite number" % (real_multiplier,))
    if q_fixed == 2147483648:
        q_fixed //= 2
        shift += 1
    if q_fixed > INT32_MAX:
        raise ValueError("quantize_multiplier: %r overflows int32" % (real_multiplier,))
    if shift < -31:
        shift = 0
        q_fixed = 0
    return q_fixed, shift


def saturating_rounding_doubling_high_mul(a, b):
    """gemmlowp SaturatingRoundingDoublingHighMul: round(a * b / 2**31), saturating INT32_MIN**2."""
    if a == b and a == INT32_MIN:
        return INT32_MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else (1 - (1 << 30))
    return _wrap32(_div_trunc(ab + nudge, 1 << 31))


def rounding_divide_by_pot(x, exponent):
    """gemmlowp RoundingDivideByPOT: x / 2**exponent rounded half away from zero, 0 <= exponent <= 31."""
    if exponent < 0 or exponent > 31:
        raise ValueError("rounding_divide_by_pot: exponent must be in [0, 31], got %d" % exponent)
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def multiply_by_quantized_multiplier(x, quantized_multiplier, shift):
    """TFLite MultiplyByQuantizedMultiplier (double rounding), int32 in and out."""
    left_shift = shift if shift > 0 else 0
    right_shift = 0 if shift > 0 else -shift
    return rounding_divide_by_pot(
        saturating_rounding_doubling_high_mul(_wrap32(x * (1 << left_shift)), quantized_multiplier),
        right_shift)
