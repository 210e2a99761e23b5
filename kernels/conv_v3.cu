// Convolution v3: the implicit GEMMs of kernels/conv.cu (forward, grad-input, grad-weight; its
// opening comment explains the three products and the stride² phases of grad-input) on Hopper's
// warpgroup MMA (wgmma.mma_async, kernels/wgmma.cuh), bf16 data, fp32 accumulators. Built for
// sm_90a. The launcher (minidl/kernels/conv_v3.py) declares the tile configurations.
//
// Warp specialization. A block is 1 + CONSUMERS warpgroups of 128 threads: warpgroup 0 is the
// producer, it copies the k-tiles of A and B from global memory into STAGES shared-memory stages
// with 16-byte cp.async (zero-filled in the padding); warpgroup 1 + w, a consumer, multiplies
// rows 64w .. 64w + 63 of the block's BM×BN tile by all of B with wgmma m64nBNk16, reading both
// operands from shared memory through matrix descriptors. setmaxnreg moves registers from the
// producer, which holds a few copy offsets, to the consumers, which hold BN/2 fp32 accumulators.
//
//   producer (wg 0)                           stage s        consumers (wg 1, 2)
//   wait empty[s] (not in the first round) ─┐  ┌───────┐
//   cp.async A, B chunks ──────────────────────▶ A | B │
//   cp.async.mbarrier.arrive.noinc full[s]  ─┼──▶ full  ├──▶ wait full[s]; fence.proxy.async
//                                            │  └───────┘    wgmma × BK/16; commit; wait_group 1
//                                            └───── empty ◀── arrive empty[previous stage]
//
// Two mbarriers per stage: `full` completes when the 128 producer threads' copies of the stage
// have landed (the arrive-on fires when each thread's earlier cp.asyncs are complete, .noinc: the
// 128 arrivals are the init count); `empty` when the 256 consumer threads' wgmmas reading the
// stage have retired (wgmma_wait_group<1> after the next stage's wgmmas are issued: one group in
// flight while the next is waited for). The parity of a stage's phase flips each round.
// cp.async writes shared memory through the generic proxy and wgmma reads it through the async
// proxy: each consumer thread fences (fence.proxy.async) after its wait on `full`.
//
// Shared memory: every operand tile is made of 128-byte rows, 8 chunks of 16 bytes, chunk c of
// row r stored at chunk c ^ (r % 8): the 128-byte swizzle of the wgmma descriptors (its pattern
// repeats every 1024 bytes, so every tile starts 1024-byte aligned: the dynamic shared memory is
// declared so aligned, and every stage and tile size is a multiple of 1024).
//   K-major (fwd A and B, dgrad A): a row per m (or n) holding its BK = 64 reduction elements;
//     core matrices 8 rows apart in M/N: stride byte offset 1024; the leading byte offset is
//     unused (a k-step's 16 elements lie inside the row); k-step kk starts 32·kk bytes further.
//   MN-major (dgrad B, wgrad A and B): 64-element blocks of M (or N), each BK rows of one
//     reduction index: row block·BK + k. Leading byte offset BK·128 (the next 64 elements of
//     M/N), stride byte offset 1024 (the next 8 reduction indices); k-step kk starts 2048·kk
//     bytes further. wgmma reads such an operand transposed (imm-trans), which the PTX ISA allows
//     for bf16 on A and B alike.
//
//   pass    A (M×K)                           B (K×N)                          requires
//   fwd     x gathered (pixels × rsc), K-major   w (k × rsc), K-major          C % 64 == 0
//   dgrad   dy gathered over the phase's taps    w over (tap, k) × c, MN-major  K % 64 == 0
//   wgrad   dyᵀ (k × pixels), MN-major           x gathered (pixels × rsc), MN  -
// with C and K multiples of 8 (16-byte copies).
//
// The producer's copies: each thread fills 4 chunks of each of ROWS / 64 rows of a tile, two
// threads sharing a row so that a warp's copy reads whole 32-byte sectors; a row past the
// product's edge copies a row inside (its products are never stored), the padding and the
// reduction's end are zero-filled.
//
// Epilogue: each consumer thread writes its accumulators (the fragment of kernels/wgmma.cuh) as
// pairs straight to global memory, rows and columns outside the product skipped; in the data
// type, or split over blockIdx.z, as fp32 partial tiles that splitk_reduce (splitk_reduce.cuh) sums
// in a fixed order.
#include <cuda_bf16.h>

#include "ptx.cuh"
#include "wgmma.cuh"
#include "conv_gather.cuh"
#include "splitk_reduce.cuh"

#ifndef DYNAMIC_SHARED_MEMORY  // the CPU emulator (tests/kernels/emu) defines its own
#define DYNAMIC_SHARED_MEMORY(type, name)                                    \
    extern __shared__ __align__(1024) unsigned char dynamic_shared_bytes[]; \
    type* name = reinterpret_cast<type*>(dynamic_shared_bytes)
#endif

using bf16 = __nv_bfloat16;

// ---- the tile configuration -------------------------------------------------------------------
// BM = 64 · CONSUMERS rows, BN columns, BK = 64 reduction elements (one 128-byte row) per stage.
// SMEM_BYTES_ is the dynamic shared memory the launcher gives a block, checked here.
template <int BN_, int CONSUMERS_, int STAGES_, int PRODUCER_REGS_, int CONSUMER_REGS_, int SMEM_BYTES_>
struct V3Tile {
    static constexpr int BN = BN_, CONSUMERS = CONSUMERS_, BM = 64 * CONSUMERS, BK = 64, STAGES = STAGES_;
    static constexpr int THREADS = 128 * (1 + CONSUMERS), PRODUCER_THREADS = 128, CONSUMER_THREADS = 128 * CONSUMERS;
    static constexpr int PRODUCER_REGS = PRODUCER_REGS_, CONSUMER_REGS = CONSUMER_REGS_;
    static constexpr int K_STEPS = BK / 16;
    static constexpr int A_BYTES = BM * BK * 2, STAGE_BYTES = A_BYTES + BN * BK * 2;
    static constexpr int SMEM_BYTES = SMEM_BYTES_;
    static_assert(STAGES >= 3 && STAGES * STAGE_BYTES + 2 * STAGES * 8 <= SMEM_BYTES,
                  "the launcher's shared memory holds the stages and their mbarriers");
    static_assert(BN % 64 == 0 && BN <= 256 && BM % 64 == 0 && BM >= 64,
                  "wgmma's N at most 256; tiles of whole 64-element MN-major blocks");
    static_assert(PRODUCER_THREADS * PRODUCER_REGS + CONSUMER_THREADS * CONSUMER_REGS <= 65536,
                  "the roles' registers fit the multiprocessor's 64K");
};

// ---- the producer's copies ------------------------------------------------------------------------
// A producer thread's chunks of a tile of ROWS 128-byte rows: run i is row threadIdx.x / 2 + 64i,
// its chunks threadIdx.x % 2 + 2j (j < 4). The rows of a thread are 64 apart: one swizzle.
template <int ROWS>
struct Runs {
    static constexpr int COUNT = ROWS / 64, CHUNKS = 4;
    static_assert(ROWS % 64 == 0, "whole runs");
    __device__ static int row(int run) { return int(threadIdx.x) / 2 + 64 * run; }
    __device__ static int chunk(int j) { return int(threadIdx.x) % 2 + 2 * j; }
    __device__ static int offset(int run, int j) { return row(run) * 128 + (chunk(j) ^ row(0) % 8) * 16; }
};

// The block's tile of the product and its share of the reduction
template <class Cfg>
struct BlockTile {
    Geometry g;
    int m0, n0, rows, columns;  // the block's first row and column; the product's M and N
    int split = 0, tiles_begin = 0, tiles = 0;
    __device__ BlockTile(const Geometry& g_) : g(g_), m0(blockIdx.x * Cfg::BM), n0(blockIdx.y * Cfg::BN) {}
    __device__ void share(int total, int split_, int splits) {
        split = split_;
        TileRange range = split_share(total, split, splits);
        tiles_begin = range.begin, tiles = range.count;
    }
};

// Forward: Y[npq, k] = Σ_{r,s,c} X[n, p·st − pad + r, q·st − pad + s, c] · W[k, r, s, c].
// A: x at the output pixel's window; B: w's rows; both K-major.
template <class Cfg>
struct FwdPass : BlockTile<Cfg> {
    static constexpr bool A_MN_MAJOR = false, B_MN_MAJOR = false;
    using ARuns = Runs<Cfg::BM>;
    using BRuns = Runs<Cfg::BN>;
    const bf16 *x, *w;
    unsigned a_element[ARuns::COUNT], a_inside[ARuns::COUNT], b_element[BRuns::COUNT];
    FilterWalk walk;
    WalkOffset a_offset;
    int b_delta = 0;

    __device__ FwdPass(const Geometry& g_, const bf16* x_, const bf16* w_) : BlockTile<Cfg>(g_), x(x_), w(w_) {
        const Geometry& g = this->g;
        this->rows = g.npq(), this->columns = g.K;
        walk = FilterWalk(g.C / Cfg::BK, g.S);
        this->share(g.R * g.S * (g.C / Cfg::BK), blockIdx.z, gridDim.z);
        for (int i = 0; i < ARuns::COUNT; ++i) {
            int m = min(this->m0 + ARuns::row(i), this->rows - 1);
            int q = m % g.Q, p = m / g.Q % g.P, n = m / (g.Q * g.P);
            int h0 = p * g.stride - g.pad, w0 = q * g.stride - g.pad;
            a_element[i] = ((n * g.H + h0) * g.W + w0) * g.C + ARuns::chunk(0) * 8;
            a_inside[i] = inside_bits(h0, g.R, g.H) | inside_bits(w0, g.S, g.W) << 16;
        }
        for (int i = 0; i < BRuns::COUNT; ++i)
            b_element[i] = min(this->n0 + BRuns::row(i), g.K - 1) * g.rsc() + BRuns::chunk(0) * 8;
        a_offset = {0, Cfg::BK, 0, (g.W - g.S) * g.C};  // a new filter row skips the image row's other columns
        for (int t = 0; t < this->tiles_begin; ++t) advance();
    }
    __device__ void advance() {
        a_offset.advance(walk.advance());
        b_delta += Cfg::BK;
    }
    __device__ void load(SharedAddress a_tile, SharedAddress b_tile) {
        for (int i = 0; i < ARuns::COUNT; ++i) {
            bool fill = (a_inside[i] & walk.select) == walk.select;
            for (int j = 0; j < ARuns::CHUNKS; ++j)
                copy_chunk(a_tile, ARuns::offset(i, j), x, a_element[i] + a_offset.delta + 16 * j, fill);
        }
        for (int i = 0; i < BRuns::COUNT; ++i)
            for (int j = 0; j < BRuns::CHUNKS; ++j)
                copy_chunk(b_tile, BRuns::offset(i, j), w, b_element[i] + b_delta + 16 * j);
        advance();
    }
    __device__ long long out_row(int m) const { return (long long)m * this->g.K; }
};

// Grad-input, one phase of the stride's (DgradPhase in conv_gather.cuh): A: dy at
// the pixel's taps, K-major; B: w over (tap, k) × c, MN-major.
template <class Cfg>
struct DgradPass : BlockTile<Cfg> {
    static constexpr bool A_MN_MAJOR = false, B_MN_MAJOR = true;
    using ARuns = Runs<Cfg::BM>;
    using BRuns = Runs<Cfg::BN>;  // BN / 64 blocks of BK rows
    const bf16 *dy, *w;
    DgradPhase phase;
    unsigned a_element[ARuns::COUNT], a_inside[ARuns::COUNT];
    unsigned b_row;  // w's element at this thread's k and the phase's first tap
    int b_column0;  // the column of this thread's first chunk
    FilterWalk walk;
    WalkOffset a_offset, b_offset;

    __device__ DgradPass(const Geometry& g_, const bf16* dy_, const bf16* w_)
        : BlockTile<Cfg>(g_), dy(dy_), w(w_), phase(g_) {
        const Geometry& g = this->g;
        this->rows = phase.rows(g), this->columns = g.C;
        walk = FilterWalk(g.K / Cfg::BK, phase.taps_s);
        this->share(phase.taps() * (g.K / Cfg::BK), phase.split, phase.splits);
        for (int i = 0; i < ARuns::COUNT; ++i) {
            PhasePixel pixel = phase.pixel(g, min(this->m0 + ARuns::row(i), this->rows - 1));
            a_element[i] = pixel.dy_element + ARuns::chunk(0) * 8;
            a_inside[i] = pixel.inside;
        }
        b_row = BRuns::row(0) * g.rsc() + phase.w_first_tap(g);
        b_column0 = this->n0 + BRuns::chunk(0) * 8;
        a_offset = phase.dy_walk(g, Cfg::BK);
        b_offset = phase.w_walk(g, Cfg::BK);
        for (int t = 0; t < this->tiles_begin; ++t) advance();
    }
    __device__ void advance() {
        int event = walk.advance();
        a_offset.advance(event), b_offset.advance(event);
    }
    __device__ void load(SharedAddress a_tile, SharedAddress b_tile) {
        for (int i = 0; i < ARuns::COUNT; ++i) {
            bool fill = (a_inside[i] & walk.select) == walk.select;
            for (int j = 0; j < ARuns::CHUNKS; ++j)
                copy_chunk(a_tile, ARuns::offset(i, j), dy, a_element[i] + a_offset.delta + 16 * j, fill);
        }
        unsigned row = b_row + unsigned(b_offset.delta);
        for (int i = 0; i < BRuns::COUNT; ++i)  // run i: block i of the columns; past C, a column inside
            for (int j = 0; j < BRuns::CHUNKS; ++j)
                copy_chunk(b_tile, BRuns::offset(i, j), w, row + min(b_column0 + 64 * i + 16 * j, this->g.C - 8));
        advance();
    }
    __device__ long long out_row(int m) const { return phase.dx_row(this->g, m); }
};

// Grad-weight: dW[k, (r, s, c)] = Σ_{npq} dY[npq, k] · X[n, p·st − pad + r, q·st − pad + s, c],
// the pixels (the reduction) split over blockIdx.z. A: dyᵀ, B: x at the pixel's window, both
// MN-major; a thread's rows of both are the same pixel.
template <class Cfg>
struct WgradPass : BlockTile<Cfg> {
    static constexpr bool A_MN_MAJOR = true, B_MN_MAJOR = true;
    using ARuns = Runs<Cfg::BM>;
    using BRuns = Runs<Cfg::BN>;
    const bf16 *x, *dy;
    int a_column0;  // the k of this thread's first chunk of A
    int b_position[BRuns::COUNT][BRuns::CHUNKS];  // the chunk's (r·W + s)·C + c: its offset from a window origin
    unsigned b_select[BRuns::COUNT][BRuns::CHUNKS];  // its bits (r, 16 + s) in the pixel's window mask
    PixelCursor<Cfg::BK> pixel;
    PixelStep step;

    __device__ WgradPass(const Geometry& g_, const bf16* x_, const bf16* dy_) : BlockTile<Cfg>(g_), x(x_), dy(dy_) {
        const Geometry& g = this->g;
        this->rows = g.K, this->columns = g.rsc();
        this->share((g.npq() + Cfg::BK - 1) / Cfg::BK, blockIdx.z, gridDim.z);
        a_column0 = this->m0 + ARuns::chunk(0) * 8;
        for (int i = 0; i < BRuns::COUNT; ++i)
            for (int j = 0; j < BRuns::CHUNKS; ++j) {
                int column = this->n0 + 64 * i + BRuns::chunk(j) * 8;
                int c = column % g.C, s = column / g.C % g.S, r = column / (g.C * g.S);
                b_position[i][j] = (r * g.W + s) * g.C + c;
                b_select[i][j] = column < g.rsc() ? 1u << r | 1u << (16 + s) : ~0u;  // past the edge: zeros
            }
        pixel = PixelCursor<Cfg::BK>(this->tiles_begin * Cfg::BK + ARuns::row(0), g);
        step = PixelCursor<Cfg::BK>::step(g);
    }
    __device__ void load(SharedAddress a_tile, SharedAddress b_tile) {
        const Geometry& g = this->g;
        // past the last pixel dY's rows repeat it: B's rows there are zeros, so they add nothing
        unsigned a_row = unsigned(min(pixel.pixel, g.npq() - 1)) * g.K;
        for (int i = 0; i < ARuns::COUNT; ++i)  // run i: block i of the rows; past K, a row inside
            for (int j = 0; j < ARuns::CHUNKS; ++j)
                copy_chunk(a_tile, ARuns::offset(i, j), dy, a_row + min(a_column0 + 64 * i + 16 * j, g.K - 8));
        unsigned window = pixel.window(g);
        int origin = ((pixel.n * g.H + pixel.h0(g)) * g.W + pixel.w0(g)) * g.C;
        for (int i = 0; i < BRuns::COUNT; ++i)
            for (int j = 0; j < BRuns::CHUNKS; ++j)
                copy_chunk(b_tile, BRuns::offset(i, j), x, unsigned(origin + b_position[i][j]),
                           (window & b_select[i][j]) == b_select[i][j]);
        pixel.advance(g, step);
    }
    __device__ long long out_row(int m) const { return (long long)m * this->g.rsc(); }
};

// ---- the consumers' product ---------------------------------------------------------------------
// The descriptor of an operand tile's k-step kk for the 64 rows (or all BN columns) at `start`
template <bool MN_MAJOR>
__device__ __forceinline__ uint64_t operand_descriptor(SharedAddress start, int kk) {
    if constexpr (MN_MAJOR) return wgmma_descriptor(start + kk * 16 * 128, 64 * 128, 1024, Swizzle::B128);
    else return wgmma_descriptor(start + kk * 32, 16, 1024, Swizzle::B128);
}

template <class Cfg, class Pass>
struct WarpgroupProduct {
    WgmmaAccumulator<Cfg::BN> acc;
    int a_start;  // this warpgroup's 64 rows of A: bytes from the tile's start

    __device__ WarpgroupProduct(int consumer) : a_start(Pass::A_MN_MAJOR ? consumer * Cfg::BK * 128 : consumer * 64 * 128) {
        for (int i = 0; i < Cfg::BN / 2; ++i) acc[i] = 0.0f;
    }
    // issues the wgmmas of one stage (asynchronous: they read the stage until wgmma_wait_group)
    __device__ void issue(SharedAddress a_tile, SharedAddress b_tile) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Cfg::K_STEPS; ++kk)
            wgmma_bf16_ss<Cfg::BN, Pass::A_MN_MAJOR, Pass::B_MN_MAJOR>(
                acc, operand_descriptor<Pass::A_MN_MAJOR>(a_tile + a_start, kk),
                operand_descriptor<Pass::B_MN_MAJOR>(b_tile, kk), true);
        wgmma_commit_group();
    }
};

__device__ __forceinline__ void store_pair(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ __forceinline__ void store_pair(bf16* p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// This thread's accumulators (kernels/wgmma.cuh's fragment) to `out`, those inside the product
template <class Cfg, class Pass, class Out>
__device__ void store_accumulators(const Pass& pass, const WgmmaAccumulator<Cfg::BN>& acc, int consumer, Out* out) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
    int row0 = pass.m0 + 64 * consumer + 16 * warp + lane / 4, column0 = pass.n0 + 2 * (lane % 4);
    for (int half = 0; half < 2; ++half) {
        int m = row0 + 8 * half;
        if (m >= pass.rows) continue;
        Out* row = out + pass.out_row(m);
        for (int block = 0; block < Cfg::BN / 8; ++block) {
            int n = column0 + 8 * block;  // N is a multiple of 8: n + 1 is inside where n is
            if (n < pass.columns) store_pair(row + n, acc[4 * block + 2 * half], acc[4 * block + 2 * half + 1]);
        }
    }
}

// ---- the warp-specialized pipeline ----------------------------------------------------------------
// The block's k-tiles through STAGES stages (see the opening comment), then its tile of the
// product to `out` (the data type) or, split over blockIdx.z, to `partial` (fp32).
template <class Cfg, class Pass, class Out>
__device__ void pipelined_gemm(Pass& pass, Out* out, float* partial, long long partial_stride) {
    DYNAMIC_SHARED_MEMORY(unsigned char, smem);
    SharedAddress base = shared_address(smem);
    SharedAddress full = base + Cfg::STAGES * Cfg::STAGE_BYTES, empty = full + 8 * Cfg::STAGES;
    if (threadIdx.x == 0)
        for (int s = 0; s < Cfg::STAGES; ++s) {
            mbarrier_init(full + 8 * s, Cfg::PRODUCER_THREADS);
            mbarrier_init(empty + 8 * s, Cfg::CONSUMER_THREADS);
        }
    __syncthreads();  // the barriers are initialized before anyone uses them
    int role = threadIdx.x / 128;
    if (role == 0) {
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        unsigned phase = 0;
        for (int t = 0, s = 0; t < pass.tiles; ++t) {
            if (t >= Cfg::STAGES) mbarrier_wait_parity(empty + 8 * s, phase ^ 1u);  // its last round's wgmmas retired
            SharedAddress stage = base + s * Cfg::STAGE_BYTES;
            pass.load(stage, stage + Cfg::A_BYTES);
            cp_async_mbarrier_arrive(full + 8 * s);
            if (++s == Cfg::STAGES) s = 0, phase ^= 1u;
        }
        cp_async_commit();
        cp_async_wait<0>();  // no copy outlives its thread
        return;
    }
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    int consumer = role - 1;
    WarpgroupProduct<Cfg, Pass> math(consumer);
    unsigned phase = 0;
    for (int t = 0, s = 0, previous = 0; t < pass.tiles; ++t) {
        mbarrier_wait_parity(full + 8 * s, phase);
        fence_proxy_async_shared();  // the landed copies (generic proxy) before wgmma's reads (async proxy)
        SharedAddress stage = base + s * Cfg::STAGE_BYTES;
        math.issue(stage, stage + Cfg::A_BYTES);
        wgmma_wait_group<1>();  // the previous stage's wgmmas have retired: it is free
        if (t > 0) mbarrier_arrive(empty + 8 * previous);
        previous = s;
        if (++s == Cfg::STAGES) s = 0, phase ^= 1u;
    }
    wgmma_wait_group<0>();
    wgmma_fence_operand(math.acc);
    if (partial) store_accumulators<Cfg>(pass, math.acc, consumer, partial + pass.split * partial_stride);
    else store_accumulators<Cfg>(pass, math.acc, consumer, out);
}

// ---- kernels --------------------------------------------------------------------------------------
#define CONV_GEOMETRY int N, int H, int W, int C, int K, int R, int S, int P, int Q, int stride, int pad
#define GEOMETRY Geometry{N, H, W, C, K, R, S, P, Q, stride, pad}

// y: the output, or with grid.z = splits > 1, partial: splits fp32 copies of it (y unused)
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    conv_fwd_v3(const bf16* x, const bf16* w, bf16* y, float* partial, CONV_GEOMETRY) {
    FwdPass<Cfg> pass(GEOMETRY, x, w);
    pipelined_gemm<Cfg>(pass, y, partial, (long long)N * P * Q * K);
}

// grid.z = stride² phases × splits; grid.x covers the largest phase. dx: the output, or partial
// (splits fp32 copies of dx) with more than one split.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    conv_dgrad_v3(const bf16* dy, const bf16* w, bf16* dx, float* partial, CONV_GEOMETRY) {
    DgradPass<Cfg> pass(GEOMETRY, dy, w);
    if (pass.m0 >= pass.rows) return;  // the whole block: a smaller phase
    pipelined_gemm<Cfg>(pass, dx, partial, (long long)N * H * W * C);
}

// grid.z = splits; out: dW (float32) with one split, else splits partial copies of it
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    conv_wgrad_v3(const bf16* x, const bf16* dy, float* out, CONV_GEOMETRY) {
    WgradPass<Cfg> pass(GEOMETRY, x, dy);
    pipelined_gemm<Cfg>(pass, out, gridDim.z > 1 ? out : nullptr, (long long)pass.rows * pass.columns);
}
