// Convolution v2: the implicit GEMMs of kernels/conv.cu (forward, grad-input, grad-weight; its
// opening comment explains the three products and the stride² phases of grad-input) on
// mma.sync tensor-core instructions, every fragment loaded by ldmatrix from XOR-swizzled shared
// memory that a multi-stage cp.async pipeline fills. Reference: minidl/ops/conv.py. The
// launcher (minidl/kernels/conv_v2.py) declares the tile configurations; per shape the
// autotuner (minidl/kernels/autotune.py) times them against the v1 kernels and keeps the fastest.
//
// Block tile BM×BN of the product, BK reduction elements per stage, STAGES stages in flight;
// warps in a (BM/WM)×(BN/WN) grid, each holding a WM×WN tile as (WM/16)×(WN/8) accumulators of
// 16×8 (mma m16n8k16 for bf16, m16n8k8 for TF32: a k-step is 32 bytes of reduction in both).
//
// Shared memory. An operand tile is a row-major grid of 16-byte chunks: K-major (a row per m or
// n holding its BK reduction elements: ldmatrix reads fragments straight from it) or MN-major (a
// row per reduction index holding BM or BN elements: ldmatrix.trans turns 16-bit data around;
// TF32 data, 32 bits wide, is read one element per lane with LDS). A chunk's place in its row
// is XOR-swizzled by the row: the 8 rows an ldmatrix reads at one chunk land in 8 different
// bank groups while each row stays a permutation of its own chunks, so both the 16-byte
// cp.async stores and the ldmatrix reads are conflict-free without padding. With the swizzle,
// a fragment's address at k-step kk is its k-step-0 address XOR kk·32 (K-major) or plus kk·16
// rows (MN-major): every lane's addresses are computed once, before the main loop.
//
// Global -> shared. Each thread owns fixed copy slots (row, chunk) of each operand tile whose
// global offsets and padding masks are computed once; per k-tile the loop adds a block-uniform
// offset and tests the masks against the tile's filter position: no integer division in the
// loop. A copy outside the tensor (padding, the tile's edge) zero-fills its 16 bytes.
//
//   pass    A (M×K)                               B (K×N)                          requires
//   fwd     x gathered (pixels × rsc), K-major    w (k × rsc), K-major             C % BK == 0
//   dgrad   dy gathered over the phase's taps     w over (tap, k) × c, MN-major    K % BK == 0
//   wgrad   dyᵀ (k × pixels), MN-major            x gathered (pixels × rsc), MN    -
// with C and K multiples of a chunk (8 bf16, 4 fp32) for the 16-byte copies and stores.
//
// Epilogue: the accumulators go through shared memory (rows padded by 16 bytes) and leave as
// 16-byte stores, in the data type or, when the reduction is split over blockIdx.z (split-K:
// grids too small to fill the GPU, and grad-weight's long reduction), as fp32 partial tiles
// that splitk_reduce (kernels/splitk_reduce.cuh) sums in a fixed order: the result does not depend
// on scheduling.
//
// Batch norm fused in (the FUSE template argument of each kernel; kernels/conv_v2_norm.cuh):
// forward and grad-weight may read relu(x·scale + shift) for x, forward may give its output's
// moments, grad-input may mask its output by a ReLU and give the batch norm's backward sums.
#include <cuda_bf16.h>

#include "ptx.cuh"
#include "conv_gather.cuh"
#include "conv_v2_norm.cuh"
#include "splitk_reduce.cuh"

#ifndef DYNAMIC_SHARED_MEMORY  // the CPU emulator (tests/kernels/emu) defines its own
#define DYNAMIC_SHARED_MEMORY(type, name)                                    \
    extern __shared__ __align__(128) unsigned char dynamic_shared_bytes[]; \
    type* name = reinterpret_cast<type*>(dynamic_shared_bytes)
#endif

// ---- the tile configuration -------------------------------------------------------------------
// SMEM_BYTES_ is the dynamic shared memory the launcher gives a block: checked against the
// pipeline's stages and the epilogue tile (fp32 at most) here.
template <typename T_, int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_, int SMEM_BYTES_>
struct V2Tile {
    using T = T_;
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
    static constexpr int THREADS = 32 * (BM / WM) * (BN / WN);
    static constexpr bool BF16 = sizeof(T) == 2;
    static constexpr int EPC = 16 / int(sizeof(T));  // elements per 16-byte chunk
    static constexpr int MMA_K = BF16 ? 16 : 8;
    static constexpr int K_STEPS = BK / MMA_K;
    static constexpr int M_TILES = WM / 16, N_TILES = WN / 8;
    static constexpr int A_BYTES = BM * BK * int(sizeof(T)), STAGE_BYTES = A_BYTES + BN * BK * int(sizeof(T));
    static constexpr int OUT_PITCH = BN * 4 + 16;  // bytes per row of the epilogue tile
    static constexpr int SMEM_BYTES = SMEM_BYTES_;
    static_assert(STAGES * STAGE_BYTES <= SMEM_BYTES && BM * OUT_PITCH <= SMEM_BYTES,
                  "the launcher's shared memory holds the pipeline and the epilogue tile");
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0 && WM <= 64 && WN <= 64,
                  "warp tiles of 16..64 × 16..64: the fragment addresses XOR at most 4 sub-tiles");
    static_assert(BK % MMA_K == 0 && BK * int(sizeof(T)) >= 64 && BK * int(sizeof(T)) <= 128,
                  "K-major rows of 4 to 8 chunks");
};

// ---- swizzled shared memory ---------------------------------------------------------------------
// Chunk `chunk` of row `row`, in a tile of ROW_CHUNKS chunks per row: XORed with the row so that
// 8 consecutive rows at one chunk (an ldmatrix) occupy 8 different 16-byte bank groups.
template <int ROW_CHUNKS>
__device__ __forceinline__ int swizzle(int row, int chunk) {
    constexpr int GROUPS = ROW_CHUNKS < 8 ? ROW_CHUNKS : 8;
    return chunk ^ (row / (8 / GROUPS) % GROUPS);
}
// For MN-major TF32 tiles read one element per lane (lane (g, t) reads row t, element g of an
// 8-wide run): XOR with twice the row spreads the warp's 32 reads over the 32 banks.
template <int ROW_CHUNKS>
__device__ __forceinline__ int swizzle_scalar(int row, int chunk) {
    static_assert(ROW_CHUNKS >= 8, "scalar reads need rows of 8 or more chunks");
    return chunk ^ (row % 4 * 2);
}
// bytes from a tile's start to chunk (row, chunk)
template <int ROW_CHUNKS, bool SCALAR>
__device__ __forceinline__ int chunk_offset(int row, int chunk) {
    if constexpr (SCALAR) return (row * ROW_CHUNKS + swizzle_scalar<ROW_CHUNKS>(row, chunk)) * 16;
    else return (row * ROW_CHUNKS + swizzle<ROW_CHUNKS>(row, chunk)) * 16;
}

// The copy slots of one thread in a tile of ROWS rows × ROW_CHUNKS chunks: slot i is the chunk
// at (row(i), chunk()), its rows STEP = THREADS / ROW_CHUNKS apart. STEP is a multiple of 8 (or
// there is one slot; 4 for the scalar swizzle), so every slot has the same swizzle and the slots' shared-memory offsets
// differ by constants (`offset`).
template <int THREADS, int ROWS, int ROW_CHUNKS, bool SCALAR = false>
struct ColumnSlots {
    static constexpr int COUNT = ROWS * ROW_CHUNKS / THREADS, STEP = THREADS / ROW_CHUNKS;
    static_assert(THREADS % ROW_CHUNKS == 0 && COUNT >= 1 && ROWS * ROW_CHUNKS % THREADS == 0,
                  "every thread copies whole chunks of one column");
    static_assert(STEP % (SCALAR ? 4 : 8) == 0 || COUNT == 1, "the slots of a thread share one swizzle");
    __device__ static int row(int slot) { return int(threadIdx.x) / ROW_CHUNKS + slot * STEP; }
    __device__ static int chunk() { return int(threadIdx.x) % ROW_CHUNKS; }
    __device__ static int offset(int slot) {
        return chunk_offset<ROW_CHUNKS, SCALAR>(row(0), chunk()) + slot * STEP * ROW_CHUNKS * 16;
    }
};

// The copy slots of one thread all in ONE row (a reduction index that is costly to locate,
// grad-weight's pixel): row(), and chunks chunk(i), THREADS / ROWS apart.
template <int THREADS, int ROWS, int ROW_CHUNKS, bool SCALAR = false>
struct RowSlots {
    static constexpr int PER_ROW = THREADS / ROWS;
    static constexpr int COUNT = ROW_CHUNKS / PER_ROW;
    static_assert(THREADS % ROWS == 0 && ROW_CHUNKS % PER_ROW == 0 && COUNT >= 1, "every thread copies part of a row");
    __device__ static int row() { return int(threadIdx.x) / PER_ROW; }
    __device__ static int chunk(int slot) { return int(threadIdx.x) % PER_ROW + slot * PER_ROW; }
    __device__ static int offset(int slot) { return chunk_offset<ROW_CHUNKS, SCALAR>(row(), chunk(slot)); }
};

// The epilogue: the staged tile's rows and columns inside the product to `out`, 16 bytes a store
template <class Cfg, class Pass, class Out>
__device__ void write_tile(const Pass& pass, const Out* tile, Out* out) {
    using Tile = StagedTile<Cfg, Out>;
    for (int index = threadIdx.x; index < Cfg::BM * Tile::ROW_CHUNKS; index += Cfg::THREADS) {
        int row = index / Tile::ROW_CHUNKS, col = index % Tile::ROW_CHUNKS * Tile::EPC;
        int m = pass.m0 + row, n = pass.n0 + col;
        if (m < pass.rows && n < pass.columns)
            *reinterpret_cast<int4*>(out + pass.out_row(m) + n) = *reinterpret_cast<const int4*>(tile + row * Tile::PITCH + col);
    }
}

// ---- the passes: their operands, tile ranges and outputs ------------------------------------------
// Each pass fills a stage with the block's next k-tile (`load(a_tile, b_tile)`) and says where
// output row m goes (`out_row`, an element offset). A slot whose row lies past the product's
// edge (m >= M, n >= N) copies a row inside instead: its products land in outputs that are
// never stored, so it needs neither a predicate nor zeros. Zeros are needed only where a real
// output sums over the position: the padding of a window, the reduction's end.
template <class Cfg>
struct PassBase {
    using T = typename Cfg::T;
    Geometry g;
    int m0, n0, rows, columns;  // the block's tile; the product's M (or its group's last row + 1) and N
    int group = 0;  // the block's statistics group (forward, grad-input)
    int tiles_begin = 0, tiles = 0;  // the block's k-tiles
    int split = 0;  // which share of the reduction
    __device__ PassBase(const Geometry& g_) : g(g_), m0(blockIdx.x * Cfg::BM), n0(blockIdx.y * Cfg::BN) {}
    // blockIdx.x = group · tiles + tile over `total_rows` rows of `image_rows` per image: the
    // block's rows lie in its group, and `rows` ends there
    __device__ void tile_groups(GroupTiling groups, int image_rows, int total_rows) {
        group = int(blockIdx.x) / groups.tiles;
        int group_rows = groups.images * image_rows;
        m0 = group * group_rows + int(blockIdx.x) % groups.tiles * Cfg::BM;
        rows = min(total_rows, (group + 1) * group_rows);
    }
    // this block's share of `total` k-tiles over `splits` splits (split `split_`)
    __device__ void split_range(int total, int split_, int splits) {
        split = split_;
        TileRange share = split_share(total, split, splits);
        tiles_begin = share.begin, tiles = share.count;
    }
};

// The passes whose A operand is gathered along the filter walk (forward, grad-input): per
// slot, A's element at the window origin and which filter rows and columns lie inside the
// image; B's element at the first tile; each operand's offset along the walk.
template <class Cfg, class ASlots_, class BSlots_>
struct WalkedPass : PassBase<Cfg> {
    using T = typename Cfg::T;
    using ASlots = ASlots_;
    using BSlots = BSlots_;
    const T *a, *b;
    unsigned a_element[ASlots::COUNT];
    unsigned a_inside[ASlots::COUNT];  // bit r: filter row r inside; bit 16 + s: filter column s
    unsigned b_element[BSlots::COUNT];
    FilterWalk walk;
    WalkOffset a_offset, b_offset;

    __device__ WalkedPass(const Geometry& g_, const T* a_, const T* b_) : PassBase<Cfg>(g_), a(a_), b(b_) {}
    __device__ void start() {  // a split of the reduction starts part-way along the walk
        for (int t = 0; t < this->tiles_begin; ++t) advance();
    }
    __device__ void advance() {
        int event = walk.advance();
        a_offset.advance(event), b_offset.advance(event);
    }
    __device__ void load(SharedAddress a_tile, SharedAddress b_tile) {
        for (int i = 0; i < ASlots::COUNT; ++i)
            copy_chunk(a_tile, ASlots::offset(i), a, a_element[i] + a_offset.delta,
                       (a_inside[i] & walk.select) == walk.select);
        for (int i = 0; i < BSlots::COUNT; ++i)
            copy_chunk(b_tile, BSlots::offset(i), b, b_element[i] + unsigned(b_offset.delta));
        advance();
    }
};

template <class Cfg>
using KMajor = ColumnSlots<Cfg::THREADS, Cfg::BM, Cfg::BK / Cfg::EPC>;

// What a kernel's fused parts take (kernels/conv_v2_norm.cuh): the input's batch norm
// (FUSE_NORMALIZE, FUSE_DRELU), grad-input's y (FUSE_DRELU), the slabs of sums (FUSE_STATS,
// FUSE_DRELU) and the statistics groups
template <class T>
struct NormArgs {
    const float* norm;
    const T* y;
    float* sums;
    GroupTiling groups;
};

// Forward: Y[npq, k] = Σ_{r,s,c} X[n, p·st − pad + r, q·st − pad + s, c] · W[k, r, s, c].
// A: x at the output pixel's window; B: w's rows, K-major.
template <class Cfg, int FUSE>
struct FwdPass : WalkedPass<Cfg, KMajor<Cfg>, ColumnSlots<Cfg::THREADS, Cfg::BN, Cfg::BK / Cfg::EPC>> {
    using Base = WalkedPass<Cfg, KMajor<Cfg>, ColumnSlots<Cfg::THREADS, Cfg::BN, Cfg::BK / Cfg::EPC>>;
    using T = typename Cfg::T;
    using ASlots = typename Base::ASlots;
    using BSlots = typename Base::BSlots;
    static constexpr bool A_K_MAJOR = true, B_K_MAJOR = true, NORMALIZES = FUSE & FUSE_NORMALIZE;
    FilterWalk consumed;  // FUSE_NORMALIZE: where the tile that normalize() rewrites next was read
    SharedAddress table;  // FUSE_NORMALIZE: the block's group's [scale | shift][C] of T
    NormArgs<T> fused;

    __device__ FwdPass(const Geometry& g_, const T* x, const T* w, const NormArgs<T>& fused_)
        : Base(g_, x, w), fused(fused_) {
        const Geometry& g = this->g;
        this->tile_groups(fused.groups, g.P * g.Q, g.npq());
        this->columns = g.K;
        this->walk = FilterWalk(g.C / Cfg::BK, g.S);
        this->split_range(g.R * g.S * (g.C / Cfg::BK), blockIdx.z, gridDim.z);
        for (int i = 0; i < ASlots::COUNT; ++i) {
            int m = min(this->m0 + ASlots::row(i), this->rows - 1);
            int q = m % g.Q, p = m / g.Q % g.P, n = m / (g.Q * g.P);
            int h0 = p * g.stride - g.pad, w0 = q * g.stride - g.pad;
            this->a_element[i] = ((n * g.H + h0) * g.W + w0) * g.C + ASlots::chunk() * Cfg::EPC;
            this->a_inside[i] = inside_bits(h0, g.R, g.H) | inside_bits(w0, g.S, g.W) << 16;
        }
        for (int i = 0; i < BSlots::COUNT; ++i)
            this->b_element[i] = min(this->n0 + BSlots::row(i), g.K - 1) * g.rsc() + BSlots::chunk() * Cfg::EPC;
        // per tile the next BK channels; a new filter row skips the image row's other columns
        this->a_offset = {0, Cfg::BK, 0, (g.W - g.S) * g.C};
        this->b_offset = {0, Cfg::BK, 0, 0};
        this->start();
        consumed = this->walk;
    }
    __device__ long long out_row(int m) const { return (long long)m * this->g.K; }
    // FUSE_NORMALIZE: the table, written by the whole block (a barrier must follow)
    __device__ void build_table(unsigned char* at) {
        const Geometry& g = this->g;
        T* t = reinterpret_cast<T*>(at);
        const float* scale = norm_row(fused.norm, this->group, NORM_SCALE, g.C);
        const float* shift = norm_row(fused.norm, this->group, NORM_SHIFT, g.C);
        for (int c = threadIdx.x; c < g.C; c += Cfg::THREADS) t[c] = from_float<T>(scale[c]), t[g.C + c] = from_float<T>(shift[c]);
        table = shared_address(t);
    }
    // FUSE_NORMALIZE: this thread's chunks of the next tile's A, whose copies have landed
    __device__ void normalize(SharedAddress a_tile, SharedAddress) {
        int c = consumed.block * Cfg::BK + ASlots::chunk() * Cfg::EPC;
        ChunkAffine<T> affine(table + c * int(sizeof(T)), table + (this->g.C + c) * int(sizeof(T)));
        for (int i = 0; i < ASlots::COUNT; ++i)
            affine.apply(a_tile + ASlots::offset(i), (this->a_inside[i] & consumed.select) == consumed.select);
        consumed.advance();
    }
    __device__ void finish(const T* tile, T* out, float* scratch) const {
        write_tile<Cfg>(*this, tile, out);
        if constexpr (FUSE & FUSE_STATS)
            tile_moments<Cfg>(tile, min(Cfg::BM, this->rows - this->m0), this->n0, this->columns,
                              fused.sums + (long long)blockIdx.x * 3 * this->columns, scratch);
    }
};

// Grad-input, one phase of the stride's (DgradPhase in conv_gather.cuh; kernels/conv.cu's DgradPass
// is the same product): A: dy at the pixel's taps; B: w over (tap, k), MN-major.
template <class Cfg>
using DgradB = ColumnSlots<Cfg::THREADS, Cfg::BK, Cfg::BN / Cfg::EPC, !Cfg::BF16>;

template <class Cfg, int FUSE>
struct DgradPass : WalkedPass<Cfg, KMajor<Cfg>, DgradB<Cfg>> {
    using Base = WalkedPass<Cfg, KMajor<Cfg>, DgradB<Cfg>>;
    using T = typename Cfg::T;
    using ASlots = typename Base::ASlots;
    using BSlots = typename Base::BSlots;
    static constexpr bool A_K_MAJOR = true, B_K_MAJOR = false, NORMALIZES = false;
    DgradPhase phase;
    NormArgs<T> fused;
    float* slab;  // FUSE_DRELU: this block's sums, [Σg | Σg(y − mean)][C]; a group's slabs are consecutive

    __device__ DgradPass(const Geometry& g_, const T* dy, const T* w, const NormArgs<T>& fused_)
        : Base(g_, dy, w), phase(g_), fused(fused_) {
        const Geometry& g = this->g;
        this->tile_groups(fused.groups, phase.phase_h * phase.phase_w, phase.rows(g));
        this->columns = g.C;
        int slab_index = (this->group * g.stride * g.stride + phase.index) * fused.groups.tiles +
                         int(blockIdx.x) % fused.groups.tiles;
        slab = FUSE & FUSE_DRELU ? fused.sums + (long long)slab_index * 2 * g.C : nullptr;
        this->walk = FilterWalk(g.K / Cfg::BK, phase.taps_s);
        this->split_range(phase.taps() * (g.K / Cfg::BK), phase.split, phase.splits);
        for (int i = 0; i < ASlots::COUNT; ++i) {
            PhasePixel pixel = phase.pixel(g, min(this->m0 + ASlots::row(i), this->rows - 1));
            this->a_element[i] = pixel.dy_element + ASlots::chunk() * Cfg::EPC;
            this->a_inside[i] = pixel.inside;
        }
        for (int i = 0; i < BSlots::COUNT; ++i) {
            int c = min(this->n0 + BSlots::chunk() * Cfg::EPC, g.C - Cfg::EPC);
            this->b_element[i] = BSlots::row(i) * g.rsc() + phase.w_first_tap(g) + c;
        }
        this->a_offset = phase.dy_walk(g, Cfg::BK);
        this->b_offset = phase.w_walk(g, Cfg::BK);
        this->start();
    }
    __device__ long long out_row(int m) const { return phase.dx_row(this->g, m); }
    __device__ void finish(const T* tile, T* out, float* scratch) const {
        if constexpr (FUSE & FUSE_DRELU) store_masked_with_sums<Cfg>(*this, tile, out, fused.y, fused.norm, slab, scratch);
        else write_tile<Cfg>(*this, tile, out);
    }
};

// Grad-weight: dW[k, (r, s, c)] = Σ_{npq} dY[npq, k] · X[n, p·st − pad + r, q·st − pad + s, c],
// the pixels (the reduction) split over blockIdx.z.
template <class Cfg, int FUSE>
struct WgradPass : PassBase<Cfg> {
    using T = typename Cfg::T;
    static constexpr bool A_K_MAJOR = false, B_K_MAJOR = false, NORMALIZES = FUSE & FUSE_NORMALIZE;
    static constexpr int A_CHUNKS = Cfg::BM / Cfg::EPC, B_CHUNKS = Cfg::BN / Cfg::EPC;
    using ASlots = ColumnSlots<Cfg::THREADS, Cfg::BK, A_CHUNKS, !Cfg::BF16>;
    using BSlots = RowSlots<Cfg::THREADS, Cfg::BK, B_CHUNKS, !Cfg::BF16>;
    const T *x, *dy;
    unsigned a_element[ASlots::COUNT];  // dY's element at (pixel = the slot's row, k)
    unsigned a_last;  // the element of this thread's column in dY's last pixel
    int b_position[BSlots::COUNT];  // the column's (r·W + s)·C + c: its offset from a window origin
    int b_offset[BSlots::COUNT];  // the chunk's place in shared memory
    unsigned b_select[BSlots::COUNT];  // the column's bits (r, 16 + s) in the pixel's window mask
    PixelCursor<Cfg::BK> loading, consumed;  // this thread's pixel of the tile loaded next, normalized next
    PixelStep step;
    // FUSE_NORMALIZE: the consumed pixel's group, the image after it, the last group. A pixel past
    // the last image (its window empty, its entries unused) reads the last group's: the table ends there
    int consumed_group, group_end, last_group;
    SharedAddress table;  // FUSE_NORMALIZE: every group's [scale | shift][BN] of T for the block's columns
    int a_delta;
    NormArgs<T> fused;

    __device__ WgradPass(const Geometry& g_, const T* x_, const T* dy_, const NormArgs<T>& fused_)
        : PassBase<Cfg>(g_), x(x_), dy(dy_), fused(fused_) {
        const Geometry& g = this->g;
        this->rows = g.K, this->columns = g.rsc();
        int total = (g.npq() + Cfg::BK - 1) / Cfg::BK;
        this->split_range(total, blockIdx.z, gridDim.z);
        int k = min(this->m0 + ASlots::chunk() * Cfg::EPC, g.K - Cfg::EPC);
        for (int i = 0; i < ASlots::COUNT; ++i) a_element[i] = ASlots::row(i) * g.K + k;
        a_last = (g.npq() - 1) * g.K + k;
        for (int i = 0; i < BSlots::COUNT; ++i) {
            int column = this->n0 + BSlots::chunk(i) * Cfg::EPC;
            int c = column % g.C, s = column / g.C % g.S, r = column / (g.C * g.S);
            bool inside = column < g.rsc();
            b_position[i] = (r * g.W + s) * g.C + c;
            b_offset[i] = BSlots::offset(i);
            b_select[i] = inside ? 1u << r | 1u << (16 + s) : ~0u;  // past the edge: no window has it (zeros)
        }
        loading = consumed = PixelCursor<Cfg::BK>(this->tiles_begin * Cfg::BK + BSlots::row(), g);
        step = PixelCursor<Cfg::BK>::step(g);
        consumed_group = consumed.n / fused.groups.images, group_end = (consumed_group + 1) * fused.groups.images;
        last_group = g.N / fused.groups.images - 1;
        a_delta = this->tiles_begin * Cfg::BK * g.K;
    }
    __device__ void load(SharedAddress a_tile, SharedAddress b_tile) {
        const Geometry& g = this->g;
        // past the last pixel dY's rows repeat it: B's rows there are zeros, so they add nothing
        for (int i = 0; i < ASlots::COUNT; ++i) copy_chunk(a_tile, ASlots::offset(i), dy, min(a_element[i] + a_delta, a_last));
        unsigned window = loading.window(g);
        int origin = ((loading.n * g.H + loading.h0(g)) * g.W + loading.w0(g)) * g.C;
        for (int i = 0; i < BSlots::COUNT; ++i)
            copy_chunk(b_tile, b_offset[i], x, unsigned(origin + b_position[i]), (window & b_select[i]) == b_select[i]);
        a_delta += Cfg::BK * g.K;  // the next BK pixels
        loading.advance(g, step);
    }
    __device__ long long out_row(int m) const { return (long long)m * this->g.rsc(); }
    // FUSE_NORMALIZE: the table, written by the whole block (a barrier must follow)
    __device__ void build_table(unsigned char* at) {
        const Geometry& g = this->g;
        T* t = reinterpret_cast<T*>(at);
        int groups = g.N / fused.groups.images;
        for (int e = threadIdx.x; e < groups * Cfg::BN; e += Cfg::THREADS) {
            int group = e / Cfg::BN, column = e % Cfg::BN, c = (this->n0 + column) % g.C;
            t[2 * group * Cfg::BN + column] = from_float<T>(norm_row(fused.norm, group, NORM_SCALE, g.C)[c]);
            t[(2 * group + 1) * Cfg::BN + column] = from_float<T>(norm_row(fused.norm, group, NORM_SHIFT, g.C)[c]);
        }
        table = shared_address(t);
    }
    // FUSE_NORMALIZE: this thread's chunks of the next tile's B (x at its pixel's window)
    __device__ void normalize(SharedAddress, SharedAddress b_tile) {
        constexpr int ROW_BYTES = Cfg::BN * int(sizeof(T));
        unsigned window = consumed.window(this->g);
        SharedAddress scale = table + 2 * min(consumed_group, last_group) * ROW_BYTES;
        for (int i = 0; i < BSlots::COUNT; ++i) {
            int column_bytes = BSlots::chunk(i) * 16;
            ChunkAffine<T>(scale + column_bytes, scale + ROW_BYTES + column_bytes)
                .apply(b_tile + b_offset[i], (window & b_select[i]) == b_select[i]);
        }
        consumed.advance(this->g, step);
        while (consumed.n >= group_end) ++consumed_group, group_end += fused.groups.images;
    }
    __device__ void finish(const float* tile, float* out, float*) const { write_tile<Cfg>(*this, tile, out); }
};

// ---- fragments: shared memory -> registers --------------------------------------------------------
// Per operand, the warp's fragments of one k-step: for A, `COUNT` m16 blocks of 4 registers; for
// B, `COUNT` n8 tiles of 2 registers, in the mma's register order (kernels/ptx.cuh). Each lane's
// byte offsets are computed once. ldmatrix.x4 lane l gives the address of row l % 8 of matrix
// l / 8; for A the four matrices are (rows 0-7 | 8-15) × (k low | k high), for B (k low | k high)
// of n 0-7, then of n 8-15: two adjacent n8 tiles.
template <bool IS_B, int PER_WARP>
struct FragmentShape {
    static constexpr int REGS = IS_B ? 2 : 4;
    static constexpr int COUNT = PER_WARP / (IS_B ? 8 : 16);
    static constexpr int LOADS = PER_WARP / 16;  // ldmatrix.x4 per k-step: 16 rows or columns each
};

template <int N>
__device__ __forceinline__ void take_x4(unsigned (&frag)[N][4], int load, const unsigned (&r)[4]) {
    for (int j = 0; j < 4; ++j) frag[load][j] = r[j];
}
template <int N>
__device__ __forceinline__ void take_x4(unsigned (&frag)[N][2], int load, const unsigned (&r)[4]) {
    frag[2 * load][0] = r[0], frag[2 * load][1] = r[1], frag[2 * load + 1][0] = r[2], frag[2 * load + 1][1] = r[3];
}

// A K-major tile (a row per m or n, ROW_CHUNKS chunks of k): ldmatrix
template <bool IS_B, int PER_WARP, int ROW_CHUNKS>
struct KMajorFragments : FragmentShape<IS_B, PER_WARP> {
    int base;  // this lane's row address at k-step 0 of the first load, bytes from the tile's start
    __device__ void init(int warp_row0) {
        int lane = threadIdx.x % 32, matrix = lane / 8;
        int row = warp_row0 + lane % 8 + 8 * (IS_B ? matrix / 2 : matrix % 2);
        int chunk = IS_B ? matrix % 2 : matrix / 2;
        base = chunk_offset<ROW_CHUNKS, false>(row, chunk);
    }
    template <int REGS>
    __device__ void load(unsigned (&frag)[PER_WARP / (IS_B ? 8 : 16)][REGS], SharedAddress tile, int kk) const {
        for (int i = 0; i < this->LOADS; ++i) {  // k-step kk: two chunks further, i.e. XOR kk·32 (see above)
            unsigned r[4];
            ldmatrix_x4(r, tile + ((base ^ (kk * 32)) + i * 16 * ROW_CHUNKS * 16));
            take_x4(frag, i, r);
        }
    }
};

// A 16-bit MN-major tile (a row per k, ROW_CHUNKS chunks of m or n): ldmatrix.trans
template <bool IS_B, int PER_WARP, int ROW_CHUNKS>
struct TransposedFragments : FragmentShape<IS_B, PER_WARP> {
    static constexpr int ROW_BYTES = ROW_CHUNKS * 16;
    int base;
    __device__ void init(int warp_col0) {
        int lane = threadIdx.x % 32, matrix = lane / 8;
        int row = lane % 8 + 8 * (IS_B ? matrix % 2 : matrix / 2);
        int chunk = warp_col0 / 8 + (IS_B ? matrix / 2 : matrix % 2);
        base = chunk_offset<ROW_CHUNKS, false>(row, chunk);
    }
    template <int REGS>
    __device__ void load(unsigned (&frag)[PER_WARP / (IS_B ? 8 : 16)][REGS], SharedAddress tile, int kk) const {
        for (int i = 0; i < this->LOADS; ++i) {  // load i: two chunks further, i.e. XOR i·32; k-step: 16 rows
            unsigned r[4];
            ldmatrix_x4_trans(r, tile + ((base ^ (i * 32)) + kk * 16 * ROW_BYTES));
            take_x4(frag, i, r);
        }
    }
};

// A 32-bit MN-major tile (TF32; a row per k): register j of a fragment is element
// (k = t + 4·(j / HALVES), m or n = g + 8·(j % HALVES)) of its block, one LDS each
template <bool IS_B, int PER_WARP, int ROW_CHUNKS>
struct ScalarFragments : FragmentShape<IS_B, PER_WARP> {
    static constexpr int HALVES = IS_B ? 1 : 2, WIDTH = IS_B ? 8 : 16, ROW_BYTES = ROW_CHUNKS * 16;
    int offset[PER_WARP / WIDTH][HALVES];  // this lane's element at row t, per block and 8-wide half
    __device__ void init(int warp_col0) {
        int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        for (int b = 0; b < PER_WARP / WIDTH; ++b)
            for (int half = 0; half < HALVES; ++half) {
                int column = warp_col0 + b * WIDTH + 8 * half + g;
                offset[b][half] = chunk_offset<ROW_CHUNKS, true>(t, column / 4) + column % 4 * 4;
            }
    }
    template <int REGS>
    __device__ void load(unsigned (&frag)[PER_WARP / WIDTH][REGS], SharedAddress tile, int kk) const {
        for (int b = 0; b < PER_WARP / WIDTH; ++b)
            for (int j = 0; j < REGS; ++j)
                frag[b][j] = lds_32(tile + offset[b][j % HALVES] + (kk * 8 + 4 * (j / HALVES)) * ROW_BYTES);
    }
};

template <bool CONDITION, class A, class B> struct Select { using type = A; };  // no <type_traits> in NVRTC
template <class A, class B> struct Select<false, A, B> { using type = B; };

// The fragment reader of an operand: K-major (ldmatrix), or MN-major of 16-bit (ldmatrix.trans)
// or 32-bit (LDS) data; EXTENT is the tile's BM or BN.
template <class Cfg, bool K_MAJOR, bool IS_B, int EXTENT>
struct FragmentReader {
    static constexpr int PER_WARP = IS_B ? Cfg::WN : Cfg::WM;
    static constexpr int ROW_CHUNKS = K_MAJOR ? Cfg::BK / Cfg::EPC : EXTENT / Cfg::EPC;
    using type = typename Select<K_MAJOR, KMajorFragments<IS_B, PER_WARP, ROW_CHUNKS>,
                                 typename Select<Cfg::BF16, TransposedFragments<IS_B, PER_WARP, ROW_CHUNKS>,
                                                 ScalarFragments<IS_B, PER_WARP, ROW_CHUNKS>>::type>::type;
};

// ---- the warp's product ---------------------------------------------------------------------------
template <class Cfg, class Pass>
struct WarpProduct {
    using AReader = typename FragmentReader<Cfg, Pass::A_K_MAJOR, false, Cfg::BM>::type;
    using BReader = typename FragmentReader<Cfg, Pass::B_K_MAJOR, true, Cfg::BN>::type;
    float acc[Cfg::M_TILES][Cfg::N_TILES][4];
    AReader a;
    BReader b;
    int warp_m0, warp_n0;

    __device__ WarpProduct() {
        int warp = threadIdx.x / 32;
        warp_m0 = warp / (Cfg::BN / Cfg::WN) * Cfg::WM, warp_n0 = warp % (Cfg::BN / Cfg::WN) * Cfg::WN;
        a.init(warp_m0), b.init(warp_n0);
        for (auto& row : acc)
            for (auto& tile : row)
                for (float& v : tile) v = 0.0f;
    }
    __device__ void compute(SharedAddress a_tile, SharedAddress b_tile) {
#pragma unroll
        for (int kk = 0; kk < Cfg::K_STEPS; ++kk) {
            unsigned fa[Cfg::M_TILES][4], fb[Cfg::N_TILES][2];
            a.load(fa, a_tile, kk);
            b.load(fb, b_tile, kk);
#pragma unroll
            for (int i = 0; i < Cfg::M_TILES; ++i)
#pragma unroll
                for (int j = 0; j < Cfg::N_TILES; ++j) {
                    if constexpr (Cfg::BF16) mma_bf16_m16n8k16(acc[i][j], fa[i], fb[j], acc[i][j]);
                    else mma_tf32_m16n8k8(acc[i][j], fa[i], fb[j], acc[i][j]);
                }
        }
    }
};

// ---- the pipelined main loop and the epilogue -----------------------------------------------------
__device__ __forceinline__ void store_pair(float* p, float a, float b) { p[0] = a, p[1] = b; }
__device__ __forceinline__ void store_pair(__nv_bfloat16* p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// the accumulators into the staged tile (StagedTile), rounded to Out, for every thread to read
template <class Cfg, class Pass, class Out>
__device__ void stage_tile(const WarpProduct<Cfg, Pass>& math, Out* tile) {
    constexpr int PITCH = StagedTile<Cfg, Out>::PITCH;
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < Cfg::M_TILES; ++i)
        for (int j = 0; j < Cfg::N_TILES; ++j) {
            int row = math.warp_m0 + 16 * i + g, col = math.warp_n0 + 8 * j + 2 * t;
            store_pair(tile + row * PITCH + col, math.acc[i][j][0], math.acc[i][j][1]);
            store_pair(tile + (row + 8) * PITCH + col, math.acc[i][j][2], math.acc[i][j][3]);
        }
    __syncthreads();
}

// The block's k-tiles through STAGES shared-memory stages: while the tensor cores work on tile
// t, the copies of tiles t + 1 .. t + STAGES − 1 are in flight. Then the block's tile of the
// product goes to `out` (the data type) or, split over blockIdx.z, to `partial` (fp32).
template <class Cfg, class Pass, class Out>
__device__ void implicit_gemm(Pass& pass, Out* out, float* partial, long long partial_stride) {
    DYNAMIC_SHARED_MEMORY(unsigned char, smem);
    SharedAddress base = shared_address(smem);
    WarpProduct<Cfg, Pass> math;
    constexpr int RING = Cfg::STAGES * Cfg::STAGE_BYTES;
    auto next = [](int offset) { return offset + Cfg::STAGE_BYTES == RING ? 0 : offset + Cfg::STAGE_BYTES; };
    if constexpr (Pass::NORMALIZES) {  // the launch gives NORM_TABLE_BYTES more, after the stages
        static_assert(RING + NORM_TABLE_BYTES <= MAX_SHARED_BYTES, "the stages and the table fit a block");
        pass.build_table(smem + RING);
        __syncthreads();
    }
    for (int s = 0; s < Cfg::STAGES - 1; ++s) {  // prologue: the first STAGES − 1 tiles in flight
        SharedAddress stage = base + s * Cfg::STAGE_BYTES;
        if (s < pass.tiles) pass.load(stage, stage + Cfg::A_BYTES);
        cp_async_commit();
    }
    int read = 0, write = (Cfg::STAGES - 1) * Cfg::STAGE_BYTES;  // byte offsets of the stages
    for (int t = 0; t < pass.tiles; ++t) {
        cp_async_wait<Cfg::STAGES - 2>();  // this thread's copies of tile t have landed
        if constexpr (Pass::NORMALIZES) pass.normalize(base + read, base + read + Cfg::A_BYTES);
        __syncthreads();  // everyone's have, and everyone is done with tile t − 1, whose stage is next
        if (t + Cfg::STAGES - 1 < pass.tiles) pass.load(base + write, base + write + Cfg::A_BYTES);
        cp_async_commit();  // a group also when empty: the wait above counts groups
        math.compute(base + read, base + read + Cfg::A_BYTES);
        read = next(read), write = next(write);
    }
    cp_async_wait<0>();
    __syncthreads();  // the stages are free for the epilogue tile
    if (partial) {
        stage_tile<Cfg>(math, reinterpret_cast<float*>(smem));
        write_tile<Cfg>(pass, reinterpret_cast<const float*>(smem), partial + pass.split * partial_stride);
    } else {
        stage_tile<Cfg>(math, reinterpret_cast<Out*>(smem));
        pass.finish(reinterpret_cast<const Out*>(smem), out, reinterpret_cast<float*>(smem + StagedTile<Cfg, Out>::BYTES));
    }
}

// ---- kernels --------------------------------------------------------------------------------------
#define CONV_GEOMETRY int N, int H, int W, int C, int K, int R, int S, int P, int Q, int stride, int pad
#define GEOMETRY Geometry{N, H, W, C, K, R, S, P, Q, stride, pad}
template <class Cfg>
using Data = typename Cfg::T;

// The fused parts' arguments (NormArgs; null and unused where FUSE does not ask for them): the
// input's batch norm [group][NORM_ROWS][C], grad-input's y, the slabs of sums, images per
// statistics group and blocks along M per group (a plain launch: N, and all of grid.x)
#define NORM_ARGS const float* norm, const Data<Cfg>* bn_input, float* sums, int group_images, int group_tiles
#define NORM NormArgs<Data<Cfg>>{norm, bn_input, sums, GroupTiling{group_images, group_tiles}}

// y: the output, or with grid.z = splits > 1, partial: splits fp32 copies of it (y unused)
template <class Cfg, int FUSE>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    conv_fwd_v2(const Data<Cfg>* x, const Data<Cfg>* w, Data<Cfg>* y, float* partial, CONV_GEOMETRY, NORM_ARGS) {
    FwdPass<Cfg, FUSE> pass(GEOMETRY, x, w, NORM);
    implicit_gemm<Cfg>(pass, y, partial, (long long)N * P * Q * K);
}

// grid.z = stride² phases × splits; grid.x covers the largest phase. dx: the output, or partial
// (splits fp32 copies of dx) with more than one split.
template <class Cfg, int FUSE>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    conv_dgrad_v2(const Data<Cfg>* dy, const Data<Cfg>* w, Data<Cfg>* dx, float* partial, CONV_GEOMETRY, NORM_ARGS) {
    DgradPass<Cfg, FUSE> pass(GEOMETRY, dy, w, NORM);
    if (pass.m0 >= pass.rows) {  // the whole block: a smaller phase
        if constexpr (FUSE & FUSE_DRELU) zero_sums<Cfg>(pass, pass.slab);
        return;
    }
    implicit_gemm<Cfg>(pass, dx, partial, (long long)N * H * W * C);
}

// grid.z = splits; out: dW (float32) with one split, else splits partial copies of it
template <class Cfg, int FUSE>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    conv_wgrad_v2(const Data<Cfg>* x, const Data<Cfg>* dy, float* out, CONV_GEOMETRY, NORM_ARGS) {
    WgradPass<Cfg, FUSE> pass(GEOMETRY, x, dy, NORM);
    implicit_gemm<Cfg>(pass, out, gridDim.z > 1 ? out : nullptr, (long long)pass.rows * pass.columns);
}
