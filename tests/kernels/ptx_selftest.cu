// Kernels that exercise the PTX wrappers of kernels/ptx.cuh, one warp each, with results NumPy
// predicts from the PTX ISA (tests/kernels/test_emulated_ptx.py); nvcc compiles them too
// (test_nvcc.py), and test_sass.py audits tile_gemm's main loop.
//
// Operands travel as 32-bit words: a bf16 pair (k, k+1) of a row is one word, a TF32 operand is
// one fp32 word. Then A (16 rows) and Bᵀ (8 rows, k contiguous: B column-major) hold 8 words per
// k-step of one mma in both types, and a lane's fragment registers are the same words for both.
#include "../../kernels/ptx.cuh"

#ifndef DYNAMIC_SHARED_MEMORY  // the CPU emulator defines its own
#define DYNAMIC_SHARED_MEMORY(type, name) extern __shared__ __align__(16) unsigned char name##_bytes[]; \
    type* name = reinterpret_cast<type*>(name##_bytes)
#endif

// ---- ldmatrix ---------------------------------------------------------------------------------
template <int MATRICES, bool TRANS>
__device__ void load_matrices(unsigned (&r)[MATRICES], SharedAddress row) {
    if constexpr (MATRICES == 1) {
        if constexpr (TRANS) ldmatrix_x1_trans(r, row); else ldmatrix_x1(r, row);
    } else if constexpr (MATRICES == 2) {
        if constexpr (TRANS) ldmatrix_x2_trans(r, row); else ldmatrix_x2(r, row);
    } else {
        if constexpr (TRANS) ldmatrix_x4_trans(r, row); else ldmatrix_x4(r, row);
    }
}

enum Misuse { NONE = 0, MISALIGNED_ROW = 1, LANE_EXITS = 2 };

// rows: 32 rows of 8 16-bit values, row 8i + j being row j of matrix i. Lane l stores row l at
// shared row slot_of_row[l] (any permutation), and gives that slot's address, so the rows of a
// matrix are not consecutive in memory. Lanes past the matrices give an unaligned address,
// which ldmatrix must ignore. out[MATRICES·l + i] = register i of lane l.
template <int MATRICES, bool TRANS>
__global__ void ldmatrix_rows(const unsigned* rows, const int* slot_of_row, int misuse, unsigned* out) {
    __shared__ __align__(16) unsigned smem[32][4];
    int lane = threadIdx.x % 32;
    for (int w = 0; w < 4; ++w) smem[slot_of_row[lane]][w] = rows[4 * lane + w];
    __syncwarp();
    SharedAddress row = shared_address(smem[slot_of_row[lane]]);
    if (lane >= 8 * MATRICES) row += 1;
    if (misuse == MISALIGNED_ROW && lane == 3) row += 4;
    if (misuse == LANE_EXITS && lane == 31) return;
    unsigned r[MATRICES];
    load_matrices<MATRICES, TRANS>(r, row);
    for (int i = 0; i < MATRICES; ++i) out[MATRICES * lane + i] = r[i];
}

// ---- mma fragments straight from global memory --------------------------------------------------
__device__ __forceinline__ void mma(bool bf16, float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                    const float (&c)[4]) {
    if (bf16) mma_bf16_m16n8k16(d, a, b, c); else mma_tf32_m16n8k8(d, a, b, c);
}

// D = A·B + C, A 16×8 words, Bᵀ 8×8 words, C and D 16×8 fp32 (row-major), each lane loading its
// fragments by the PTX ISA's mapping (g = lane/4, t = lane%4): register r of A is word
// (g + 8(r%2), t + 4(r/2)), register r of B word (g, t + 4r) of Bᵀ, accumulator j element
// (g + 8(j/2), 2t + j%2). -DPTX_SELFTEST_SWAP_A12 swaps A's registers 1 and 2: a wrong mapping
// the test must notice.
template <bool BF16>
__global__ void mma_fragments(const unsigned* a, const unsigned* b, const float* c, float* d) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    unsigned af[4], bf[2];
    float cf[4], df[4];
    for (int r = 0; r < 4; ++r) af[r] = a[(g + 8 * (r % 2)) * 8 + t + 4 * (r / 2)];
#ifdef PTX_SELFTEST_SWAP_A12
    unsigned swap = af[1];
    af[1] = af[2], af[2] = swap;
#endif
    for (int r = 0; r < 2; ++r) bf[r] = b[g * 8 + t + 4 * r];
    for (int j = 0; j < 4; ++j) cf[j] = c[(g + 8 * (j / 2)) * 8 + 2 * t + j % 2];
    mma(BF16, df, af, bf, cf);
    for (int j = 0; j < 4; ++j) d[(g + 8 * (j / 2)) * 8 + 2 * t + j % 2] = df[j];
}

// ---- a 16×8 tile through a cp.async pipeline, ldmatrix and mma, as a GEMM main loop -------------
constexpr int STAGES = 3;

// Where 16-byte chunk `chunk` (0 or 1) of row `row` of a k-tile (rows of 32 bytes) sits: the
// chunk index XOR bit 2 of the row, so that the 8 rows one ldmatrix reads (16 bytes each) fall
// in distinct banks.
__device__ __forceinline__ SharedAddress swizzled(unsigned* tile, int row, int chunk) {
    return shared_address(tile + row * 8 + 4 * (chunk ^ ((row >> 2) & 1)));
}

// D = A·B + C over k_words words per row (a multiple of 4; the last k-tile is zero-filled),
// one k-tile of 8 words per mma, STAGES k-tiles in flight. LATE_WAIT = 1 waits for one group
// too few: the k-tile is read before its copies land. TF32 operands are rounded (cvt.rna).
template <bool BF16, int LATE_WAIT>
__global__ void tile_gemm(const unsigned* a, const unsigned* b, const float* c, float* d, int k_words) {
    __shared__ __align__(128) unsigned stage_a[STAGES][16 * 8], stage_b[STAGES][8 * 8];
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int tiles = (k_words + 7) / 8;
    auto load = [&](int tile) {  // A: a chunk per lane; Bᵀ: lanes 0-15
        int word = tile * 8 + 4 * (lane % 2);
        bool inside = word < k_words;
        int row = lane / 2;
        cp_async_16(swizzled(stage_a[tile % STAGES], row, lane % 2), a + row * k_words + (inside ? word : 0), inside);
        if (lane < 16)
            cp_async_16(swizzled(stage_b[tile % STAGES], row, lane % 2), b + row * k_words + (inside ? word : 0), inside);
    };
    for (int tile = 0; tile < STAGES - 1; ++tile) {
        if (tile < tiles) load(tile);
        cp_async_commit();
    }
    float acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = c[(g + 8 * (j / 2)) * 8 + 2 * t + j % 2];
#pragma unroll 1
    for (int tile = 0; tile < tiles; ++tile) {
        cp_async_wait<STAGES - 2 + LATE_WAIT>();
        __syncthreads();  // every lane's copies of this k-tile landed; the k-tile before is consumed
        if (tile + STAGES - 1 < tiles) load(tile + STAGES - 1);
        cp_async_commit();
        // A: matrix i = lane/8 is rows 8(i%2).., chunk i/2; Bᵀ: matrix i = lane/8 % 2 is chunk i
        unsigned af[4], bf[2];
        ldmatrix_x4(af, swizzled(stage_a[tile % STAGES], lane % 8 + 8 * (lane / 8 % 2), lane / 16));
        ldmatrix_x2(bf, swizzled(stage_b[tile % STAGES], lane % 8, lane / 8 % 2));
        if (!BF16) {
            for (unsigned& r : af) r = tf32_bits(__uint_as_float(r));
            for (unsigned& r : bf) r = tf32_bits(__uint_as_float(r));
        }
        mma(BF16, acc, af, bf, acc);
    }
    for (int j = 0; j < 4; ++j) d[(g + 8 * (j / 2)) * 8 + 2 * t + j % 2] = acc[j];
}

// bits[i] = x[i] rounded to TF32 by cvt.rna
__global__ void round_tf32(const float* x, unsigned* bits, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) bits[i] = tf32_bits(x[i]);
}

// d[i] = fma.rn.relu.bf16x2(a[i], b[i], c[i])
__global__ void fma_relu_pairs(const unsigned* a, const unsigned* b, const unsigned* c, unsigned* d, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        d[i] = fma_relu_bf16x2(a[i], b[i], c[i]);
}

// q[i] = x[i] / divisor: one integer division by a runtime value, for the SASS audit to count
__global__ void quotients(const int* x, int divisor, int* q, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) q[i] = x[i] / divisor;
}

// out[t] = the word at byte `offset` + 4t of the dynamic shared memory (its `bytes` written
// first), read by ld.shared or (PLAIN) by C++: the emulator reports a read past the allocation,
// as the GPU faults
template <bool PLAIN>
__global__ void shared_words(int offset, int bytes, unsigned* out) {
    DYNAMIC_SHARED_MEMORY(unsigned, words);
    for (int i = threadIdx.x; i < bytes / 4; i += blockDim.x) words[i] = 3u * i;
    __syncthreads();
    int at = offset + 4 * int(threadIdx.x);
    out[threadIdx.x] = PLAIN ? words[at / 4] : lds_32(shared_address(words) + at);
}
