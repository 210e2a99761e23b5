"""The CPU path's machinery: chunking and threads (minidl.parallel), per-thread work arrays
(minidl.workspace), and the code paths of the ops that only large tensors reach on their own:
many chunks, products split over column blocks, the combined backward of a convolution, widened
batch-norm rows, the blocked SGD update. Tiny sizes are forced through them by shrinking the
chunk sizes; the oracles are plain NumPy formulas and the one-chunk paths. Results must not
depend on the number of threads, bit for bit.
"""
import threading

import numpy as np
import pytest

from helpers import rng
from minidl import Tensor, nn, ops, parallel, workspace
from minidl.models import MODELS
from minidl.ops import conv, norm, sgd
from minidl.optim import SGD


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few hundred bytes and small matmul blocks: every multi-chunk path runs."""
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 512)
    monkeypatch.setattr(parallel, "FLOPS_PER_BLOCK", 256)
    monkeypatch.setattr(conv, "MIN_ROWS", 1)
    monkeypatch.setattr(sgd, "BLOCK_BYTES", 256)


def with_threads(monkeypatch, count, function, *args):
    monkeypatch.setattr(parallel, "num_threads", count)
    return function(*args)


# ---- minidl.parallel ---------------------------------------------------------------------------

@pytest.mark.parametrize("count,work,piece,min_items,expected", [
    (64, 1, 64, 1, 1),       # fits one piece
    (64, 1, 16, 1, 4),       # 4 pieces asked: a multiple of BALANCE already
    (64, 1, 30, 1, 4),       # 3 pieces asked, rounded up to a multiple of BALANCE
    (64, 1, 10, 1, 8),       # 7 asked, rounded up to 8
    (3, 100, 1, 1, 3),       # never more pieces than items
    (64, 1, 1, 16, 4),       # at least 16 items a piece
    (10, 1, 1, 20, 1),       # fewer items than min_items: one piece
])
def test_piece_count(monkeypatch, count, work, piece, min_items, expected):
    monkeypatch.setattr(parallel, "BALANCE", 2)
    assert parallel.piece_count(count, work, piece, min_items) == expected


@pytest.mark.parametrize("count,pieces", [(10, 3), (7, 7), (5, 1), (0, 1)])
def test_split_covers_the_range_in_order(count, pieces):
    bounds = parallel.split(count, pieces)
    assert len(bounds) == pieces and bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert max(stop - start for start, stop in bounds) - min(stop - start for start, stop in bounds) <= 1


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_run_all_returns_results_in_argument_order(monkeypatch, threads):
    monkeypatch.setattr(parallel, "num_threads", threads)
    assert parallel.run_all(lambda a, b: a * b, [(i, i + 1) for i in range(17)]) == [i * (i + 1) for i in range(17)]


def test_run_all_inside_a_chunk_runs_serially(monkeypatch):
    monkeypatch.setattr(parallel, "num_threads", 2)

    def outer(i):
        return parallel.run_all(lambda j: (i, j, threading.current_thread().name), [(j,) for j in range(3)])

    for inner in parallel.run_all(outer, [(i,) for i in range(4)]):
        assert len({name for _, _, name in inner}) == 1  # one thread ran the whole inner pass
        assert [(i, j) for i, j, _ in inner] == [(inner[0][0], j) for j in range(3)]


def test_run_all_waits_for_every_chunk_then_raises(monkeypatch):
    monkeypatch.setattr(parallel, "num_threads", 2)
    done = []

    def chunk(i):
        if i == 0:
            raise RuntimeError("chunk 0")
        done.append(i)

    with pytest.raises(RuntimeError, match="chunk 0"):
        parallel.run_all(chunk, [(i,) for i in range(8)])
    assert sorted(done) == list(range(1, 8))


@pytest.mark.parametrize("m,k,n", [(5, 7, 37), (1, 3, 16), (9, 4, 1), (6, 6, 100)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_over_column_blocks(small_chunks, m, k, n, dtype):
    r = rng(30)
    a, b = r.standard_normal((m, k)).astype(dtype), r.standard_normal((k, n)).astype(dtype)
    np.testing.assert_allclose(parallel.matmul(a, b), a @ b, rtol=1e-5)
    np.testing.assert_allclose(parallel.matmul(a.T.copy().T, b.T.copy().T), a @ b, rtol=1e-5)  # transposed layouts
    out = np.empty((m, n), dtype)
    assert parallel.matmul(a, b, out) is out


# ---- minidl.workspace --------------------------------------------------------------------------

def test_scratch_is_reused_grown_and_private_to_a_thread():
    like = np.zeros(1, np.float32)
    first = workspace.scratch("test", (4, 5), like)
    again = workspace.scratch("test", (2, 3), like)
    assert again.base is first.base  # the same memory, a smaller view
    grown = workspace.scratch("test", (50, 50), like)
    assert grown.shape == (50, 50) and grown.dtype == np.float32
    assert workspace.scratch("test", (2,), np.zeros(1)).dtype == np.float64  # one array per dtype
    other = []
    thread = threading.Thread(target=lambda: other.append(workspace.scratch("test", (4, 5), like)))
    thread.start()
    thread.join()
    assert not np.shares_memory(other[0], workspace.scratch("test", (4, 5), like))


def test_zero_bordered_keeps_its_border_zero():
    like = np.zeros(1, np.float32)
    padded = workspace.zero_bordered((2, 6, 7, 3), 2, like)
    assert not padded.any()
    padded[:, 2:-2, 2:-2, :] = 1.0
    fewer = workspace.zero_bordered((1, 6, 7, 3), 2, like)
    assert np.shares_memory(fewer, padded) and fewer[0, 2:-2, 2:-2].all()
    border = np.ones((6, 7), bool)
    border[2:-2, 2:-2] = False
    assert not workspace.zero_bordered((3, 6, 7, 3), 2, like)[:, border].any()  # grown: zero again


# ---- convolution -------------------------------------------------------------------------------

def naive_conv(x, w, stride, padding):
    """The definition, one window at a time."""
    n, h, width, c = x.shape
    k, r, s, _ = w.shape
    x_padded = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    p, q = conv.output_size(h, r, stride, padding), conv.output_size(width, s, stride, padding)
    y = np.zeros((n, p, q, k), dtype=np.result_type(x, w))
    for i in range(p):
        for j in range(q):
            window = x_padded[:, i * stride:i * stride + r, j * stride:j * stride + s, :]
            y[:, i, j, :] = np.tensordot(window, w, axes=([1, 2, 3], [1, 2, 3]))
    return y


CONV_SHAPES = [  # x shape, w shape, stride, padding
    ((5, 9, 7, 3), (4, 3, 3, 3), 1, 1),
    ((3, 8, 8, 4), (6, 3, 3, 4), 2, 1),
    ((1, 11, 9, 2), (3, 7, 7, 2), 2, 3),
    ((4, 5, 6, 8), (3, 1, 1, 8), 1, 0),
    ((3, 7, 6, 5), (4, 1, 1, 5), 2, 0),
    ((2, 6, 7, 3), (40, 3, 3, 3), 1, 1),   # more filters than rows: grad-input by col2im
    ((2, 9, 9, 2), (3, 5, 5, 2), 1, 1),    # padding < (R−1)/2: the correlation's padding is larger
    ((1, 6, 5, 2), (2, 3, 3, 2), 1, 2),    # padding > (R−1)/2
    ((2, 10, 8, 2), (3, 3, 3, 2), 3, 1),
]


def conv_gradients_by_definition(x, w, gy, stride, padding):
    """dL/dx and dL/dw of sum(conv(x, w) * gy) by the chain rule over naive_conv's windows."""
    n, h, width, c = x.shape
    k, r, s, _ = w.shape
    gx = np.zeros((n, h + 2 * padding, width + 2 * padding, c))
    gw = np.zeros(w.shape)
    x_padded = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    for i in range(gy.shape[1]):
        for j in range(gy.shape[2]):
            rows, cols = slice(i * stride, i * stride + r), slice(j * stride, j * stride + s)
            gx[:, rows, cols, :] += np.einsum("nk,krsc->nrsc", gy[:, i, j, :], w)
            gw += np.einsum("nk,nrsc->krsc", gy[:, i, j, :], x_padded[:, rows, cols, :])
    return gx[:, padding:padding + h, padding:padding + width, :], gw


@pytest.mark.parametrize("chunked", [False, True], ids=["one_chunk", "many_chunks"])
@pytest.mark.parametrize("x_shape,w_shape,stride,padding", CONV_SHAPES)
def test_conv_paths_match_the_definition(request, chunked, x_shape, w_shape, stride, padding):
    if chunked:
        request.getfixturevalue("small_chunks")
    r = rng(31)
    x, w = r.standard_normal(x_shape), r.standard_normal(w_shape)
    y = conv.correlate(x, w, stride, padding)
    np.testing.assert_allclose(y, naive_conv(x, w, stride, padding), rtol=1e-10, atol=1e-10)
    gy = r.standard_normal(y.shape)
    gx, gw = conv_gradients_by_definition(x, w, gy, stride, padding)
    np.testing.assert_allclose(conv.grad_input(gy, w, x.shape, stride, padding), gx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(conv.grad_weight(x, gy, w, stride, padding), gw, rtol=1e-10, atol=1e-10)
    combined_gx, combined_gw = conv.grads(gy, x, w, stride, padding)
    np.testing.assert_allclose(combined_gx, gx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(combined_gw, gw, rtol=1e-10, atol=1e-10)
    assert conv.grads(gy, x, w, stride, padding, input_grad=False)[0] is None


def test_conv_float32_and_input_without_grad(small_chunks):
    r = rng(32)
    x = r.standard_normal((3, 6, 6, 4)).astype(np.float32)
    w = Tensor(r.standard_normal((5, 3, 3, 4)).astype(np.float32), requires_grad=True)
    y = ops.conv2d(Tensor(x), w, padding=1)  # the image needs no gradient: none is computed
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.data, naive_conv(x, w.data, 1, 1), rtol=1e-5, atol=1e-5)
    y.sum().backward()
    _, expected = conv_gradients_by_definition(x.astype(np.float64), w.data.astype(np.float64), np.ones(y.shape), 1, 1)
    np.testing.assert_allclose(w.grad.data, expected, rtol=1e-4, atol=1e-4)


def test_conv_results_do_not_depend_on_the_thread_count(monkeypatch, small_chunks):
    r = rng(33)
    x, w = r.standard_normal((6, 7, 7, 3)).astype(np.float32), r.standard_normal((8, 3, 3, 3)).astype(np.float32)
    gy = r.standard_normal((6, 7, 7, 8)).astype(np.float32)

    def run():
        return [conv.correlate(x, w, 1, 1), *conv.grads(gy, x, w, 1, 1), *conv.grads(gy[:, ::2, ::2], x, w, 2, 1)]

    one, two, three = (with_threads(monkeypatch, count, run) for count in (1, 2, 3))
    for a, b, c in zip(one, two, three):
        assert np.array_equal(a, b) and np.array_equal(a, c)


# ---- batch norm and ReLU -----------------------------------------------------------------------

@pytest.mark.parametrize("rows,channels", [(12, 3), (7, 16), (1, 5), (64, 300), (36, 64)])
def test_widened_is_a_view_with_rows_that_divide(rows, channels):
    a = np.arange(rows * channels, dtype=np.float32).reshape(rows, channels)
    wide, r = norm.widened(a)
    assert np.shares_memory(wide, a) and wide.shape == (rows // r, r * channels) and rows % r == 0
    np.testing.assert_array_equal(norm.fold(wide.sum(axis=0), channels), a.sum(axis=0))


@pytest.mark.parametrize("chunked", [False, True], ids=["one_chunk", "many_chunks"])
@pytest.mark.parametrize("shape", [(4, 5, 3, 6), (8, 4, 4, 16), (1, 1, 3, 2)])
def test_batch_norm_statistics_merge_over_chunks(request, chunked, shape):
    if chunked:
        request.getfixturevalue("small_chunks")
    x2 = (3.0 + 2.0 * rng(34).standard_normal(shape)).reshape(-1, shape[-1])
    mean, var = norm.mean_and_variance(x2)
    np.testing.assert_allclose(mean, x2.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(var, x2.var(axis=0), rtol=1e-10)


def test_batch_norm_variance_in_float32_where_the_mean_dwarfs_the_spread(small_chunks):
    x2 = (1e4 + 1e-1 * rng(35).standard_normal((512, 16))).astype(np.float32)
    mean, var = norm.mean_and_variance(x2)
    expected = x2.astype(np.float64).var(axis=0)
    np.testing.assert_allclose(var, expected, rtol=5e-3)  # the naive E[x²] − mean² is off by 10⁴ here


def test_batch_norm_and_relu_paths_do_not_depend_on_chunks_or_threads(monkeypatch):
    r = rng(36)
    x, g = (r.standard_normal((8, 4, 4, 16)).astype(np.float32) for _ in range(2))
    gamma, beta = (r.standard_normal(16).astype(np.float32) for _ in range(2))

    def run():
        bn = norm.BatchNorm(np.zeros(16, np.float32), np.ones(16, np.float32), True, 0.1, 1e-5)
        relu = ops.activation.ReLU()
        y = relu.forward(bn.forward(x, gamma, beta))
        return [y, relu.backward(g), *bn.backward(g), bn.running_mean, bn.running_var]

    reference = with_threads(monkeypatch, 1, run)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 512)
    for threads in (1, 2, 3):
        for a, b in zip(reference, with_threads(monkeypatch, threads, run)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)  # chunks change float32 sums slightly
    chunked = with_threads(monkeypatch, 1, run)
    for threads in (2, 3):  # the thread count changes nothing
        assert all(np.array_equal(a, b) for a, b in zip(chunked, with_threads(monkeypatch, threads, run)))


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (4, 8, 8, 16), (3,), ()])
def test_relu_on_any_shape_and_layout(small_chunks, shape):
    x = rng(37).standard_normal(shape)
    for data in (x, np.asfortranarray(x)):
        relu = ops.activation.ReLU()
        np.testing.assert_array_equal(relu.forward(data), np.maximum(x, 0))
        np.testing.assert_array_equal(relu.backward(np.ones(shape)), (x > 0).astype(float))


# ---- SGD, linear and a whole step --------------------------------------------------------------

@pytest.mark.parametrize("nesterov,rate_inside", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("with_decay", [False, True])
def test_blocked_sgd_is_the_whole_buffer_update_bit_for_bit(small_chunks, monkeypatch, nesterov, rate_inside,
                                                             with_decay):
    """Blocks in parallel against one block over the whole buffers (the form kernels/sgd.cu follows)."""
    r = rng(38)
    n = 1001
    w, u = (r.standard_normal(n).astype(np.float32) for _ in range(2))
    decay = (r.integers(0, 2, n) * 1e-2).astype(np.float32) if with_decay else None
    ours, theirs = [w.copy(), u.copy()], [w.copy(), u.copy()]
    monkeypatch.setattr(parallel, "num_threads", 2)
    for step in range(3):
        g = r.standard_normal(n).astype(np.float32)
        args = 0.1 * (step + 1), 0.9, 0.25, decay, nesterov, rate_inside, 1.5
        sgd.sgd_momentum_update(ours[0], g, ours[1], *args)
        sgd._update_block(theirs[0], g, theirs[1], *args)
        assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])


def test_linear_over_column_blocks(small_chunks):
    r = rng(39)
    x, w, b = r.standard_normal((5, 7)), r.standard_normal((33, 7)), r.standard_normal(33)
    xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    y = ops.linear(xt, wt, Tensor(b))
    np.testing.assert_allclose(y.data, x @ w.T + b, rtol=1e-12)
    y.sum().backward()
    np.testing.assert_allclose(xt.grad.data, np.ones((5, 33)) @ w, rtol=1e-12)
    np.testing.assert_allclose(wt.grad.data, np.ones((33, 5)) @ x, rtol=1e-12)


def test_a_training_step_does_not_depend_on_the_thread_count(monkeypatch):
    """The property the bit-exact resume relies on, through every op of a ResNet at sizes
    where the convolutions, batch norms and the update run over several chunks."""
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(sgd, "BLOCK_BYTES", 16 << 10)
    images = rng(40).standard_normal((8, 16, 16, 3)).astype(np.float32)
    labels = np.arange(8) % 10

    def train_two_steps():
        nn.manual_seed(0)
        model = MODELS["resnet20"](num_classes=10)
        optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        for _ in range(2):
            optimizer.zero_grad()
            ops.softmax_cross_entropy(model(Tensor(images)), labels).backward()
            optimizer.step()
        return optimizer.flat.data.copy()

    one = with_threads(monkeypatch, 1, train_two_steps)
    assert np.array_equal(one, with_threads(monkeypatch, 2, train_two_steps))
    assert np.array_equal(one, with_threads(monkeypatch, 3, train_two_steps))


@pytest.mark.parametrize("shape,kernel,stride,padding", [((3, 9, 8, 5), 3, 2, 1), ((2, 5, 7, 3), 2, 2, 0),
                                                           ((4, 6, 6, 2), 3, 1, 1)])
def test_max_pool_over_chunks_clips_windows_like_minus_infinity_padding(small_chunks, shape, kernel, stride, padding):
    x = np.maximum(rng(41).standard_normal(shape), 0)  # ties at 0, as after a ReLU
    padded = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)), constant_values=-np.inf)
    p, q = conv.output_size(shape[1], kernel, stride, padding), conv.output_size(shape[2], kernel, stride, padding)
    windows = conv.windows(padded, kernel, kernel, stride, p, q).reshape(shape[0], p, q, -1, shape[3])
    pool = ops.pool.MaxPool2d(kernel, stride, padding)
    np.testing.assert_array_equal(pool.forward(x), windows.max(axis=3))
    gy = rng(42).standard_normal((shape[0], p, q, shape[3]))
    expected = np.zeros(padded.shape)  # each gradient to the first maximum of its window
    first = windows.argmax(axis=3)
    for n, i, j, c in np.ndindex(*gy.shape):
        r, s = divmod(first[n, i, j, c], kernel)
        expected[n, i * stride + r, j * stride + s, c] += gy[n, i, j, c]
    np.testing.assert_allclose(pool.backward(gy), expected[:, padding:padding + shape[1], padding:padding + shape[2]],
                               rtol=1e-12)
