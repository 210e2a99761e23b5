// A float as a kernel's data type, rounded to nearest even where it is bf16: the v2 batch-norm
// fusion's tables (kernels/conv_v2_norm.cuh) and the split-K sum (kernels/splitk_reduce.cuh).
#pragma once

#include <cuda_bf16.h>

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
