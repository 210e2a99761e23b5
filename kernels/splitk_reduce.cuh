// The sum of a split reduction (split-K): the v2 and v3 convolutions (kernels/conv_v2.cu,
// kernels/conv_v3.cu) write fp32 partial tiles over blockIdx.z and this kernel sums them, z in
// order, so the result does not depend on scheduling. Each family's module compiles its own
// copy; SPLITK_THREADS comes from minidl/kernels/conv_v2.py.
#pragma once

#include "convert.cuh"

#ifndef SPLITK_THREADS
#error "compile with the options of minidl/kernels/conv_v2.py (SPLITK_THREADS)"
#endif

// out[i] = Σ_z partial[z][i], z in order, rounded once to the output's type
template <typename T>
__global__ void __launch_bounds__(SPLITK_THREADS) splitk_reduce(const float* partial, T* out, long long count,
                                                                int splits) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int z = 0; z < splits; ++z) sum += partial[z * count + i];
        out[i] = from_float<T>(sum);
    }
}
