// The elementwise kernels of the bf16 compute path (--amp, minidl/amp.py's policy): float32 to
// bf16 and back, and the sum of two bf16 gradients.
//
// Reference: tests/kernels (a NumPy round-to-nearest-even and torch's bfloat16 conversion).
//
// bf16 data are raw bits in uint16 arrays on the Python side (NumPy and CuPy have no bfloat16)
// and __nv_bfloat16 here. float → bf16 rounds to nearest, ties to even (NaN stays NaN, ±inf and
// values beyond the largest bf16 become ±inf); bf16 → float is exact. The sum of two gradients
// is formed in fp32 and rounded once, the same as rounding the exact sum.
//
// One element per thread and step of a grid-stride loop, consecutive threads on consecutive
// elements: every access of a warp is one contiguous run. Bound by memory bandwidth.
// Shapes: any element count (64-bit).
#include <cuda_bf16.h>

// AMP_THREADS comes from minidl/kernels/amp.py as a -D option.
#ifndef AMP_THREADS
#error "compile with the options of minidl/kernels/amp.py (AMP_THREADS)"
#endif

// i = first, first + stride, ... < n over the whole grid
#define FOR_EACH_ELEMENT(i, n)                                                                   \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
         i += (long long)gridDim.x * blockDim.x)

__global__ void __launch_bounds__(AMP_THREADS) float_to_bf16(const float* x, __nv_bfloat16* y, long long n) {
    FOR_EACH_ELEMENT(i, n) y[i] = __float2bfloat16(x[i]);
}

__global__ void __launch_bounds__(AMP_THREADS) bf16_to_float(const __nv_bfloat16* x, float* y, long long n) {
    FOR_EACH_ELEMENT(i, n) y[i] = __bfloat162float(x[i]);
}

__global__ void __launch_bounds__(AMP_THREADS) bf16_add(const __nv_bfloat16* a, const __nv_bfloat16* b,
                                                        __nv_bfloat16* y, long long n) {
    FOR_EACH_ELEMENT(i, n) y[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}
