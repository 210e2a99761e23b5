// The gathered operands of an implicit-GEMM convolution, shared by the v2 and v3 kernels
// (kernels/conv_v2.cu, kernels/conv_v3.cu): the geometry, which filter rows and columns of a
// window lie inside the image, the 16-byte copies that zero-fill the padding, the walk of
// forward's and grad-input's reductions over the filter positions and grad-weight's over the
// pixels, all without an integer division per k-tile.
#pragma once

#include "ptx.cuh"

struct Geometry {
    int N, H, W, C, K, R, S, P, Q, stride, pad;
    __device__ int npq() const { return N * P * Q; }
    __device__ int rsc() const { return R * S * C; }
};

// bits lo .. hi − 1 (none where hi <= lo); 0 <= lo, hi <= 16
__device__ __forceinline__ unsigned bit_range(int lo, int hi) {
    return hi > lo ? ((1u << hi) - 1) & ~((1u << lo) - 1) : 0u;
}
// bit i set where 0 <= start + i < size (i < count): the filter rows (or columns) of a window
// starting at `start` that lie inside the image; `backward`: where 0 <= start − i < size
__device__ __forceinline__ unsigned inside_bits(int start, int count, int size, bool backward = false) {
    return backward ? bit_range(max(0, start - size + 1), min(count, start + 1))
                    : bit_range(max(0, -start), min(count, size - start));
}

// The share of split `split` of `splits` in a reduction of `total` k-tiles: its first tile and
// how many (the last splits may get fewer, or none)
struct TileRange {
    int begin, count;
};
__device__ __forceinline__ TileRange split_share(int total, int split, int splits) {
    int per_split = (total + splits - 1) / splits;
    int begin = min(total, split * per_split);
    return {begin, min(total, begin + per_split) - begin};
}

// One 16-byte cp.async of base[element] into tile + offset, or 16 zero bytes (`fill` false: the
// address then points at base[0], inside the tensor, and nothing is read). `element` is only
// meaningful where `fill` holds (a window's origin in the padding wraps around as unsigned).
template <class T>
__device__ __forceinline__ void copy_chunk(SharedAddress tile, int offset, const T* base, unsigned element, bool fill) {
    cp_async_16(tile + offset, base + (fill ? element : 0u), fill);
}
template <class T>
__device__ __forceinline__ void copy_chunk(SharedAddress tile, int offset, const T* base, unsigned element) {
    cp_async_16(tile + offset, base + element, true);  // 32-bit element arithmetic: one wide multiply-add
}

// ---- the filter walk of a gathered operand ------------------------------------------------------
// The k-tiles of fwd's and dgrad's reductions visit the filter positions (row, column) in order,
// BLOCKS tiles of consecutive channels each. `select` holds the mask bits of the current
// position (bit row, bit 16 + column); `event()` after `advance()` says whether the walk moved
// to the next position (1) or the next filter row (2), so that each operand adds its jumps.
struct FilterWalk {
    int blocks = 1, columns = 1, block = 0, column = 0;
    unsigned row_bit = 1u, column_bit = 1u << 16, select = 1u | 1u << 16;
    FilterWalk() = default;
    __device__ FilterWalk(int blocks_, int columns_) : blocks(blocks_), columns(columns_) {}
    __device__ int advance() {
        int event = 0;
        if (++block == blocks) {
            block = 0, event = 1, column_bit <<= 1;
            if (++column == columns) column = 0, event = 2, column_bit = 1u << 16, row_bit <<= 1;
        }
        select = row_bit | column_bit;
        return event;
    }
};

// An operand's uniform offset along the walk: `step` per tile, plus `column_jump` on a new
// position and `row_jump` on a new filter row.
struct WalkOffset {
    int delta, step, column_jump, row_jump;
    __device__ void advance(int event) {
        delta += step + (event ? column_jump : 0) + (event == 2 ? row_jump : 0);
    }
};


// A pixel of grad-weight's reduction and its (n, p, q), moved on BK pixels at a time without a
// division; `window` says which filter rows (bit r) and columns (bit 16 + s) of its window lie
// inside the image (none past the last pixel)
struct PixelStep {  // what BK pixels add to (n, p, q)
    int n, p, q;
};
template <int BK>
struct PixelCursor {
    int pixel, n, p, q;
    PixelCursor() = default;
    __device__ PixelCursor(int pixel_, const Geometry& g)
        : pixel(pixel_), n(pixel_ / (g.Q * g.P)), p(pixel_ / g.Q % g.P), q(pixel_ % g.Q) {}
    __device__ static PixelStep step(const Geometry& g) { return {BK / (g.Q * g.P), BK / g.Q % g.P, BK % g.Q}; }
    __device__ void advance(const Geometry& g, const PixelStep& s) {
        pixel += BK;
        q += s.q, p += s.p, n += s.n;
        if (q >= g.Q) q -= g.Q, ++p;
        if (p >= g.P) p -= g.P, ++n;
    }
    __device__ int h0(const Geometry& g) const { return p * g.stride - g.pad; }
    __device__ int w0(const Geometry& g) const { return q * g.stride - g.pad; }
    __device__ unsigned window(const Geometry& g) const {
        return pixel < g.npq() ? inside_bits(h0(g), g.R, g.H) | inside_bits(w0(g), g.S, g.W) << 16 : 0u;
    }
};

// ---- grad-input's phases --------------------------------------------------------------------------
// Grad-input with stride st is st² products: phase (ph, pw) computes the input pixels
// h = ph + i·st, w = pw + j·st (a phase_h × phase_w grid per image) from the taps r = r0 + rr·st,
// s = s0 + ss·st only, and dX[n, h, w, c] = Σ_{rr, ss, k} dY[n, pb + i − rr, qb + j − ss, k] ·
// W[k, r, s, c] with pb = (ph + pad − r0)/st. blockIdx.z is phase · splits + split.
struct PhasePixel {
    int dy_element;   // dY's element (n, pb + i, qb + j, 0): the pixel's first tap
    unsigned inside;  // which taps lie inside dY: bit rr, bit 16 + ss
};
struct DgradPhase {
    int index, split, splits, ph, pw, r0, s0, taps_r, taps_s, phase_h, phase_w, pb, qb;
    DgradPhase() = default;
    __device__ explicit DgradPhase(const Geometry& g) {
        int st = g.stride;
        splits = int(gridDim.z) / (st * st), index = int(blockIdx.z) / splits, split = int(blockIdx.z) % splits;
        ph = index / st, pw = index % st;
        r0 = (ph + g.pad) % st, s0 = (pw + g.pad) % st;
        taps_r = (g.R - r0 + st - 1) / st, taps_s = (g.S - s0 + st - 1) / st;
        phase_h = (g.H - ph + st - 1) / st, phase_w = (g.W - pw + st - 1) / st;
        pb = (ph + g.pad - r0) / st, qb = (pw + g.pad - s0) / st;
    }
    __device__ int rows(const Geometry& g) const { return g.N * phase_h * phase_w; }
    __device__ int taps() const { return taps_r * taps_s; }
    __device__ PhasePixel pixel(const Geometry& g, int m) const {
        int j = m % phase_w, i = m / phase_w % phase_h, n = m / (phase_w * phase_h);
        int p = pb + i, q = qb + j;
        return {((n * g.P + p) * g.Q + q) * g.K,
                inside_bits(p, taps_r, g.P, true) | inside_bits(q, taps_s, g.Q, true) << 16};
    }
    // dX's element (n, ph + i·st, pw + j·st, 0) of the phase's pixel m
    __device__ long long dx_row(const Geometry& g, int m) const {
        int j = m % phase_w, i = m / phase_w % phase_h, n = m / (phase_w * phase_h);
        return (((long long)n * g.H + ph + i * g.stride) * g.W + pw + j * g.stride) * g.C;
    }
    // W's element (k = 0, r0, s0, c = 0)
    __device__ int w_first_tap(const Geometry& g) const { return (r0 * g.S + s0) * g.C; }
    // per k-tile the next bk output channels; per tap column one dY column back and st filter
    // columns on; per tap row one dY row back and st filter rows on
    __device__ WalkOffset dy_walk(const Geometry& g, int bk) const { return {0, bk, -2 * g.K, -(g.Q - taps_s) * g.K}; }
    __device__ WalkOffset w_walk(const Geometry& g, int bk) const {
        return {0, bk * g.rsc(), g.stride * g.C - g.K * g.rsc(), g.stride * g.S * g.C - taps_s * g.stride * g.C};
    }
};

