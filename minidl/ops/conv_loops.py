"""2-D convolution as plain Python loops: the definition, read off one index at a time.

Forward, grad-input and grad-weight of an NHWC × KRSC convolution with stride and zero padding,
each a loop over every index of its sum, with no im2col, no matrix product and no view tricks.
It is far too slow for anything but tiny shapes; its one job is to be obviously right, so that
the NumPy reference of minidl/ops/conv.py (im2col + one matrix product, flipped kernels,
col2im) can be checked against it (tests/ops/test_conv_loops.py).

Details: docs/ops.md, "minidl/ops/conv_loops.py".
"""
import numpy

from minidl.ops.conv import output_size


def _taps(x_shape, w_shape, stride, padding):
    """Every (n, p, q, k, r, s, c, h, w) of the convolution whose input pixel (h, w) lies in the
    image: the terms of the sum y[n,p,q,k] = Σ x[n,h,w,c]·w[k,r,s,c], h = p·stride + r − padding,
    w = q·stride + s − padding. A window position over the zero padding adds nothing."""
    n_images, height, width, channels = x_shape
    filters, kernel_h, kernel_w, _ = w_shape
    out_h = output_size(height, kernel_h, stride, padding)
    out_w = output_size(width, kernel_w, stride, padding)
    for n in range(n_images):
        for p in range(out_h):
            for q in range(out_w):
                for k in range(filters):
                    for r in range(kernel_h):
                        for s in range(kernel_w):
                            h, w = p * stride + r - padding, q * stride + s - padding
                            if 0 <= h < height and 0 <= w < width:
                                for c in range(channels):
                                    yield n, p, q, k, r, s, c, h, w


def forward(x, weight, stride=1, padding=0):
    """y[n,p,q,k] = Σ_{r,s,c} x[n, p·stride + r − padding, q·stride + s − padding, c] · w[k,r,s,c]."""
    n_images, height, width, _ = x.shape
    filters, kernel_h, kernel_w, _ = weight.shape
    y = numpy.zeros((n_images, output_size(height, kernel_h, stride, padding),
                     output_size(width, kernel_w, stride, padding), filters), numpy.float64)
    for n, p, q, k, r, s, c, h, w in _taps(x.shape, weight.shape, stride, padding):
        y[n, p, q, k] += x[n, h, w, c] * weight[k, r, s, c]
    return y


def grad_input(gy, weight, x_shape, stride=1, padding=0):
    """dL/dx[n,h,w,c] = Σ over the outputs that read x[n,h,w,c] of dy[n,p,q,k] · w[k,r,s,c]."""
    gx = numpy.zeros(x_shape, numpy.float64)
    for n, p, q, k, r, s, c, h, w in _taps(x_shape, weight.shape, stride, padding):
        gx[n, h, w, c] += gy[n, p, q, k] * weight[k, r, s, c]
    return gx


def grad_weight(x, gy, w_shape, stride=1, padding=0):
    """dL/dw[k,r,s,c] = Σ_{n,p,q} dy[n,p,q,k] · x[n, p·stride + r − padding, q·stride + s − padding, c]."""
    gw = numpy.zeros(w_shape, numpy.float64)
    for n, p, q, k, r, s, c, h, w in _taps(x.shape, w_shape, stride, padding):
        gw[k, r, s, c] += gy[n, p, q, k] * x[n, h, w, c]
    return gw
