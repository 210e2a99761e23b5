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

