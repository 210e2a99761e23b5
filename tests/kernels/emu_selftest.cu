// Kernels that exercise the CPU emulator itself (tests/kernels/test_emulator.py): each uses one
// CUDA feature the real kernels rely on, with a result NumPy can predict. nvcc compiles this file
// too (tests/kernels/test_nvcc.py), so the emulated semantics are those of valid CUDA.
#include <mma.h>

#ifndef DYNAMIC_SHARED_MEMORY
#define DYNAMIC_SHARED_MEMORY(type, name) extern __shared__ __align__(16) unsigned char name##_bytes[]; \
    type* name = reinterpret_cast<type*>(name##_bytes)
#endif

constexpr int SUM_THREADS = 96;  // three warps

__device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

// Per-block sums through shuffles and static shared memory; the grand total through an atomic.
__global__ void __launch_bounds__(SUM_THREADS) block_sum(const float* x, int n, float* block_sums, float* total) {
    __shared__ float warp_sums[SUM_THREADS / 32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = warp_sum(i < n ? x[i] : 0.0f);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < SUM_THREADS / 32; ++w) s += warp_sums[w];
        block_sums[blockIdx.x] = s;
        atomicAdd(total, s);
    }
}

// Reverse each block's slice through dynamic shared memory.
__global__ void reverse_blocks(const int* x, int* y) {
    DYNAMIC_SHARED_MEMORY(int, buffer);
    int base = blockIdx.x * blockDim.x;
    buffer[threadIdx.x] = x[base + threadIdx.x];
    __syncthreads();
    y[base + threadIdx.x] = buffer[blockDim.x - 1 - threadIdx.x];
}

// Threads past `active` return at once; the others still meet at __syncthreads.
__global__ void early_exit(const float* x, int active, float* y) {
    __shared__ float values[128];
    if (int(threadIdx.x) >= active) return;
    values[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = values[(threadIdx.x + 1) % active];
}

// Every shuffle flavour and a ballot, over a 2-D block (x fastest, as CUDA numbers lanes).
__global__ void shuffles(const int* x, int* out) {
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    int v = x[t];
    out[6 * t + 0] = __shfl_sync(0xffffffffu, v, 3);
    out[6 * t + 1] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[6 * t + 2] = __shfl_down_sync(0xffffffffu, v, 2);
    out[6 * t + 3] = __shfl_up_sync(0xffffffffu, v, 1);
    out[6 * t + 4] = __shfl_sync(0xffffffffu, v, 1, 8);
    out[6 * t + 5] = int(__ballot_sync(0xffffffffu, v % 2));
}

// One warp: D = A(16x8, row-major) * B(8x16, col-major) on TF32 tensor cores.
__global__ void wmma_tf32(const float* a, const float* b, float* d, int round_inputs) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, a, 8);
    wmma::load_matrix_sync(fb, b, 8);
    if (round_inputs) {
        for (int i = 0; i < fa.num_elements; ++i) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
        for (int i = 0; i < fb.num_elements; ++i) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
    }
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

// A WMMA load from an address that is not 256-bit aligned: the hardware's rule, checked.
__global__ void wmma_misaligned(const float* a, float* d) {
    using namespace nvcuda;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::load_matrix_sync(acc, a + 1, 16, wmma::mem_row_major);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}
