// Convolution of NHWC activations with KRSC weights, the naive way: the first rung of the
// v0 → v1 → v2 ladder (docs/kernels.md). Reference: minidl/ops/conv.py; its loop-level
// definition: minidl/ops/conv_loops.py, which these three kernels follow line for line.
//
// One thread per output element, no shared memory, no tiling, fp32 data and arithmetic:
//   conv_v0_fwd    y[n,p,q,k]   = Σ_{r,s,c}   x[n, p·stride + r − pad, q·stride + s − pad, c] · w[k,r,s,c]
//   conv_v0_dgrad  dx[n,h,w,c]  = Σ_{k,r,s}   dy[n, p, q, k] · w[k,r,s,c]
//                                 over the (p, q) with h = p·stride + r − pad, w = q·stride + s − pad
//   conv_v0_wgrad  dw[k,r,s,c]  = Σ_{n,p,q}   dy[n,p,q,k] · x[n, p·stride + r − pad, q·stride + s − pad, c]
// Each thread reads every operand it needs straight from global memory: neighbouring threads
// (neighbouring k, or c) read neighbouring addresses of one operand and the same address of the
// other, and nothing read is reused from a faster memory. That is what v1 adds (kernels/conv.cu:
// tiles in shared memory, a block's threads sharing each load, tensor cores); v0 is for reading
// and for measuring the distance, and the autotuner never offers it (minidl/kernels/conv_v0.py).
//
// Shapes: any N, H, W, C, K, R, S, stride, padding whose element counts fit an int.

#if !defined(CONV_V0_THREADS)
#error "compile with the options of minidl/kernels/conv_v0.py (CONV_V0_THREADS)"
#endif

// The arguments every pass takes, in conv_geometry's order (minidl/kernels/conv.py).
#define CONV_V0_GEOMETRY int N, int H, int W, int C, int K, int R, int S, int P, int Q, int stride, int pad

extern "C" __global__ void __launch_bounds__(CONV_V0_THREADS)
conv_v0_fwd(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, CONV_V0_GEOMETRY) {
    int index = blockIdx.x * blockDim.x + threadIdx.x;  // of y, (n, p, q, k) with k fastest
    if (index >= N * P * Q * K) return;
    int k = index % K, q = index / K % Q, p = index / (K * Q) % P, n = index / (K * Q * P);
    float sum = 0.0f;
    for (int r = 0; r < R; ++r) {
        int h = p * stride + r - pad;
        if (h < 0 || h >= H) continue;  // the zero padding adds nothing
        for (int s = 0; s < S; ++s) {
            int col = q * stride + s - pad;
            if (col < 0 || col >= W) continue;
            for (int c = 0; c < C; ++c)
                sum += x[((n * H + h) * W + col) * C + c] * w[((k * R + r) * S + s) * C + c];
        }
    }
    y[index] = sum;
}

extern "C" __global__ void __launch_bounds__(CONV_V0_THREADS)
conv_v0_dgrad(const float* __restrict__ dy, const float* __restrict__ w, float* __restrict__ dx, CONV_V0_GEOMETRY) {
    int index = blockIdx.x * blockDim.x + threadIdx.x;  // of dx, (n, h, w, c) with c fastest
    if (index >= N * H * W * C) return;
    int c = index % C, col = index / C % W, h = index / (C * W) % H, n = index / (C * W * H);
    float sum = 0.0f;
    for (int r = 0; r < R; ++r) {
        int p_strided = h + pad - r;  // = p · stride for the output row p that tap r reads h from
        if (p_strided < 0 || p_strided % stride != 0 || p_strided / stride >= P) continue;
        int p = p_strided / stride;
        for (int s = 0; s < S; ++s) {
            int q_strided = col + pad - s;
            if (q_strided < 0 || q_strided % stride != 0 || q_strided / stride >= Q) continue;
            int q = q_strided / stride;
            for (int k = 0; k < K; ++k)
                sum += dy[((n * P + p) * Q + q) * K + k] * w[((k * R + r) * S + s) * C + c];
        }
    }
    dx[index] = sum;
}

extern "C" __global__ void __launch_bounds__(CONV_V0_THREADS)
conv_v0_wgrad(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ dw, CONV_V0_GEOMETRY) {
    int index = blockIdx.x * blockDim.x + threadIdx.x;  // of dw, (k, r, s, c) with c fastest
    if (index >= K * R * S * C) return;
    int c = index % C, s = index / C % S, r = index / (C * S) % R, k = index / (C * S * R);
    float sum = 0.0f;
    for (int n = 0; n < N; ++n)
        for (int p = 0; p < P; ++p) {
            int h = p * stride + r - pad;
            if (h < 0 || h >= H) continue;
            for (int q = 0; q < Q; ++q) {
                int col = q * stride + s - pad;
                if (col < 0 || col >= W) continue;
                sum += dy[((n * P + p) * Q + q) * K + k] * x[((n * H + h) * W + col) * C + c];
            }
        }
    dw[index] = sum;
}
