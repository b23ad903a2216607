"""int8 inference kernels for the MCU model variant, formula for formula TFLite's reference ones.

Each layer is a small object built once (weights re-laid out for the inner
loop, per-channel requantisation multipliers computed) whose ``run(inp, out)``
reads and writes preallocated ``array('b')`` activations (NHWC, batch 1) and
allocates nothing that outlives the call. Accumulation is int32, bias is
int32, requantisation is ``multiply_by_quantized_multiplier`` from
``edge.portable.quant`` (TFLite's double rounding), clamping to the fused
activation's range: the same integers TFLite Micro computes
(``tensorflow/lite/kernels/internal/reference/integer_ops/{conv,depthwise_conv,
fully_connected,pooling}.h``). Weights are symmetric int8 (zero point 0), as
the TFLite converter writes them.

    from edge.portable.kernels import Conv2D, act_range
    conv = Conv2D(w_ohwi, bias, (49, 10, 1), (25, 5, 16), (10, 4), (2, 2), "SAME",
                  in_q=(0.1, -3), w_scales=scales, out_q=(0.05, -128), act=act_range("RELU", 0.05, -128))
    conv.run(x, y)       # x, y: array('b') of 490 and 2000 elements
"""

import math

from edge.portable.compat import zeros
from edge.portable.quant import multiply_by_quantized_multiplier, quantize_multiplier

_I8_MIN = -128
_I8_MAX = 127


def zeros_i8(n):
    return zeros("b", n)


def same_padding(in_size, k, stride, dilation=1):
    """TFLite ComputePaddingHeightWidth for SAME: (output size, padding before)."""
    out = (in_size + stride - 1) // stride
    eff = (k - 1) * dilation + 1
    total = max((out - 1) * stride + eff - in_size, 0)
    return out, total // 2


def valid_size(in_size, k, stride, dilation=1):
    return (in_size - ((k - 1) * dilation + 1)) // stride + 1


def act_range(act, scale, zero_point):
    """TFLite CalculateActivationRangeQuantized for int8 outputs: (min, max)."""
    def q(x):
        return zero_point + int(math.floor(x / scale + 0.5)) if x >= 0 else zero_point - int(math.floor(-x / scale + 0.5))

    if act is None:
        return _I8_MIN, _I8_MAX
    if act == "RELU":
        return max(_I8_MIN, q(0.0)), _I8_MAX
    if act == "RELU6":
        return max(_I8_MIN, q(0.0)), min(_I8_MAX, q(6.0))
    if act == "RELU_N1_TO_1":
        return max(_I8_MIN, q(-1.0)), min(_I8_MAX, q(1.0))
    raise ValueError("activation %r has no int8 kernel here; use RELU, RELU6 or none" % (act,))


def multipliers(in_scale, w_scales, out_scale, n):
    """Per-channel (multiplier, shift) arrays for ``in_scale * w_scale[c] / out_scale``.

    The product is taken in double from the float32 scales, as TFLite's
    PopulateConvolutionQuantizationParams does; one scale means per-tensor.
    """
    m = zeros("i", n)
    s = zeros("i", n)
    for c in range(n):
        ws = w_scales[c] if len(w_scales) > 1 else w_scales[0]
        m[c], s[c] = quantize_multiplier(in_scale * ws / out_scale)
    return m, s


def _check_len(name, buf, n):
    if len(buf) != n:
        raise ValueError("%s: expected %d elements, got %d" % (name, n, len(buf)))


class Conv2D:
    """CONV_2D with int8 OHWI weights (dilation 1)."""

    def __init__(self, weights, bias, in_shape, out_shape, kernel, stride, padding, in_q, w_scales, out_q,
                 act=(_I8_MIN, _I8_MAX)):
        self.ih, self.iw, self.ic = in_shape
        self.oh, self.ow, self.oc = out_shape
        self.kh, self.kw = kernel
        self.sh, self.sw = stride
        _check_len("conv2d weights", weights, self.oc * self.kh * self.kw * self.ic)
        if padding == "SAME":
            oh, self.pt = same_padding(self.ih, self.kh, self.sh)
            ow, self.pl = same_padding(self.iw, self.kw, self.sw)
        else:
            oh, ow, self.pt, self.pl = valid_size(self.ih, self.kh, self.sh), valid_size(self.iw, self.kw, self.sw), 0, 0
        if (oh, ow) != (self.oh, self.ow):
            raise ValueError("conv2d: output %dx%d does not follow from the input and padding (%dx%d)"
                             % (self.oh, self.ow, oh, ow))
        # kept OHWI as stored (no re-laid-out copy: on a board that copy is the largest transient)
        self.taps = self.kh * self.kw * self.ic
        self.w = weights
        self.bias = bias if bias is not None else zeros("i", self.oc)
        self.in_off = -in_q[1]
        self.out_zp = out_q[1]
        self.mult, self.shift = multipliers(in_q[0], w_scales, out_q[0], self.oc)
        self.amin, self.amax = act
        self.acc = zeros("i", self.oc)

    def run(self, x, y):
        ih, iw, ic, ow, oc = self.ih, self.iw, self.ic, self.ow, self.oc
        kh, kw, sh, sw, pt, pl = self.kh, self.kw, self.sh, self.sw, self.pt, self.pl
        w, bias, acc, off, taps = self.w, self.bias, self.acc, self.in_off, self.taps
        mult, shift, zp, amin, amax = self.mult, self.shift, self.out_zp, self.amin, self.amax
        mbqm = multiply_by_quantized_multiplier
        o = 0
        for oy in range(self.oh):
            y0 = oy * sh - pt
            fy0 = -y0 if y0 < 0 else 0
            fy1 = ih - y0 if y0 + kh > ih else kh
            for ox in range(ow):
                x0 = ox * sw - pl
                fx0 = -x0 if x0 < 0 else 0
                fx1 = iw - x0 if x0 + kw > iw else kw
                for c in range(oc):
                    acc[c] = bias[c]
                for fy in range(fy0, fy1):
                    row = (y0 + fy) * iw
                    for fx in range(fx0, fx1):
                        p = (row + x0 + fx) * ic
                        t = (fy * kw + fx) * ic
                        for i in range(ic):
                            v = x[p + i] + off
                            wi = t + i
                            for c in range(oc):
                                acc[c] += w[wi] * v
                                wi += taps
                for c in range(oc):
                    r = mbqm(acc[c], mult[c], shift[c]) + zp
                    y[o] = amin if r < amin else (amax if r > amax else r)
                    o += 1


class DepthwiseConv2D:
    """DEPTHWISE_CONV_2D, depth multiplier 1, weights ``(1, kh, kw, C)``."""

    def __init__(self, weights, bias, in_shape, out_shape, kernel, stride, padding, in_q, w_scales, out_q,
                 act=(_I8_MIN, _I8_MAX), depth_multiplier=1):
        if depth_multiplier != 1 or in_shape[2] != out_shape[2]:
            raise ValueError("depthwise conv: only depth multiplier 1 is implemented")
        self.ih, self.iw, self.c = in_shape
        self.oh, self.ow, _ = out_shape
        self.kh, self.kw = kernel
        self.sh, self.sw = stride
        _check_len("depthwise weights", weights, self.kh * self.kw * self.c)
        if padding == "SAME":
            _, self.pt = same_padding(self.ih, self.kh, self.sh)
            _, self.pl = same_padding(self.iw, self.kw, self.sw)
        else:
            self.pt = self.pl = 0
        self.w = weights
        self.bias = bias if bias is not None else zeros("i", self.c)
        self.in_off = -in_q[1]
        self.out_zp = out_q[1]
        self.mult, self.shift = multipliers(in_q[0], w_scales, out_q[0], self.c)
        self.amin, self.amax = act
        self.acc = zeros("i", self.c)

    def run(self, x, y):
        ih, iw, C, ow = self.ih, self.iw, self.c, self.ow
        kh, kw, sh, sw, pt, pl = self.kh, self.kw, self.sh, self.sw, self.pt, self.pl
        w, bias, acc, off = self.w, self.bias, self.acc, self.in_off
        mult, shift, zp, amin, amax = self.mult, self.shift, self.out_zp, self.amin, self.amax
        mbqm = multiply_by_quantized_multiplier
        o = 0
        for oy in range(self.oh):
            y0 = oy * sh - pt
            fy0 = -y0 if y0 < 0 else 0
            fy1 = ih - y0 if y0 + kh > ih else kh
            for ox in range(ow):
                x0 = ox * sw - pl
                fx0 = -x0 if x0 < 0 else 0
                fx1 = iw - x0 if x0 + kw > iw else kw
                for c in range(C):
                    acc[c] = bias[c]
                for fy in range(fy0, fy1):
                    for fx in range(fx0, fx1):
                        p = ((y0 + fy) * iw + x0 + fx) * C
                        wb = (fy * kw + fx) * C
                        for c in range(C):
                            acc[c] += w[wb + c] * (x[p + c] + off)
                for c in range(C):
                    r = mbqm(acc[c], mult[c], shift[c]) + zp
                    y[o] = amin if r < amin else (amax if r > amax else r)
                    o += 1


class AvgPool2D:
    """AVERAGE_POOL_2D (int8: same scale in and out; rounds half away from zero, C division)."""

    def __init__(self, in_shape, out_shape, kernel, stride, padding, act=(_I8_MIN, _I8_MAX)):
        self.ih, self.iw, self.c = in_shape
        self.oh, self.ow, _ = out_shape
        self.kh, self.kw = kernel
        self.sh, self.sw = stride
        if padding == "SAME":
            _, self.pt = same_padding(self.ih, self.kh, self.sh)
            _, self.pl = same_padding(self.iw, self.kw, self.sw)
        else:
            self.pt = self.pl = 0
        self.amin, self.amax = act
        self.acc = zeros("i", self.c)

    def run(self, x, y):
        ih, iw, C, acc = self.ih, self.iw, self.c, self.acc
        o = 0
        for oy in range(self.oh):
            y0 = oy * self.sh - self.pt
            fy0, fy1 = max(0, -y0), min(self.kh, ih - y0)
            for ox in range(self.ow):
                x0 = ox * self.sw - self.pl
                fx0, fx1 = max(0, -x0), min(self.kw, iw - x0)
                for c in range(C):
                    acc[c] = 0
                for fy in range(fy0, fy1):
                    for fx in range(fx0, fx1):
                        p = ((y0 + fy) * iw + x0 + fx) * C
                        for c in range(C):
                            acc[c] += x[p + c]
                n = (fy1 - fy0) * (fx1 - fx0)
                if n <= 0:
                    raise ValueError("average pool: a window with no input pixels")
                h = n // 2
                for c in range(C):
                    a = acc[c]
                    r = (a + h) // n if a > 0 else -((-a + h) // n)
                    y[o] = self.amin if r < self.amin else (self.amax if r > self.amax else r)
                    o += 1


class Dense:
    """FULLY_CONNECTED with int8 weights ``(out, in)``, per-tensor or per-channel scales."""

    def __init__(self, weights, bias, n_in, n_out, in_q, w_scales, out_q, act=(_I8_MIN, _I8_MAX)):
        _check_len("dense weights", weights, n_in * n_out)
        self.n_in, self.n_out = n_in, n_out
        self.w = weights
        self.bias = bias if bias is not None else zeros("i", n_out)
        self.in_off = -in_q[1]
        self.out_zp = out_q[1]
        self.mult, self.shift = multipliers(in_q[0], w_scales, out_q[0], n_out)
        self.amin, self.amax = act

    def run(self, x, y):
        n_in, w, off = self.n_in, self.w, self.in_off
        mult, shift, zp, amin, amax = self.mult, self.shift, self.out_zp, self.amin, self.amax
        mbqm = multiply_by_quantized_multiplier
        for o in range(self.n_out):
            acc = self.bias[o]
            b = o * n_in
            for i in range(n_in):
                acc += w[b + i] * (x[i] + off)
            r = mbqm(acc, mult[o], shift[o]) + zp
            y[o] = amin if r < amin else (amax if r > amax else r)


def quantize_input(values, scale, zero_point, out):
    """float -> int8 as TFLite's QUANTIZE (round half away from zero, clamp); ``out`` is array('b')."""
    for i in range(len(values)):
        t = values[i] / scale
        r = int(math.floor(t + 0.5)) if t >= 0 else -int(math.floor(-t + 0.5))
        r += zero_point
        out[i] = _I8_MIN if r < _I8_MIN else (_I8_MAX if r > _I8_MAX else r)
    return out


def softmax(q, scale, zero_point, out):
    """Float softmax of int8 logits into ``out`` (array('f')); the board does not need int8 softmax."""
    n = len(q)
    m = q[0]
    for i in range(1, n):
        if q[i] > m:
            m = q[i]
    total = 0.0
    for i in range(n):
        e = math.exp((q[i] - m) * scale)
        out[i] = e
        total += e
    for i in range(n):
        out[i] = out[i] / total
    return out
