// Convolution of NHWC activations with KRSC weights as an implicit GEMM: forward, grad-input
// (dgrad) and grad-weight (wgrad), on tensor cores (WMMA: TF32 for fp32 data, bf16) or on the
// plain fp32 units. Reference: minidl/ops/conv.py (correlate, grad_input, grad_weight).
//
// The three passes are one matrix product C[M×N] = Σ_k A[M×k]·B[k×N] each, with A and B read
// straight from the tensors (no im2col in memory):
//
//   pass    M                    N          reduction k          A                 B
//   fwd     output pixels NPQ    K          (r, s, c)            X gathered        Wᵀ
//   dgrad   input pixels (phase) C          (taps, k)            dY gathered       W
//   wgrad   K                    (r, s, c)  output pixels NPQ    dYᵀ               X gathered
//
// Channels last makes every gather a run of contiguous channels: a pixel's C values, a weight
// row's R·S·C values, an output pixel's K gradients. A block computes a BM×BN tile of C; the
// k dimension goes through shared memory BK at a time, in a ring of STAGES buffers filled by
// asynchronous copies (cp.async, 16 bytes each, zero-filled where the window leaves the image or
// the tile leaves the matrix) while the tensor cores work on the previous buffer. Each thread
// owns fixed copy slots, so the decomposition of a pixel index into (n, p, q) is done once and
// the (r, s, c) of the reduction index advances by BK per tile without a division.
//
// dgrad of a strided convolution: input pixel h receives the taps r with h + pad − r ≡ 0
// (mod stride), so the pixels are split into stride² phases (h mod stride, w mod stride),
// blockIdx.z each; within a phase the sum is a dense GEMM over its ⌈R/stride⌉·⌈S/stride⌉ taps
// and no work goes to the zeros a naive gather would multiply. Stride 1 is the single phase.
//
// wgrad reduces over all N·P·Q output pixels (up to 401k for the stem at batch 32), so the
// reduction is split into gridDim.z ranges (split-K) writing fp32 partial tiles to a workspace
// that splitk_reduce sums in a fixed order: the result does not depend on scheduling.
//
// Tile configurations (the TileConfig template argument; minidl/kernels/conv.py declares them
// and picks one per call):
//   Tf32Tile  fp32 data, TF32 tensor cores (m16n16k8), 128×128×16, 3 stages, 8 warps of 64×32
//   Bf16Tile  bf16 data, bf16 tensor cores (m16n16k16), 128×128×32, 3 stages, 8 warps of 64×32
//   SimtTile  fp32 data and arithmetic, 64×64×16, 2 stages, 4×4 outputs per thread: channel
//             counts that are not a multiple of the 16-byte copy (the 3-channel stem), and exact
//             fp32 where TF32 is not wanted
// Launch constants (CONV_THREADS, CONV_BLOCKS_PER_SM, SPLITK_THREADS) come from the same module
// as -D options.
// Accumulation is fp32 everywhere; wgrad writes fp32 also for bf16 data.
//
// Shapes: any N, H, W, R, S, stride, padding; the tensor-core tiles need C and K multiples of
// 4 (TF32) or 8 (bf16) channels, i.e. every ResNet-50 layer but the stem, which takes SimtTile:
// 1×1 stride 1 and 2, 3×3 stride 1 and 2, 7×7 stride 2. Edges that do not fill a tile are
// predicated (zero-filled loads, masked stores).
#include <mma.h>
#include <cuda_bf16.h>
#include <cuda_pipeline_primitives.h>

#if !defined(CONV_THREADS) || !defined(CONV_BLOCKS_PER_SM) || !defined(SPLITK_THREADS)
#error "compile with the options of minidl/kernels/conv.py (CONV_THREADS, CONV_BLOCKS_PER_SM, SPLITK_THREADS)"
#endif

#ifndef DYNAMIC_SHARED_MEMORY  // the CPU emulator (tests/kernels/emu) defines its own
#define DYNAMIC_SHARED_MEMORY(type, name)                                    \
    extern __shared__ __align__(128) unsigned char dynamic_shared_bytes[]; \
    type* name = reinterpret_cast<type*>(dynamic_shared_bytes)
#endif

using namespace nvcuda;

constexpr int cmax(int a, int b) { return a > b ? a : b; }
template <bool CONDITION, class A, class B> struct Select { using type = A; };  // no <type_traits> in NVRTC
template <class A, class B> struct Select<false, A, B> { using type = B; };
__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }
__device__ __forceinline__ void store_as(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_as(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

// ---- tile configurations ----------------------------------------------------------------------
// SMEM_BYTES_ is the dynamic shared memory the launcher gives the block: it must be this layout's
template <typename T_, bool TENSOR_CORES_, int BM_, int BN_, int BK_, int STAGES_, int SMEM_BYTES_>
struct TileConfig {
    using T = T_;
    static constexpr bool TENSOR_CORES = TENSOR_CORES_;
    static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_, THREADS = CONV_THREADS;
    static constexpr int CHUNK = TENSOR_CORES ? 16 / int(sizeof(T)) : 1;  // elements per async copy
    static constexpr int PAD = CHUNK;  // row padding: rows stay 16-byte multiples, banks are staggered
    // a buffer holds its tile k-major (rows of BK) or m/n-major (rows of BM or BN), whichever the pass uses
    static constexpr int A_ELEMS = cmax(BM * (BK + PAD), BK * (BM + PAD));
    static constexpr int B_ELEMS = cmax(BN * (BK + PAD), BK * (BN + PAD));
    static constexpr int STAGE_ELEMS = A_ELEMS + B_ELEMS;
    static constexpr int SMEM_BYTES = SMEM_BYTES_;
    static_assert(STAGES * STAGE_ELEMS * int(sizeof(T)) == SMEM_BYTES, "the launcher's shared memory fits this layout");
};

struct Conv {
    int N, H, W, C, K, R, S, P, Q, stride, pad;
    __device__ int npq() const { return N * P * Q; }
    __device__ int rsc() const { return R * S * C; }
};

// An index written as (hi·mid_size + mid)·lo_size + lo, advanced without dividing.
struct Digits {
    int hi, mid, lo;
    __device__ void set(int index, int mid_size, int lo_size) {
        lo = index % lo_size;
        index /= lo_size;
        mid = index % mid_size;
        hi = index / mid_size;
    }
    __device__ void advance(int delta, int mid_size, int lo_size) {
        lo += delta;
        while (lo >= lo_size) {
            lo -= lo_size;
            if (++mid == mid_size) mid = 0, ++hi;
        }
    }
};

// The copy slots of one thread in a tile of ROWS rows of COLS contiguous elements: slot i is
// the chunk at (row(i), col()); the column is the same for every slot of a thread.
template <class Cfg, int ROWS, int COLS>
struct Slots {
    static constexpr int PER_ROW = COLS / Cfg::CHUNK;
    static constexpr int COUNT = ROWS * PER_ROW / Cfg::THREADS;
    static_assert(Cfg::THREADS % PER_ROW == 0 && COUNT >= 1, "every thread copies whole chunks of fixed columns");
    __device__ static int row(int slot) { return threadIdx.x / PER_ROW + slot * (Cfg::THREADS / PER_ROW); }
    __device__ static int col() { return threadIdx.x % PER_ROW * Cfg::CHUNK; }
};

// How a pass holds A and B in a stage buffer: k-major (rows of BK reduction elements) or
// m/n-major (BK rows of BM or BN), where element (m, k) of A and (k, n) of B live, and the copy
// slots that fill each.
template <class Cfg, bool A_K_MAJOR_, bool B_K_MAJOR_>
struct Layout {
    static constexpr bool A_K_MAJOR = A_K_MAJOR_, B_K_MAJOR = B_K_MAJOR_;
    using ASlots = Slots<Cfg, A_K_MAJOR ? Cfg::BM : Cfg::BK, A_K_MAJOR ? Cfg::BK : Cfg::BM>;
    using BSlots = Slots<Cfg, B_K_MAJOR ? Cfg::BN : Cfg::BK, B_K_MAJOR ? Cfg::BK : Cfg::BN>;
    static constexpr int LDA = A_K_MAJOR ? Cfg::BK + Cfg::PAD : Cfg::BM + Cfg::PAD;
    static constexpr int LDB = B_K_MAJOR ? Cfg::BK + Cfg::PAD : Cfg::BN + Cfg::PAD;
    __device__ static int a(int m, int k) { return A_K_MAJOR ? m * LDA + k : k * LDA + m; }
    __device__ static int b(int k, int n) { return B_K_MAJOR ? n * LDB + k : k * LDB + n; }
};

// One 16-byte (tensor cores) or 4-byte (SIMT) asynchronous copy; src == nullptr: zeros.
template <class Cfg>
__device__ __forceinline__ void copy_chunk(typename Cfg::T* dst, const typename Cfg::T* src,
                                           const typename Cfg::T* any_valid) {
    constexpr int BYTES = Cfg::CHUNK * int(sizeof(typename Cfg::T));
    __pipeline_memcpy_async(dst, src ? src : any_valid, BYTES, src ? 0 : BYTES);
}

// ---- the passes: what A, B and C are ----------------------------------------------------------
// Each pass sets the block's tile (m0, n0) and k-tile range, loads the next k-tile of A and B
// into a stage buffer (load), and stores one element of C (store).
struct BlockWork {
    Conv g;
    int m0, n0;                        // the block's tile of C
    int k_tiles_begin, k_tiles_end;    // its k-tiles
    int k_next;                        // reduction index where the next k-tile starts
    __device__ BlockWork(const Conv& g_, int m0_, int n0_)
        : g(g_), m0(m0_), n0(n0_), k_tiles_begin(0), k_tiles_end(0), k_next(0) {}
};

// Forward: Y[npq, k] = Σ_{r,s,c} X[n, p·st − pad + r, q·st − pad + s, c] · W[k, r, s, c].
// A: rows are output pixels, k-major (a pixel's channels); B: rows are output channels, k-major.
template <class Cfg_>
struct FwdPass : BlockWork {
    using Cfg = Cfg_;
    using T = typename Cfg::T;
    using L = Layout<Cfg, true, true>;  // A and B k-major
    using ASlots = typename L::ASlots;
    using BSlots = typename L::BSlots;

    const T *x, *w;
    T* y;
    const T* a_image[ASlots::COUNT];  // the pixel's image, or nullptr past the last pixel
    int a_h0[ASlots::COUNT], a_w0[ASlots::COUNT];
    Digits a_rsc;                     // k_next + ASlots::col() as (r, s, c)
    const T* b_row[BSlots::COUNT];    // the output channel's weights, or nullptr

    __device__ FwdPass(const Conv& g_, const T* x_, const T* w_, T* y_)
        : BlockWork(g_, blockIdx.x * Cfg::BM, blockIdx.y * Cfg::BN), x(x_), w(w_), y(y_) {
        k_tiles_end = ceil_div(g.rsc(), Cfg::BK);
        for (int i = 0; i < ASlots::COUNT; ++i) {
            int m = m0 + ASlots::row(i);
            int q = m % g.Q, p = m / g.Q % g.P, n = m / (g.P * g.Q);
            a_image[i] = m < g.npq() ? x + (long long)n * g.H * g.W * g.C : nullptr;
            a_h0[i] = p * g.stride - g.pad, a_w0[i] = q * g.stride - g.pad;
        }
        a_rsc.set(ASlots::col(), g.S, g.C);
        for (int i = 0; i < BSlots::COUNT; ++i) {
            int k = n0 + BSlots::row(i);
            b_row[i] = k < g.K ? w + (long long)k * g.rsc() : nullptr;
        }
    }
    __device__ void load(T* sa, T* sb) {
        for (int i = 0; i < ASlots::COUNT; ++i) {
            int h = a_h0[i] + a_rsc.hi, wi = a_w0[i] + a_rsc.mid;
            bool inside = a_image[i] && k_next + ASlots::col() < g.rsc() && unsigned(h) < unsigned(g.H) &&
                          unsigned(wi) < unsigned(g.W);
            const T* src = inside ? a_image[i] + ((long long)h * g.W + wi) * g.C + a_rsc.lo : nullptr;
            copy_chunk<Cfg>(sa + L::a(ASlots::row(i), ASlots::col()), src, x);
        }
        a_rsc.advance(Cfg::BK, g.S, g.C);
        int b_k = k_next + BSlots::col();
        for (int i = 0; i < BSlots::COUNT; ++i) {
            const T* src = b_row[i] && b_k < g.rsc() ? b_row[i] + b_k : nullptr;
            copy_chunk<Cfg>(sb + L::b(BSlots::col(), BSlots::row(i)), src, w);
        }
        k_next += Cfg::BK;
    }
    __device__ void store(int m, int n, float v) const {
        if (m < g.npq() && n < g.K) store_as(y + (long long)m * g.K + n, v);
    }
};

// Grad-input, phase (ph, pw) = blockIdx.z: the input pixels h = ph + i·st, w = pw + j·st get the
// taps r = r0 + rr·st (r0 = (ph + pad) mod st), s likewise, and
//   dX[n, h, w, c] = Σ_{rr, ss, k} dY[n, pb + i − rr, qb + j − ss, k] · W[k, r, s, c]
// with pb = (ph + pad − r0)/st. A: rows are the phase's pixels, k-major (k contiguous in dY);
// B: rows are (rr, ss, k), n-major (c contiguous in W).
template <class Cfg_>
struct DgradPass : BlockWork {
    using Cfg = Cfg_;
    using T = typename Cfg::T;
    using L = Layout<Cfg, true, false>;  // A k-major, B n-major
    using ASlots = typename L::ASlots;
    using BSlots = typename L::BSlots;

    const T *dy, *w;
    T* dx;
    int ph, pw, r0, s0, taps_s, phase_h, phase_w, rows, reduction;  // reduction = taps_r·taps_s·K
    const T* a_image[ASlots::COUNT];  // the pixel's image of dY, or nullptr
    int a_p[ASlots::COUNT], a_q[ASlots::COUNT];  // pb + i, qb + j
    Digits a_tap;                      // k_next + ASlots::col() as (rr, ss, k)
    int b_c;                           // this thread's input channel (B column)
    Digits b_tap[BSlots::COUNT];       // k_next + BSlots::row(i) as (rr, ss, k)

    __device__ DgradPass(const Conv& g_, const T* dy_, const T* w_, T* dx_)
        : BlockWork(g_, blockIdx.x * Cfg::BM, blockIdx.y * Cfg::BN), dy(dy_), w(w_), dx(dx_) {
        int st = g.stride;
        ph = blockIdx.z / st, pw = blockIdx.z % st;
        r0 = (ph + g.pad) % st, s0 = (pw + g.pad) % st;
        int taps_r = ceil_div(g.R - r0, st);
        taps_s = ceil_div(g.S - s0, st);
        phase_h = ceil_div(g.H - ph, st), phase_w = ceil_div(g.W - pw, st);
        rows = g.N * phase_h * phase_w;
        reduction = taps_r * taps_s * g.K;
        k_tiles_end = reduction > 0 ? ceil_div(reduction, Cfg::BK) : 0;
        if (m0 >= rows || reduction == 0) return;  // nothing to load: the block stores zeros, or nothing
        int pb = (ph + g.pad - r0) / st, qb = (pw + g.pad - s0) / st;
        for (int i = 0; i < ASlots::COUNT; ++i) {
            int m = m0 + ASlots::row(i);
            int j = m % phase_w, ii = m / phase_w % phase_h, n = m / (phase_w * phase_h);
            a_image[i] = m < rows ? dy + (long long)n * g.P * g.Q * g.K : nullptr;
            a_p[i] = pb + ii, a_q[i] = qb + j;
        }
        a_tap.set(ASlots::col(), taps_s, g.K);
        b_c = n0 + BSlots::col();
        for (int i = 0; i < BSlots::COUNT; ++i) b_tap[i].set(BSlots::row(i), taps_s, g.K);
    }
    __device__ void load(T* sa, T* sb) {
        for (int i = 0; i < ASlots::COUNT; ++i) {
            int p = a_p[i] - a_tap.hi, q = a_q[i] - a_tap.mid;
            bool inside = a_image[i] && k_next + ASlots::col() < reduction && unsigned(p) < unsigned(g.P) &&
                          unsigned(q) < unsigned(g.Q);
            const T* src = inside ? a_image[i] + ((long long)p * g.Q + q) * g.K + a_tap.lo : nullptr;
            copy_chunk<Cfg>(sa + L::a(ASlots::row(i), ASlots::col()), src, dy);
        }
        a_tap.advance(Cfg::BK, taps_s, g.K);
        for (int i = 0; i < BSlots::COUNT; ++i) {
            int r = r0 + b_tap[i].hi * g.stride, s = s0 + b_tap[i].mid * g.stride;
            bool inside = k_next + BSlots::row(i) < reduction && b_c < g.C;
            const T* src = inside ? w + (((long long)b_tap[i].lo * g.R + r) * g.S + s) * g.C + b_c : nullptr;
            copy_chunk<Cfg>(sb + L::b(BSlots::row(i), BSlots::col()), src, w);
            b_tap[i].advance(Cfg::BK, taps_s, g.K);
        }
        k_next += Cfg::BK;
    }
    __device__ void store(int m, int c, float v) const {
        if (m >= rows || c >= g.C) return;
        int j = m % phase_w, i = m / phase_w % phase_h, n = m / (phase_w * phase_h);
        store_as(dx + (((long long)n * g.H + ph + i * g.stride) * g.W + pw + j * g.stride) * g.C + c, v);
    }
};

// Grad-weight: dW[k, (r, s, c)] = Σ_{npq} dY[npq, k] · X[n, p·st − pad + r, q·st − pad + s, c],
// this block's share of the pixels being k-tiles [k_tiles_begin, k_tiles_end) of split blockIdx.z,
// written to out[blockIdx.z]. A = dYᵀ: rows are pixels, m-major (k contiguous in dY);
// B: rows are pixels, n-major (c contiguous in X).
template <class Cfg_>
struct WgradPass : BlockWork {
    using Cfg = Cfg_;
    using T = typename Cfg::T;
    using L = Layout<Cfg, false, false>;  // A m-major, B n-major
    using ASlots = typename L::ASlots;
    using BSlots = typename L::BSlots;

    const T *x, *dy;
    float* out;
    int a_kout;                        // this thread's output channel (A column)
    int b_r, b_s, b_c;                 // this thread's (r, s, c) (B column), b_c >= C: none
    Digits npq[ASlots::COUNT];         // pixel k_next + ASlots::row(i) as (n, p, q) (B slots share rows)

    static_assert(Cfg::BM == Cfg::BN, "A and B slots cover the same pixel rows");

    __device__ WgradPass(const Conv& g_, const T* x_, const T* dy_, float* out_)
        : BlockWork(g_, blockIdx.x * Cfg::BM, blockIdx.y * Cfg::BN), x(x_), dy(dy_) {
        out = out_ + (long long)blockIdx.z * g.K * g.rsc();
        int tiles = ceil_div(g.npq(), Cfg::BK), per_split = ceil_div(tiles, int(gridDim.z));
        k_tiles_begin = min(tiles, int(blockIdx.z) * per_split), k_tiles_end = min(tiles, k_tiles_begin + per_split);
        a_kout = m0 + ASlots::col();
        int column = n0 + BSlots::col();
        b_c = column < g.rsc() ? column % g.C : g.C;
        b_s = column / g.C % g.S, b_r = column / (g.C * g.S);
        k_next = k_tiles_begin * Cfg::BK;
        for (int i = 0; i < ASlots::COUNT; ++i) npq[i].set(k_next + ASlots::row(i), g.P, g.Q);
    }
    __device__ void load(T* sa, T* sb) {
        for (int i = 0; i < ASlots::COUNT; ++i) {
            int pixel = k_next + ASlots::row(i);
            bool pixel_ok = pixel < g.npq();
            const T* a_src = pixel_ok && a_kout < g.K ? dy + (long long)pixel * g.K + a_kout : nullptr;
            copy_chunk<Cfg>(sa + L::a(ASlots::col(), ASlots::row(i)), a_src, dy);
            int h = npq[i].mid * g.stride - g.pad + b_r, wi = npq[i].lo * g.stride - g.pad + b_s;
            bool inside = pixel_ok && b_c < g.C && unsigned(h) < unsigned(g.H) && unsigned(wi) < unsigned(g.W);
            const T* b_src = inside ? x + (((long long)npq[i].hi * g.H + h) * g.W + wi) * g.C + b_c : nullptr;
            copy_chunk<Cfg>(sb + L::b(BSlots::row(i), BSlots::col()), b_src, x);
            npq[i].advance(Cfg::BK, g.P, g.Q);
        }
        k_next += Cfg::BK;
    }
    __device__ void store(int kout, int column, float v) const {
        if (kout < g.K && column < g.rsc()) out[(long long)kout * g.rsc() + column] = v;
    }
};

// ---- the arithmetic: tensor cores or fp32 FMAs ------------------------------------------------
template <typename T> struct Mma;
template <> struct Mma<float> {  // fp32 data on TF32 tensor cores: round each operand to 10 mantissa bits
    static constexpr int K = 8;
    using Operand = wmma::precision::tf32;
    template <class F> __device__ static void prepare(F& f) {
        for (int i = 0; i < f.num_elements; ++i) f.x[i] = wmma::__float_to_tf32(f.x[i]);
    }
};
template <> struct Mma<__nv_bfloat16> {
    static constexpr int K = 16;
    using Operand = __nv_bfloat16;
    template <class F> __device__ static void prepare(F&) {}
};

// 8 warps in a 2×4 grid, each a 64×32 tile of C held as 4×2 accumulator fragments of 16×16.
template <class Pass>
struct TensorCoreMath {
    using Cfg = typename Pass::Cfg;
    using T = typename Cfg::T;
    using L = typename Pass::L;
    using M = Mma<T>;
    static constexpr int WARPS_N = 4, WARP_M = Cfg::BM / 2, WARP_N = Cfg::BN / WARPS_N;
    static constexpr int FRAGS_M = WARP_M / 16, FRAGS_N = WARP_N / 16;
    using ALayout = typename Select<L::A_K_MAJOR, wmma::row_major, wmma::col_major>::type;
    using BLayout = typename Select<L::B_K_MAJOR, wmma::col_major, wmma::row_major>::type;
    static_assert(Cfg::THREADS == 2 * WARPS_N * 32 && Cfg::BK % M::K == 0, "tile and warp grid agree");

    wmma::fragment<wmma::accumulator, 16, 16, M::K, float> acc[FRAGS_M][FRAGS_N];
    int warp_m, warp_n;

    __device__ TensorCoreMath() {
        int warp = threadIdx.x / 32;
        warp_m = warp / WARPS_N * WARP_M, warp_n = warp % WARPS_N * WARP_N;
        for (auto& row : acc)
            for (auto& f : row) wmma::fill_fragment(f, 0.0f);
    }
    __device__ void compute(const T* sa, const T* sb) {
#pragma unroll 1  // unrolled, the two k-steps' fragments are live at once: over 128 registers
        for (int kk = 0; kk < Cfg::BK; kk += M::K) {
            wmma::fragment<wmma::matrix_b, 16, 16, M::K, typename M::Operand, BLayout> b[FRAGS_N];
            for (int j = 0; j < FRAGS_N; ++j) {
                wmma::load_matrix_sync(b[j], sb + L::b(kk, warp_n + 16 * j), L::LDB);
                M::prepare(b[j]);
            }
            for (int i = 0; i < FRAGS_M; ++i) {  // one A fragment live at a time: fewer registers
                wmma::fragment<wmma::matrix_a, 16, 16, M::K, typename M::Operand, ALayout> a;
                wmma::load_matrix_sync(a, sa + L::a(warp_m + 16 * i, kk), L::LDA);
                M::prepare(a);
                for (int j = 0; j < FRAGS_N; ++j) wmma::mma_sync(acc[i][j], a, b[j], acc[i][j]);
            }
        }
    }
    // Fragments are opaque: each goes through this warp's 16×16 patch of shared memory, from
    // where every lane stores one column of 8 rows with the pass's bounds and conversion.
    __device__ void store(const Pass& pass, float* scratch) {
        int lane = threadIdx.x % 32;
        float* patch = scratch + threadIdx.x / 32 * 256;
        for (int i = 0; i < FRAGS_M; ++i)
            for (int j = 0; j < FRAGS_N; ++j) {
                wmma::store_matrix_sync(patch, acc[i][j], 16, wmma::mem_row_major);
                __syncwarp();
                for (int e = lane; e < 256; e += 32)
                    pass.store(pass.m0 + warp_m + 16 * i + e / 16, pass.n0 + warp_n + 16 * j + e % 16, patch[e]);
                __syncwarp();
            }
    }
};

// 16×16 threads, each owning rows ty + 16i and columns tx + 16j of the tile: the shared-memory
// reads of a warp are broadcasts (A) or distinct banks (B).
template <class Pass>
struct SimtMath {
    using Cfg = typename Pass::Cfg;
    using L = typename Pass::L;
    static constexpr int TM = Cfg::BM / 16, TN = Cfg::BN / 16;
    float acc[TM][TN];
    int tx, ty;

    __device__ SimtMath() : tx(threadIdx.x % 16), ty(threadIdx.x / 16) {
        for (auto& row : acc)
            for (float& v : row) v = 0.0f;
    }
    __device__ void compute(const float* sa, const float* sb) {
        for (int k = 0; k < Cfg::BK; ++k) {
            float a[TM], b[TN];
            for (int i = 0; i < TM; ++i) a[i] = sa[L::a(ty + 16 * i, k)];
            for (int j = 0; j < TN; ++j) b[j] = sb[L::b(k, tx + 16 * j)];
            for (int i = 0; i < TM; ++i)
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
    }
    __device__ void store(const Pass& pass, float*) {
        for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j) pass.store(pass.m0 + ty + 16 * i, pass.n0 + tx + 16 * j, acc[i][j]);
    }
};

// ---- the pipelined main loop, shared by every pass and tile -----------------------------------
template <class Pass>
__device__ void implicit_gemm(Pass& pass) {
    using Cfg = typename Pass::Cfg;
    using T = typename Cfg::T;
    using Math = typename Select<Cfg::TENSOR_CORES, TensorCoreMath<Pass>, SimtMath<Pass>>::type;
    static_assert(Cfg::THREADS / 32 * 256 * sizeof(float) <= Cfg::SMEM_BYTES, "the epilogue patches fit");
    DYNAMIC_SHARED_MEMORY(T, smem);
    Math math;
    int tiles = pass.k_tiles_end - pass.k_tiles_begin;
    auto a_stage = [&](int t) { return smem + t % Cfg::STAGES * Cfg::STAGE_ELEMS; };
    auto b_stage = [&](int t) { return a_stage(t) + Cfg::A_ELEMS; };

    for (int t = 0; t < Cfg::STAGES - 1; ++t) {  // prologue: the first STAGES − 1 tiles in flight
        if (t < tiles) pass.load(a_stage(t), b_stage(t));
        __pipeline_commit();
    }
    for (int t = 0; t < tiles; ++t) {
        __pipeline_wait_prior(Cfg::STAGES - 2);  // this thread's copies of tile t have landed
        __syncthreads();  // everyone's have, and everyone is done with tile t − 1, whose buffer is next
        int next = t + Cfg::STAGES - 1;
        if (next < tiles) pass.load(a_stage(next), b_stage(next));
        __pipeline_commit();
        math.compute(a_stage(t), b_stage(t));
    }
    __pipeline_wait_prior(0);
    __syncthreads();  // the buffers are free for the epilogue
    math.store(pass, reinterpret_cast<float*>(smem));
}

// ---- kernels --------------------------------------------------------------------------------
// Two blocks per SM (so at most 128 registers a thread): one block's copies and barriers overlap
// the other's math; 2 × 60 KiB of shared memory fits the SM's 228 KiB.

// the tensor arguments of the three passes, then the geometry every kernel takes
#define CONV_GEOMETRY int N, int H, int W, int C, int K, int R, int S, int P, int Q, int stride, int pad
template <class Cfg>
using Data = typename Cfg::T;

template <class Cfg>
__global__ void __launch_bounds__(CONV_THREADS, CONV_BLOCKS_PER_SM)
    conv_fwd(const Data<Cfg>* x, const Data<Cfg>* w, Data<Cfg>* y, CONV_GEOMETRY) {
    FwdPass<Cfg> pass(Conv{N, H, W, C, K, R, S, P, Q, stride, pad}, x, w, y);
    implicit_gemm(pass);
}

// grid.z = stride² phases; grid.x covers the largest phase
template <class Cfg>
__global__ void __launch_bounds__(CONV_THREADS, CONV_BLOCKS_PER_SM)
    conv_dgrad(const Data<Cfg>* dy, const Data<Cfg>* w, Data<Cfg>* dx, CONV_GEOMETRY) {
    DgradPass<Cfg> pass(Conv{N, H, W, C, K, R, S, P, Q, stride, pad}, dy, w, dx);
    if (pass.m0 >= pass.rows) return;  // the whole block: a smaller phase
    implicit_gemm(pass);
}

// grid.z = splits; out holds gridDim.z partial K×RSC results (just dW when there is one split)
template <class Cfg>
__global__ void __launch_bounds__(CONV_THREADS, CONV_BLOCKS_PER_SM)
    conv_wgrad(const Data<Cfg>* x, const Data<Cfg>* dy, float* out, CONV_GEOMETRY) {
    WgradPass<Cfg> pass(Conv{N, H, W, C, K, R, S, P, Q, stride, pad}, x, dy, out);
    implicit_gemm(pass);
}

// out[i] = Σ_z partial[z][i], z in order
__global__ void __launch_bounds__(SPLITK_THREADS) splitk_reduce(const float* partial, float* out, int count, int splits) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int z = 0; z < splits; ++z) sum += partial[(long long)z * count + i];
        out[i] = sum;
    }
}
