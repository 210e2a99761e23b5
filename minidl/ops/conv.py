"""2-D convolution, NHWC activations and KRSC weights, as im2col + one matrix product.

Forward: the padded input is viewed (no copy) as windows of shape (N, P, Q, R, S, C); with
channels last, one window row (r, s, c) is exactly one row of the weight matrix (K, R·S·C),
so `cols (N·P·Q, R·S·C) @ w.T` gives the output directly in NHWC order. A 1×1 stride-1
convolution needs no im2col at all: it is a plain product of the activation matrix.

Backward: grad-weight = dy.T @ cols; cols are rebuilt rather than kept (they are R·S times
the input and would dominate memory). Grad-input of a stride-1 convolution is itself a
convolution: dy padded by R−1−padding, with the kernel flipped and its in/out channels
swapped. Strided convolutions use col2im(dy @ w) instead, adding each of the R·S window
offsets back into the padded input with one strided slice each.

Every pass runs over chunks of images (minidl.parallel): each chunk's im2col block is
consumed while still in cache, and the chunks run on all cores.
"""
from minidl import kernels
from minidl.autograd import Function
from minidl.backend import get_array_module
from minidl.parallel import run_chunks, sum_chunks


def output_size(size, kernel, stride, padding):
    return (size + 2 * padding - kernel) // stride + 1


def pad_hw(x, padding, value=0.0):
    if padding == 0:
        return x
    xp = get_array_module(x)
    return xp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)), constant_values=value)


def windows(x_padded, kernel_h, kernel_w, stride, out_h, out_w):
    """A strided (N, P, Q, R, S, C) view of every receptive field; nothing is copied."""
    xp = get_array_module(x_padded)
    n, _, _, c = x_padded.shape
    sn, sh, sw, sc = x_padded.strides
    return xp.lib.stride_tricks.as_strided(
        x_padded, (n, out_h, out_w, kernel_h, kernel_w, c),
        (sn, sh * stride, sw * stride, sh, sw, sc))


def im2col(x, kernel_h, kernel_w, stride, padding):
    """The (N·P·Q, R·S·C) matrix of receptive fields (a view when the conv is 1×1, stride 1)."""
    n, h, w, c = x.shape
    p, q = output_size(h, kernel_h, stride, padding), output_size(w, kernel_w, stride, padding)
    if kernel_h == kernel_w == 1 and padding == 0:
        return x[:, ::stride, ::stride, :].reshape(n * p * q, c)
    return windows(pad_hw(x, padding), kernel_h, kernel_w, stride, p, q).reshape(n * p * q, -1)


def col2im(cols, x_shape, kernel_h, kernel_w, stride, padding):
    """Adjoint of im2col: sum every window's entries back onto the (N, H, W, C) input."""
    xp = get_array_module(cols)
    n, h, w, c = x_shape
    p, q = output_size(h, kernel_h, stride, padding), output_size(w, kernel_w, stride, padding)
    cols = cols.reshape(n, p, q, kernel_h, kernel_w, c)
    dx = xp.zeros((n, h + 2 * padding, w + 2 * padding, c), dtype=cols.dtype)
    for r in range(kernel_h):
        for s in range(kernel_w):
            dx[:, r:r + stride * (p - 1) + 1:stride, s:s + stride * (q - 1) + 1:stride, :] += cols[:, :, :, r, s, :]
    return dx[:, padding:padding + h, padding:padding + w, :]


def _cols_bytes(p, q, w):
    """Bytes of one image's (P·Q, R·S·C) column block: what a chunk keeps in cache."""
    return p * q * w[0].size * w.itemsize


def correlate(x, w, stride, padding):
    """The convolution itself: (N, H, W, C) * (K, R, S, C) -> (N, P, Q, K)."""
    n, h, width, _ = x.shape
    k, r, s, _ = w.shape
    p, q = output_size(h, r, stride, padding), output_size(width, s, stride, padding)
    if p <= 0 or q <= 0:
        raise ValueError(f"conv2d: a {r}x{s} kernel does not fit a {h}x{width} input with padding {padding}")
    xp = get_array_module(x)
    w_t = w.reshape(k, -1).T
    y = xp.empty((n, p, q, k), dtype=xp.result_type(x, w))

    def chunk(start, stop):
        xp.matmul(im2col(x[start:stop], r, s, stride, padding), w_t, out=y[start:stop].reshape(-1, k))

    run_chunks(chunk, n, _cols_bytes(p, q, w))
    return y


def grad_input(gy, w, x_shape, stride, padding):
    """dL/dx: a stride-1 convolution of dy with the flipped, channel-swapped kernel where that
    applies (stride 1, square kernel, padding < R), col2im of dy @ w otherwise."""
    k, r, s, _ = w.shape
    if stride == 1 and r == s and padding < r:
        flipped = w[:, ::-1, ::-1, :].transpose(3, 1, 2, 0).copy()  # (C, R, S, K)
        return correlate(gy, flipped, 1, r - 1 - padding)
    xp = get_array_module(gy)
    n, h, width, c = x_shape
    w2d = w.reshape(k, -1)
    gx = xp.empty(x_shape, dtype=gy.dtype)

    def chunk(start, stop):
        cols = gy[start:stop].reshape(-1, k) @ w2d
        gx[start:stop] = col2im(cols, (stop - start, h, width, c), r, s, stride, padding)

    run_chunks(chunk, n, _cols_bytes(*gy.shape[1:3], w))
    return gx


def grad_weight(x, gy, w, stride, padding):
    """dL/dw = Σ over chunks of dy_chunk.T @ cols_chunk, summed in chunk order."""
    k, r, s, _ = w.shape

    def chunk(start, stop):
        return gy[start:stop].reshape(-1, k).T @ im2col(x[start:stop], r, s, stride, padding)

    return sum_chunks(chunk, x.shape[0], _cols_bytes(*gy.shape[1:3], w)).reshape(w.shape)


class Conv2d(Function):
    def __init__(self, stride, padding):
        self.stride, self.padding = stride, padding

    def forward(self, x, w, b=None):
        self.x, self.w, self.has_bias = x, w, b is not None
        if kernels.wants(x, w):
            y = kernels.device().conv_forward(x, w, self.stride, self.padding)
        else:
            y = correlate(x, w, self.stride, self.padding)
        if b is not None:
            y += b
        return y

    def backward(self, gy):
        x, w = self.x, self.w
        if kernels.wants(gy, x, w):
            gpu = kernels.device()
            gx = None  # for an input that needs none, the image: the stem's costly grad-input
            if self.inputs[0].requires_grad:
                gx = gpu.conv_grad_input(gy, w, x.shape, self.stride, self.padding)
            gw = gpu.conv_grad_weight(x, gy, w.shape, self.stride, self.padding)
        else:
            gx = grad_input(gy, w, x.shape, self.stride, self.padding)
            gw = grad_weight(x, gy, w, self.stride, self.padding)
        if not self.has_bias:
            return gx, gw
        return gx, gw, gy.reshape(-1, w.shape[0]).sum(axis=0)


def conv2d(x, w, b=None, stride=1, padding=0):
    """y[n,p,q,k] = sum_{r,s,c} x_pad[n, p·stride + r, q·stride + s, c] · w[k,r,s,c] (+ b[k])."""
    function = Conv2d(stride, padding)
    return function(x, w) if b is None else function(x, w, b)
