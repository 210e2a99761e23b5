"""2-D convolution, NHWC activations and KRSC weights, as im2col + one matrix product.

With channels last one im2col window row (r, s, c) is one row of the (K, R·S·C) weight matrix,
so `cols @ w.T` is the output in NHWC order; a 1×1 stride-1 convolution needs no im2col.
Backward rebuilds cols rather than keeping them. Every pass runs over chunks of images in
parallel (minidl.parallel) in per-thread work arrays (minidl.workspace); optional per-chunk
`load` and `store` hooks let the fused ops of minidl.ops.normconv ride along the passes.

Details: docs/ops.md, "minidl/ops/conv.py".
"""
from minidl import workspace
from minidl.backend import BF16, get_array_module
from minidl.intmath import ceil_div
from minidl.ops.bias import add_bias, with_bias_grad
from minidl.ops.dispatch import Op
from minidl.parallel import chunks, matmul, run_all, sum_in_order

MIN_ROWS = 512  # a chunk's share of the rows of a product: fewer would re-read the weights for little work


def output_size(size, kernel, stride, padding):
    return (size + 2 * padding - kernel) // stride + 1


def windows(x_padded, kernel_h, kernel_w, stride, out_h, out_w):
    """A strided (N, P, Q, R, S, C) view of every receptive field; nothing is copied."""
    xp = get_array_module(x_padded)
    n, _, _, c = x_padded.shape
    sn, sh, sw, sc = x_padded.strides
    return xp.lib.stride_tricks.as_strided(
        x_padded, (n, out_h, out_w, kernel_h, kernel_w, c),
        (sn, sh * stride, sw * stride, sh, sw, sc))


def image_rows(a):
    """An (N, H, W, C) array as (N, H, W·C): a view where each image row is contiguous."""
    n, h, w, c = a.shape
    return a.reshape(n, h, w * c)


def loaded(x, load, first):
    """load's result for the images of x (the first being image `first` of the batch), in a
    per-thread work array: valid until this thread's next call."""
    out = workspace.scratch("loaded", x.shape, x)
    load(image_rows(x), image_rows(out), first)
    return out


def im2col(x, kernel_h, kernel_w, stride, padding, load=None, first=0):
    """The (N·P·Q, R·S·C) matrix of receptive fields, in a per-thread work array (a view of x
    itself when the conv is 1×1, stride 1, without `load`): valid until this thread's next im2col.
    With `load`, the fields of load's result for x's images (the first being image `first`)."""
    n, h, w, c = x.shape
    p, q = output_size(h, kernel_h, stride, padding), output_size(w, kernel_w, stride, padding)
    if padding:
        padded = workspace.zero_bordered((n, h + 2 * padding, w + 2 * padding, c), padding, x)
        interior = padded.reshape(n, h + 2 * padding, -1)[:, padding:padding + h, padding * c:(padding + w) * c]
        if load is None:
            interior[...] = image_rows(x)
        else:
            load(image_rows(x), interior, first)
        x = padded
    elif load is not None:
        x = loaded(x, load, first)
    if kernel_h == kernel_w == 1 and padding == 0 and stride == 1:
        return x.reshape(n * h * w, c)
    xp = get_array_module(x)
    cols = workspace.scratch("im2col", (n * p * q, kernel_h * kernel_w * c), x)
    xp.copyto(cols.reshape(n, p, q, kernel_h, kernel_w, c), windows(x, kernel_h, kernel_w, stride, p, q))
    return cols


def col2im_add(cols, dx, kernel_h, kernel_w, stride, padding):
    """dx = the adjoint of im2col: every window's entries of cols summed onto the (N, H, W, C)
    dx, one strided slice per window offset, clipped to the image (no padded copy)."""
    n, h, w, c = dx.shape
    p, q = output_size(h, kernel_h, stride, padding), output_size(w, kernel_w, stride, padding)
    cols = cols.reshape(n, p, q, kernel_h, kernel_w, c)
    dx.fill(0)
    for r in range(kernel_h):
        rows = window_range(r - padding, stride, p, h)
        for s in range(kernel_w):
            columns = window_range(s - padding, stride, q, w)
            if rows and columns:
                dx[:, rows[1], columns[1], :] += cols[:, rows[0], columns[0], r, s, :]


def window_range(offset, stride, out_size, in_size):
    """The outputs o whose input index offset + stride·o lies in range(in_size), as (slice of o,
    slice of those input indexes); None where there are none. Window offset r of a padded
    window reads input offset r − padding: this clips it to the image instead of padding it."""
    first = max(0, -(offset // stride))
    stop = min(out_size, (in_size - 1 - offset) // stride + 1)
    if stop <= first:
        return None
    return slice(first, stop), slice(offset + stride * first, offset + stride * (stop - 1) + 1, stride)


def _image_chunks(images, p, q, rsc, itemsize):
    """Chunks of images whose (P·Q, R·S·C) column blocks take about CHUNK_BYTES (consumed while
    in cache), and which give at least MIN_ROWS rows to their matrix product."""
    return chunks(images, p * q * rsc * itemsize, min_items=ceil_div(MIN_ROWS, p * q))


def _over_chunks(chunk, pieces):
    """Run chunk(start, stop, multiply) over the image chunks in parallel, multiply being the
    matrix product to use: a plain one per chunk, or minidl.parallel.matmul (column blocks in
    parallel) where all images make one chunk."""
    if len(pieces) == 1:
        return [chunk(*pieces[0], matmul)]
    return run_all(chunk, pieces)


def correlate(x, w, stride, padding, load=None, store=None):
    """The convolution itself: (N, H, W, C) * (K, R, S, C) -> (N, P, Q, K) (hooks: see above)."""
    k, r, s, _ = w.shape
    return _correlate(x, w.reshape(k, -1).T, r, s, stride, padding, load, store)


def _correlate(x, w_t, kernel_h, kernel_w, stride, padding, load=None, store=None):
    """The convolution with its weights as the (R·S·C, K) matrix w_t: row (r, s, c) holds the K
    taps at that window position."""
    n, h, width, _ = x.shape
    p, q = output_size(h, kernel_h, stride, padding), output_size(width, kernel_w, stride, padding)
    if p <= 0 or q <= 0:
        raise ValueError(f"conv2d: a {kernel_h}x{kernel_w} kernel does not fit a {h}x{width} input with "
                         f"padding {padding}")
    xp = get_array_module(x)
    k = w_t.shape[1]
    y = xp.empty((n, p, q, k), dtype=xp.result_type(x, w_t))

    def chunk(start, stop, multiply=xp.matmul):
        cols = im2col(x[start:stop], kernel_h, kernel_w, stride, padding, load, start)
        multiply(cols, w_t, out=y[start:stop].reshape(-1, k))
        if store is not None:
            store(y[start:stop], start)

    _over_chunks(chunk, _image_chunks(n, p, q, w_t.shape[0], w_t.itemsize))
    return y


def flipped_weights(w):
    """The (R·S·K, C) weight matrix of grad-input as a convolution: row (r, s, k) holds
    w[k, R−1−r, S−1−s, :]. One copy, contiguous runs of C (a view for 1×1 kernels)."""
    k, r, s, c = w.shape
    if r == s == 1:
        return w.reshape(k, c)
    return w[:, ::-1, ::-1, :].transpose(1, 2, 0, 3).reshape(r * s * k, c)


def _input_grad_is_correlation(gy, w, stride, padding):
    """Whether grad-input goes as a stride-1 convolution of dy: where that applies (stride 1,
    square kernel, padding < R) and pays: the flipped kernel is a copy (except for 1×1), cheap
    where dy has more rows than the kernel has filters; col2im of dy @ w otherwise."""
    k, r, s, _ = w.shape
    return stride == 1 and r == s and padding < r and (r == 1 or gy.size // k > k)


def grad_input(gy, w, x_shape, stride, padding, store=None):
    """dL/dx (see _input_grad_is_correlation for the method)."""
    k, r, s, _ = w.shape
    if _input_grad_is_correlation(gy, w, stride, padding):
        return _correlate(gy, flipped_weights(w), r, s, 1, r - 1 - padding, store=store)
    xp = get_array_module(gy)
    w2d = w.reshape(k, -1)
    gx = xp.empty(x_shape, dtype=gy.dtype)

    def chunk(start, stop, multiply=xp.matmul):
        gy2d = gy[start:stop].reshape(-1, k)
        cols = workspace.scratch("col2im", (gy2d.shape[0], w2d.shape[1]), gy)
        multiply(gy2d, w2d, out=cols)
        col2im_add(cols, gx[start:stop], r, s, stride, padding)
        if store is not None:
            store(gx[start:stop], start)

    _over_chunks(chunk, _image_chunks(x_shape[0], *gy.shape[1:3], w2d.shape[1], w.itemsize))
    return gx


def grad_weight(x, gy, w, stride, padding, load=None):
    """dL/dw = Σ over chunks of dy_chunk.T @ cols_chunk, summed in chunk order. Over several
    chunks each partial is taken transposed, cols_chunk.T @ dy_chunk: BLAS runs that shape
    faster where K is small, and the sum is transposed once at the end."""
    xp = get_array_module(x)
    k, r, s, c = w.shape
    pieces = _image_chunks(x.shape[0], *gy.shape[1:3], r * s * c, w.itemsize)
    if len(pieces) == 1:
        gw = xp.empty((k, r * s * c), dtype=xp.result_type(x, gy))
        return matmul(gy.reshape(-1, k).T, im2col(x, r, s, stride, padding, load), gw).reshape(w.shape)

    def chunk(start, stop):
        return im2col(x[start:stop], r, s, stride, padding, load, start).T @ gy[start:stop].reshape(-1, k)

    return xp.ascontiguousarray(sum_in_order(run_all(chunk, pieces)).T).reshape(w.shape)


def _grads_from_dy_windows(gy, w, x, padding, load=None, store=None):
    """(dL/dx, dL/dw) of a stride-1 convolution from ONE im2col of dy per chunk: its row for input pixel (h, w) holds every dy that pixel contributed to, at
    window position (r', s') = (R−1−r, S−1−s). So dx = cols @ flipped_weights(w), and
    colsᵀ @ x, summed over chunks, is dL/dw with rows (r', s', k): flipped back at the end."""
    xp = get_array_module(gy)
    k, r, s, c = w.shape
    n, p, q, _ = gy.shape
    pad = r - 1 - padding
    h, width = output_size(p, r, 1, pad), output_size(q, s, 1, pad)
    w_flipped = flipped_weights(w)
    gx = xp.empty((n, h, width, c), dtype=xp.result_type(gy, w))

    def chunk(start, stop, multiply=xp.matmul):
        cols = im2col(gy[start:stop], r, s, 1, pad)
        multiply(cols, w_flipped, out=gx[start:stop].reshape(-1, c))
        x_in = x[start:stop] if load is None else loaded(x[start:stop], load, start)
        gw_part = multiply(cols.T, x_in.reshape(-1, c), out=xp.empty((cols.shape[1], c), dtype=gx.dtype))
        if store is not None:
            store(gx[start:stop], start, x_in)
        return gw_part

    parts = _over_chunks(chunk, _image_chunks(n, h, width, r * s * k, w.itemsize))
    gw = sum_in_order(parts).reshape(r, s, k, c)[::-1, ::-1].transpose(2, 0, 1, 3)
    return gx, xp.ascontiguousarray(gw)


def grads(gy, x, w, stride, padding, input_grad=True, load=None, store=None):
    """(dL/dx or None where not input_grad, dL/dw) for Conv2d.backward; with `load`, of the
    convolution of load's result for x; `store` sees the chunks of dL/dx."""
    if input_grad and _input_grad_is_correlation(gy, w, stride, padding):
        return _grads_from_dy_windows(gy, w, x, padding, load, store)
    gx = grad_input(gy, w, x.shape, stride, padding, store) if input_grad else None
    return gx, grad_weight(x, gy, w, stride, padding, load)


class Conv2d(Op):
    """Inputs (x, w[, b]). `weight_bf16`: the weight's bf16 copy kept by the flat parameter buffer
    (--amp), which the kernels read for bf16 data instead of casting the weight at every use."""

    def __init__(self, stride, padding, weight_bf16=None):
        self.stride, self.padding, self.weight_bf16 = stride, padding, weight_bf16

    def forward_reference(self, x, w, b=None):
        self.x, self.w, self.has_bias = x, w, b is not None
        return add_bias(correlate(x, w, self.stride, self.padding), b)

    def input_grad_wanted(self):
        """Whether backward computes dL/dx: not for an input that needs none (the image)."""
        return self.inputs[0].requires_grad

    def backward_reference(self, gy):
        gx, gw = grads(gy, self.x, self.w, self.stride, self.padding, self.input_grad_wanted())
        return with_bias_grad(gy, self.has_bias, gx, gw)

    def forward_kernels(self, kernels, x, w, b=None):
        self.keep_for_kernels(kernels, x, w, b is not None)
        return add_bias(kernels.conv_forward(x, self.w, self.stride, self.padding), b)

    def keep_for_kernels(self, kernels, x, w, has_bias=False):
        """What backward_kernels reads: x, the weight in x's type (its bf16 copy where kept)."""
        self.x, self.w_shape, self.has_bias = x, w.shape, has_bias
        self.w = self.weight_bf16 if x.dtype == BF16 and self.weight_bf16 is not None else kernels.cast(w, x.dtype)

    def backward_kernels(self, kernels, gy):
        gx = None  # for an input that needs none, the image: the stem's costly grad-input
        if self.input_grad_wanted():
            gx = kernels.conv_grad_input(gy, self.w, self.x.shape, self.stride, self.padding)
        gw = kernels.conv_grad_weight(self.x, gy, self.w_shape, self.stride, self.padding)
        return with_bias_grad(gy, self.has_bias, gx, gw)


def conv2d(x, w, b=None, stride=1, padding=0):
    """y[n,p,q,k] = sum_{r,s,c} x_pad[n, p·stride + r, q·stride + s, c] · w[k,r,s,c] (+ b[k]).
    A parameter `w` with a bf16 copy (`w.bf16`, kept by the optimizer's flat buffer under --amp)
    hands it to the kernels."""
    function = Conv2d(stride, padding, getattr(w, "bf16", None))
    return function(x, w) if b is None else function(x, w, b)
