// Batch normalization over the N·H·W rows of an NHWC tensor, seen as a (rows, C) matrix, with
// the fused variants of ResNet's bottleneck: BN+ReLU and BN+add+ReLU, forward and backward.
//
// Reference: minidl/ops/norm.py (torch's conventions: biased batch variance to normalize,
// unbiased for the running variance, running = (1 − momentum)·running + momentum·batch).
//
// Every pass is "per channel over all rows", so all kernels share one grid: blockIdx.x picks
// 32 channels (threadIdx.x, so a warp reads one contiguous run of a row), blockIdx.y a slab of
// `rows_per_block` rows, and the 8 threadIdx.y lanes of a block take every 8th row of the slab,
// BN_UNROLL rows in flight per thread. Per-slab partial results go to a small workspace and a
// finalize kernel combines the slabs: 32 channels per block again, its FINALIZE_LANES lanes
// each taking every FINALIZE_LANES-th slab, then the lanes in order in shared memory (a single
// thread per channel walking hundreds of slabs was latency-bound: 0.25 ms for C = 64 on an
// H200, more than the statistics pass itself). Deterministic, no atomics.
//
// Forward, training:  bn_stats      Welford (count, mean, M2) per thread, merged with Chan's
//                                   formula across lanes, then across slabs: no cancellation
//                                   even where |mean| ≫ std
//                     bn_finalize   mean, 1/std, running statistics, scale = γ/std,
//                                   shift = β − mean·scale
//                     bn_apply      y = act(x·scale + shift [+ residual]), act = ReLU or none
// Forward, eval:      bn_finalize with no slabs (running statistics), then bn_apply.
// Fused with the convolutions (kernels/conv_v2_norm.cuh; minidl/kernels/normconv.py): the
// slabs come from a convolution's epilogue, per statistics group (consecutive images), and
//                     bn_moments    each group's mean and biased variance (G, 2, C)
//                     bn_affine     from them (or the running statistics), per group the
//                                   [NORM_ROWS][C] rows scale, shift, mean, 1/std that the
//                                   convolutions read; the running statistics updated group
//                                   after group
//                     bn_backward_finalize over G groups of slabs: dγ, dβ summed over the
//                                   groups, k1 and k0 per group
//                     bn_apply      with a residual that is itself normalized (a projection)
// Backward:           bn_backward_reduce    g = dy·[y > 0] (fused ReLU: y is the block's output)
//                                           or dy; per channel Σ g and Σ g·(x − mean)
//                     bn_backward_finalize  dβ = Σ g, dγ = Σ g·(x − mean)/std, and the
//                                           coefficients of dx = g·scale + (x − mean)·k1 + k0
//                                           (training: k1 = −scale·dγ/(std·M), k0 = −scale·dβ/M;
//                                           eval: k1 = k0 = 0)
//                     bn_backward_apply     dx, and d_residual = g for BN+add+ReLU
//
// Storage type T: float or __nv_bfloat16 for x, y, dy, dx, residual; statistics, γ, β and all
// arithmetic are fp32. Shapes: any rows and C (ResNet-50: C from 64 to 2048, rows = N·H·W from
// N·49 to N·12544).
//
// The block shapes (BN_CHANNELS, BN_ROW_LANES, FINALIZE_LANES) come from minidl/kernels/batchnorm.py
// as -D options.
#include <cuda_bf16.h>

#if !defined(BN_CHANNELS) || !defined(BN_ROW_LANES) || !defined(FINALIZE_LANES) || !defined(NORM_ROWS)
#error "compile with the options of minidl/kernels/batchnorm.py (BN_CHANNELS, BN_ROW_LANES, FINALIZE_LANES, NORM_*)"
#endif
constexpr int BN_THREADS = BN_CHANNELS * BN_ROW_LANES;
constexpr int BN_UNROLL = 4;
constexpr int BN_FINALIZE_THREADS = BN_CHANNELS * FINALIZE_LANES;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store_as(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_as(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

struct Welford {
    float count, mean, m2;
    __device__ void add(float x) {
        count += 1.0f;
        float delta = x - mean;
        mean += delta / count;
        m2 += delta * (x - mean);
    }
    __device__ void merge(const Welford& other) {  // Chan et al.; an empty side changes nothing
        float total = count + other.count;
        if (total == 0.0f) return;
        float delta = other.mean - mean;
        mean += delta * (other.count / total);
        m2 += other.m2 + delta * delta * (count * other.count / total);
        count = total;
    }
};

// This thread's channel and rows: row = first, first + step, ... < end.
struct Slab {
    int c, first, end;
    static constexpr int step = BN_ROW_LANES;
    __device__ Slab(int rows, int rows_per_block) {
        c = blockIdx.x * BN_CHANNELS + threadIdx.x;
        int begin = blockIdx.y * rows_per_block;
        first = begin + threadIdx.y;
        end = min(rows, begin + rows_per_block);
    }
};

// Visit the rows of this thread's slab, BN_UNROLL loads in flight: f(row).
template <typename F>
__device__ __forceinline__ void for_rows(const Slab& slab, F f) {
    for (int row = slab.first; row < slab.end; row += Slab::step * BN_UNROLL)
#pragma unroll
        for (int u = 0; u < BN_UNROLL; ++u)
            if (row + u * Slab::step < slab.end) f(row + u * Slab::step);
}

template <typename T>
__global__ void __launch_bounds__(BN_THREADS) bn_stats(const T* x, int rows, int C, int rows_per_block,
                                                       float* partial) {
    __shared__ Welford lanes[BN_ROW_LANES][BN_CHANNELS];
    Slab slab(rows, rows_per_block);
    Welford acc{0.0f, 0.0f, 0.0f};
    if (slab.c < C) {
        for (int row = slab.first; row < slab.end; row += Slab::step * BN_UNROLL) {
            float v[BN_UNROLL];  // all loads first: BN_UNROLL requests in flight
#pragma unroll
            for (int u = 0; u < BN_UNROLL; ++u) {
                int r = row + u * Slab::step;
                v[u] = r < slab.end ? to_float(x[(long long)r * C + slab.c]) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < BN_UNROLL; ++u)
                if (row + u * Slab::step < slab.end) acc.add(v[u]);
        }
    }
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && slab.c < C) {
        Welford total = lanes[0][threadIdx.x];
        for (int lane = 1; lane < BN_ROW_LANES; ++lane) total.merge(lanes[lane][threadIdx.x]);
        float* out = partial + (long long)blockIdx.y * 3 * C + slab.c;  // [slab][count|mean|m2][C]
        out[0] = total.count, out[C] = total.mean, out[2 * C] = total.m2;
    }
}

// Channel c's Welford partials of `slabs` slabs [slab][count | mean | M2][C], merged in a fixed
// order: FINALIZE_LANES lanes each take every FINALIZE_LANES-th slab, then lane 0
// (threadIdx.y == 0) merges the lanes in order and has the result. Every thread of the block calls it.
__device__ Welford merge_slab_moments(const float* partial, int slabs, int C, int c) {
    __shared__ Welford lanes[FINALIZE_LANES][BN_CHANNELS];
    Welford acc{0.0f, 0.0f, 0.0f};
    if (c < C)
        for (int s = threadIdx.y; s < slabs; s += FINALIZE_LANES) {
            const float* p = partial + (long long)s * 3 * C + c;
            acc.merge(Welford{p[0], p[C], p[2 * C]});
        }
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0)
        for (int lane = 1; lane < FINALIZE_LANES; ++lane) acc.merge(lanes[lane][threadIdx.x]);
    __syncthreads();  // the lanes are free for the next call
    return acc;
}

// running = (1 − momentum)·running + momentum·batch, the variance unbiased by rows/(rows − 1)
__device__ __forceinline__ void update_running(int c, float mean, float var, int rows, float momentum,
                                               float* running_mean, float* running_var) {
    float unbiased = var * (float(rows) / float(max(rows - 1, 1)));
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean;
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
}

// What normalizing channel c with (mean, var) takes: 1/std, scale = γ/std, shift = β − mean·scale
struct Affine {
    float inv_std, scale, shift;
    __device__ Affine(int c, float mean, float var, const float* gamma, const float* beta, float eps)
        : inv_std(1.0f / sqrtf(var + eps)), scale(gamma[c] * inv_std), shift(beta[c] - mean * scale) {}
};

// slabs > 0: batch statistics from bn_stats' partials (+ running-statistics update when
// running_mean is not null); slabs == 0: the running statistics themselves (eval).
__global__ void __launch_bounds__(BN_FINALIZE_THREADS) bn_finalize(const float* partial, int slabs, int C, int rows,
                                                                   const float* gamma, const float* beta, float eps,
                                                                   float momentum, float* running_mean,
                                                                   float* running_var, float* mean_out,
                                                                   float* inv_std_out, float* scale_out,
                                                                   float* shift_out) {
    int c = blockIdx.x * BN_CHANNELS + threadIdx.x;
    Welford acc = merge_slab_moments(partial, slabs, C, c);
    if (threadIdx.y != 0 || c >= C) return;
    float mean, var;
    if (slabs > 0) {
        mean = acc.mean;
        var = acc.m2 / rows;
        if (running_mean) update_running(c, mean, var, rows, momentum, running_mean, running_var);
    } else {
        mean = running_mean[c];
        var = running_var[c];
    }
    Affine affine(c, mean, var, gamma, beta, eps);
    mean_out[c] = mean;
    inv_std_out[c] = affine.inv_std;
    scale_out[c] = affine.scale;
    shift_out[c] = affine.shift;
}

// grid (channel blocks, groups): group g's slabs are partial[g·slabs .. (g + 1)·slabs − 1];
// stats[g] = (mean, biased variance) of its `rows` rows
__global__ void __launch_bounds__(BN_FINALIZE_THREADS) bn_moments(const float* partial, int slabs, int C, int rows,
                                                                  float* stats) {
    int c = blockIdx.x * BN_CHANNELS + threadIdx.x, g = blockIdx.y;
    Welford acc = merge_slab_moments(partial + (long long)g * slabs * 3 * C, slabs, C, c);
    if (threadIdx.y != 0 || c >= C) return;
    stats[(2LL * g) * C + c] = acc.mean;
    stats[(2LL * g + 1) * C + c] = acc.m2 / rows;
}

// norm[g] = [scale | shift | mean | 1/std][C] of each group's (mean, biased variance) in `stats`
// (G, 2, C), the running statistics updated group after group when running_mean is not null;
// groups == 0: norm[0] from the running statistics (eval). A thread per channel.
__global__ void __launch_bounds__(BN_THREADS) bn_affine(const float* stats, int groups, int C, int rows,
                                                        const float* gamma, const float* beta, float eps,
                                                        float momentum, float* running_mean, float* running_var,
                                                        float* norm) {
    int c = blockIdx.x * BN_THREADS + threadIdx.x;
    if (c >= C) return;
    for (int g = 0; g < max(groups, 1); ++g) {
        float mean = groups ? stats[(2LL * g) * C + c] : running_mean[c];
        float var = groups ? stats[(2LL * g + 1) * C + c] : running_var[c];
        if (groups && running_mean) update_running(c, mean, var, rows, momentum, running_mean, running_var);
        Affine affine(c, mean, var, gamma, beta, eps);
        float* out = norm + (long long)g * NORM_ROWS * C + c;
        out[NORM_SCALE * C] = affine.scale;
        out[NORM_SHIFT * C] = affine.shift;
        out[NORM_MEAN * C] = mean;
        out[NORM_INV_STD * C] = affine.inv_std;
    }
}

// y = x·scale + shift (+ residual when not null, itself normalized by residual_scale and
// residual_shift when those are not null), then ReLU when relu != 0
template <typename T>
__global__ void __launch_bounds__(BN_THREADS) bn_apply(const T* x, const T* residual, const float* residual_scale,
                                                       const float* residual_shift, const float* scale,
                                                       const float* shift, T* y, int rows, int C, int rows_per_block,
                                                       int relu) {
    Slab slab(rows, rows_per_block);
    if (slab.c >= C) return;
    float a = scale[slab.c], b = shift[slab.c];
    float ra = residual_scale ? residual_scale[slab.c] : 1.0f, rb = residual_shift ? residual_shift[slab.c] : 0.0f;
    for_rows(slab, [&](int row) {
        long long i = (long long)row * C + slab.c;
        float v = to_float(x[i]) * a + b;
        if (residual) v += to_float(residual[i]) * ra + rb;
        if (relu) v = fmaxf(v, 0.0f);
        store_as(y + i, v);
    });
}

// the gradient reaching the BN output: dy, masked by the fused ReLU's output when y is not null
template <typename T>
__device__ __forceinline__ float bn_output_grad(const T* dy, const T* y, long long i) {
    float g = to_float(dy[i]);
    return y && !(to_float(y[i]) > 0.0f) ? 0.0f : g;
}

template <typename T>
__global__ void __launch_bounds__(BN_THREADS) bn_backward_reduce(const T* dy, const T* x, const T* y,
                                                                 const float* mean, int rows, int C,
                                                                 int rows_per_block, float* partial) {
    __shared__ float sums[2][BN_ROW_LANES][BN_CHANNELS];
    Slab slab(rows, rows_per_block);
    float sum_g = 0.0f, sum_gx = 0.0f;
    if (slab.c < C) {
        float m = mean[slab.c];
        for_rows(slab, [&](int row) {
            long long i = (long long)row * C + slab.c;
            float g = bn_output_grad(dy, y, i);
            sum_g += g;
            sum_gx += g * (to_float(x[i]) - m);
        });
    }
    sums[0][threadIdx.y][threadIdx.x] = sum_g;
    sums[1][threadIdx.y][threadIdx.x] = sum_gx;
    __syncthreads();
    if (threadIdx.y == 0 && slab.c < C) {
        for (int lane = 1; lane < BN_ROW_LANES; ++lane) {
            sum_g += sums[0][lane][threadIdx.x];
            sum_gx += sums[1][lane][threadIdx.x];
        }
        float* out = partial + (long long)blockIdx.y * 2 * C + slab.c;  // [slab][Σg|Σg(x−mean)][C]
        out[0] = sum_g, out[C] = sum_gx;
    }
}

// `groups` groups of `slabs` slabs each ([group][slab][Σg | Σg(x − mean)][C]), group g of `rows`
// rows normalized by norm[g] ([group][NORM_ROWS][C]): dγ and dβ summed over the groups in order,
// and per group k1[g], k0[g] ([group][C]) of dx = g·scale + (x − mean)·k1 + k0
__global__ void __launch_bounds__(BN_FINALIZE_THREADS) bn_backward_finalize(const float* partial, int slabs, int groups,
                                                                            int C, int rows, const float* norm,
                                                                            int training, float* grad_gamma,
                                                                            float* grad_beta, float* k1, float* k0) {
    __shared__ float sums[2][FINALIZE_LANES][BN_CHANNELS];
    int c = blockIdx.x * BN_CHANNELS + threadIdx.x;
    float dgamma_total = 0.0f, dbeta_total = 0.0f;
    for (int g = 0; g < groups; ++g) {
        const float* group = partial + (long long)g * slabs * 2 * C;
        float sum_g = 0.0f, sum_gx = 0.0f;
        if (c < C)
            for (int s = threadIdx.y; s < slabs; s += FINALIZE_LANES) {
                sum_g += group[(long long)s * 2 * C + c];
                sum_gx += group[(long long)s * 2 * C + C + c];
            }
        sums[0][threadIdx.y][threadIdx.x] = sum_g;
        sums[1][threadIdx.y][threadIdx.x] = sum_gx;
        __syncthreads();
        if (threadIdx.y == 0 && c < C) {
            for (int lane = 1; lane < FINALIZE_LANES; ++lane) {
                sum_g += sums[0][lane][threadIdx.x];
                sum_gx += sums[1][lane][threadIdx.x];
            }
            const float* group_norm = norm + (long long)g * NORM_ROWS * C + c;
            float inv_std = group_norm[NORM_INV_STD * C], scale = group_norm[NORM_SCALE * C];
            float dgamma = sum_gx * inv_std;
            dgamma_total += dgamma;
            dbeta_total += sum_g;
            k1[(long long)g * C + c] = training ? -scale * inv_std * dgamma / rows : 0.0f;
            k0[(long long)g * C + c] = training ? -scale * sum_g / rows : 0.0f;
        }
        __syncthreads();  // the lanes are free for the next group
    }
    if (threadIdx.y == 0 && c < C) grad_gamma[c] = dgamma_total, grad_beta[c] = dbeta_total;
}

template <typename T>
__global__ void __launch_bounds__(BN_THREADS) bn_backward_apply(const T* dy, const T* x, const T* y, const float* mean,
                                                                const float* scale, const float* k1, const float* k0,
                                                                T* dx, T* d_residual, int rows, int C,
                                                                int rows_per_block) {
    Slab slab(rows, rows_per_block);
    if (slab.c >= C) return;
    float m = mean[slab.c], a = scale[slab.c], b1 = k1[slab.c], b0 = k0[slab.c];
    for_rows(slab, [&](int row) {
        long long i = (long long)row * C + slab.c;
        float g = bn_output_grad(dy, y, i);
        store_as(dx + i, g * a + (to_float(x[i]) - m) * b1 + b0);
        if (d_residual) store_as(d_residual + i, g);
    });
}
