// The batch norms around a v2 convolution, done inside it (NVIDIA's "normconv" blocks): the
// pieces kernels/conv_v2.cu adds to a pass when its FUSE bits ask. Reference:
// minidl/ops/normconv.py; the launcher: minidl/kernels/normconv.py.
//
//   FUSE_NORMALIZE  forward and grad-weight read relu(x·scale + shift) where they read x: each
//                   thread rewrites its own 16-byte chunks of a stage after they land
//                   (cp.async.wait_group) and before the barrier that hands the stage to
//                   ldmatrix; a chunk the copy zero-filled (padding) stays zero. scale and shift
//                   come from a table in the data type that the block writes once into the
//                   NORM_TABLE_BYTES after its pipeline stages (the launch adds them): forward
//                   its group's [scale | shift][C], grad-weight every group's for its columns,
//                   [group][scale | shift][BN]. bf16 data is normalized by fma.rn.relu.bf16x2,
//                   scale and shift rounded to bf16 (one instruction per two elements); fp32
//                   data exactly as the batch-norm kernels do it.
//   FUSE_STATS      forward: the block's output tile, staged in shared memory for the stores,
//                   also gives its columns' count, mean and M2 (mean first, then the squared
//                   deviations: no cancellation): slab blockIdx.x of bn_finalize's partial
//                   layout [slab][count | mean | M2][K].
//   FUSE_DRELU      grad-input through relu(bn(y)): the tile dz is masked by y·scale + shift > 0
//                   as it is stored (g), and its columns' Σ g and Σ g·(y − mean) form a slab
//                   of bn_backward_finalize's partial layout [slab][Σg | Σg(y − mean)][C].
//
// scale, shift, mean: a [group][NORM_ROWS][C] array of float32 (minidl.kernels.batchnorm's
// batch_norm_affine), one group per `group_images` consecutive images. A fused epilogue needs
// each block's rows in ONE group, so the blocks of forward and grad-input are laid out by
// group (GroupTiling): blockIdx.x = group · tiles + tile, and the slabs of a group are
// consecutive. Without groups (plain kernels) that is one group of all N images.
#pragma once

#include "convert.cuh"

#if !defined(NORM_ROWS) || !defined(NORM_SCALE) || !defined(NORM_SHIFT) || !defined(NORM_MEAN) || \
    !defined(NORM_TABLE_BYTES)
#error "compile with the options of minidl/kernels/conv_v2.py (the NORM_* layout of minidl/kernels/batchnorm.py)"
#endif
constexpr int MAX_SHARED_BYTES = 232448;  // a block's dynamic shared memory on sm_90 (227 KiB)

constexpr int FUSE_NORMALIZE = 1, FUSE_STATS = 2, FUSE_DRELU = 4;

struct GroupTiling {
    int images;  // images per statistics group
    int tiles;  // blocks along M per group (forward: per group and its rows; grad-input: of the largest phase)
};

// A group's row of the [group][NORM_ROWS][C] array
__device__ __forceinline__ const float* norm_row(const float* norm, int group, int row, int C) {
    return norm + ((long long)group * NORM_ROWS + row) * C;
}

// ---- 16-byte chunks of 16-bit or 32-bit elements ---------------------------------------------------
__device__ __forceinline__ float as_float(float v) { return v; }
__device__ __forceinline__ float as_float(__nv_bfloat16 v) { return __bfloat162float(v); }
// bf16 pairs in a 32-bit word: the lower element in the low half
__device__ __forceinline__ float low_bf16(unsigned word) { return __uint_as_float(word << 16); }
__device__ __forceinline__ float high_bf16(unsigned word) { return __uint_as_float(word & 0xffff0000u); }
__device__ __forceinline__ unsigned pack_bf16(float low, float high) {
    return unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(low))) |
           unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(high))) << 16;
}

// A chunk's elements as floats, and back (rounded to nearest for bf16)
template <class T>
struct Chunk {
    static constexpr int EPC = 16 / int(sizeof(T));
    float v[EPC];
    __device__ void load(const T* p) {
        int4 raw = *reinterpret_cast<const int4*>(p);
        unsigned words[4] = {unsigned(raw.x), unsigned(raw.y), unsigned(raw.z), unsigned(raw.w)};
        for (int j = 0; j < 4; ++j) {
            if constexpr (EPC == 8) v[2 * j] = low_bf16(words[j]), v[2 * j + 1] = high_bf16(words[j]);
            else v[j] = __uint_as_float(words[j]);
        }
    }
    __device__ void store(T* p) const {
        unsigned words[4];
        for (int j = 0; j < 4; ++j) words[j] = EPC == 8 ? pack_bf16(v[2 * j], v[2 * j + 1]) : __float_as_uint(v[j]);
        *reinterpret_cast<int4*>(p) = make_int4(int(words[0]), int(words[1]), int(words[2]), int(words[3]));
    }
};

// EPC consecutive channels of a float32 vector (16-byte aligned: C and the channel are
// multiples of a chunk)
template <int EPC>
struct ChannelRun {
    float v[EPC];
    __device__ ChannelRun(const float* p) {
        for (int j = 0; j < EPC; j += 4) {
            float4 q = *reinterpret_cast<const float4*>(p + j);
            v[j] = q.x, v[j + 1] = q.y, v[j + 2] = q.z, v[j + 3] = q.w;
        }
    }
};

// ---- the normalizing load ---------------------------------------------------------------------------

// The scale and shift of one chunk's channels, read from the table once and applied to every
// chunk of those channels: relu(x·scale + shift) in place, where `inside` (elsewhere the chunk
// is padding and stays zero)
template <class T>
struct ChunkAffine {
    unsigned scale[4], shift[4];
    __device__ ChunkAffine(SharedAddress scale_, SharedAddress shift_) { lds_128(scale, scale_), lds_128(shift, shift_); }
    __device__ static unsigned normalize(unsigned x, unsigned a, unsigned b) {
        if constexpr (sizeof(T) == 2) return fma_relu_bf16x2(x, a, b);
        else return __float_as_uint(fmaxf(fmaf(__uint_as_float(x), __uint_as_float(a), __uint_as_float(b)), 0.0f));
    }
    __device__ void apply(SharedAddress chunk, bool inside) const {
        unsigned x[4];
        lds_128(x, chunk);
        for (int j = 0; j < 4; ++j) x[j] = normalize(x[j], scale[j], shift[j]);
        sts_128_if(chunk, x, inside);
    }
};

// ---- the epilogues ----------------------------------------------------------------------------------
// The output tile staged in shared memory: BM rows of BN elements of type Out, each row padded
// by 16 bytes (the accumulators' 8-byte pair stores then 16-byte reads stay conflict-free)
template <class Cfg, class Out>
struct StagedTile {
    static constexpr int PITCH = Cfg::BN + 16 / int(sizeof(Out));  // elements per row
    static constexpr int EPC = 16 / int(sizeof(Out));
    static constexpr int ROW_CHUNKS = Cfg::BN / EPC;
    static constexpr int BYTES = Cfg::BM * PITCH * int(sizeof(Out));
};

// FUSE_STATS: count, mean and M2 of each column over the tile's first `rows` rows, THREADS / BN
// lanes per column (each every LANES-th row), the lanes merged in order (Chan et al.)
template <class Cfg, class Out>
__device__ void tile_moments(const Out* tile, int rows, int n0, int columns, float* slab, float* scratch) {
    using Tile = StagedTile<Cfg, Out>;
    constexpr int LANES = Cfg::THREADS / Cfg::BN;
    static_assert(Cfg::THREADS % Cfg::BN == 0, "whole lanes of columns");
    static_assert(Tile::BYTES + 3 * Cfg::THREADS * 4 <= Cfg::SMEM_BYTES, "the lanes' moments fit beside the tile");
    int column = threadIdx.x % Cfg::BN, lane = threadIdx.x / Cfg::BN;
    float count = 0.0f, sum = 0.0f, m2 = 0.0f;
    for (int r = lane; r < rows; r += LANES) sum += as_float(tile[r * Tile::PITCH + column]), count += 1.0f;
    float mean = count > 0.0f ? sum / count : 0.0f;
    for (int r = lane; r < rows; r += LANES) {
        float d = as_float(tile[r * Tile::PITCH + column]) - mean;
        m2 += d * d;
    }
    if constexpr (LANES > 1) {
        float* lanes = scratch + 3 * (lane * Cfg::BN + column);
        lanes[0] = count, lanes[1] = mean, lanes[2] = m2;
        __syncthreads();
        if (lane != 0) return;
        for (int other = 1; other < LANES; ++other) {
            const float* o = scratch + 3 * (other * Cfg::BN + column);
            float total = count + o[0];
            if (total == 0.0f) continue;
            float delta = o[1] - mean;
            mean += delta * (o[0] / total);
            m2 += o[2] + delta * delta * (count * o[0] / total);
            count = total;
        }
    }
    if (n0 + column < columns) {
        slab[n0 + column] = count, slab[columns + n0 + column] = mean, slab[2 * columns + n0 + column] = m2;
    }
}

// FUSE_DRELU: writes g = dz · [y·scale + shift > 0] for the tile's rows inside the product (the
// pass's out_row, n < columns) and its columns' Σ g, Σ g·(y − mean) into `slab`. Each thread
// keeps one column chunk: its THREADS / ROW_CHUNKS lanes meet in `scratch`, merged in order.
template <class Cfg, class Pass, class T>
__device__ void store_masked_with_sums(const Pass& pass, const T* tile, T* out, const T* y, const float* norm,
                                       float* slab, float* scratch) {
    using Tile = StagedTile<Cfg, T>;
    constexpr int EPC = Tile::EPC, LANES = Cfg::THREADS / Tile::ROW_CHUNKS;
    static_assert(Cfg::THREADS % Tile::ROW_CHUNKS == 0, "every thread keeps one column chunk");
    static_assert(Tile::BYTES + 2 * LANES * Cfg::BN * 4 <= Cfg::SMEM_BYTES, "the lanes' sums fit beside the tile");
    int chunk = threadIdx.x % Tile::ROW_CHUNKS, lane = threadIdx.x / Tile::ROW_CHUNKS;
    int col = chunk * EPC, n = pass.n0 + col, C = pass.columns;
    float sum_g[EPC] = {}, sum_gy[EPC] = {};
    if (n < C) {
        const float* scale = norm_row(norm, pass.group, NORM_SCALE, C) + n;
        const float* shift = norm_row(norm, pass.group, NORM_SHIFT, C) + n;
        const float* mean = norm_row(norm, pass.group, NORM_MEAN, C) + n;
        ChannelRun<EPC> a(scale), b(shift), m(mean);
        for (int row = lane; row < Cfg::BM && pass.m0 + row < pass.rows; row += LANES) {
            long long at = pass.out_row(pass.m0 + row) + n;
            Chunk<T> g, x;
            g.load(tile + row * Tile::PITCH + col);
            x.load(y + at);
            for (int j = 0; j < EPC; ++j) {
                if (!(fmaf(x.v[j], a.v[j], b.v[j]) > 0.0f)) g.v[j] = 0.0f;
                sum_g[j] += g.v[j];
                sum_gy[j] += g.v[j] * (x.v[j] - m.v[j]);
            }
            g.store(out + at);
        }
    }
    float* mine = scratch + lane * 2 * Cfg::BN + col;
    for (int j = 0; j < EPC; ++j) mine[j] = sum_g[j], mine[Cfg::BN + j] = sum_gy[j];
    __syncthreads();
    for (int e = threadIdx.x; e < 2 * Cfg::BN; e += Cfg::THREADS) {
        int which = e / Cfg::BN, column = e % Cfg::BN;
        if (pass.n0 + column >= C) continue;
        float total = 0.0f;
        for (int l = 0; l < LANES; ++l) total += scratch[l * 2 * Cfg::BN + e];
        slab[which * C + pass.n0 + column] = total;
    }
}

// A grad-input block with no rows in its phase: its slab holds zeros (finalize reads every slab)
template <class Cfg, class Pass>
__device__ void zero_sums(const Pass& pass, float* slab) {
    for (int e = threadIdx.x; e < 2 * Cfg::BN; e += Cfg::THREADS) {
        int which = e / Cfg::BN, column = e % Cfg::BN;
        if (pass.n0 + column < pass.columns) slab[which * pass.columns + pass.n0 + column] = 0.0f;
    }
}
