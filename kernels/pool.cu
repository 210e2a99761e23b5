// Max pooling and global average pooling over NHWC tensors, forward and backward.
//
// Reference: minidl/ops/pool.py. One thread per output element, consecutive threads on
// consecutive channels, so every load and store of a warp is one contiguous run.
//
// Max pool forward keeps the FIRST maximum of each window in (r, s) order (a strict `>`), as
// the reference and torch do, and records its position r·KS + s in `argmax` (one byte). The
// backward pass runs one thread per INPUT element, which visits the few windows that contain it
// (at most ⌈KS/stride⌉² of them) in a fixed order and adds the gradient of those whose argmax
// is this element: no atomics, the same sums on every run.
//
// Global average pool: forward sums H·W values per (n, c); backward spreads gy/(H·W).
//
// Shapes: any N, H, W, C, window KS ≤ 15 (the argmax byte), stride, padding < KS. The
// ResNet stem's 3×3 stride-2 pool with padding 1 and the 7×7 final average pool are the
// cases that matter.

// POOL_THREADS comes from minidl/kernels/pool.py as a -D option.
#ifndef POOL_THREADS
#error "compile with the options of minidl/kernels/pool.py (POOL_THREADS)"
#endif
constexpr unsigned char NO_ARGMAX = 255;  // a window entirely in the padding

__global__ void __launch_bounds__(POOL_THREADS) max_pool_forward(const float* x, float* y, unsigned char* argmax,
                                                                 int N, int H, int W, int C, int P, int Q, int KS,
                                                                 int stride, int pad) {
    int total = N * P * Q * C;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int c = i % C, q = i / C % Q, p = i / (C * Q) % P, n = i / (C * Q * P);
        float best = -__int_as_float(0x7f800000);
        unsigned char where = NO_ARGMAX;
        for (int r = 0; r < KS; ++r) {
            int h = p * stride - pad + r;
            if (h < 0 || h >= H) continue;
            for (int s = 0; s < KS; ++s) {
                int w = q * stride - pad + s;
                if (w < 0 || w >= W) continue;
                float v = x[((n * H + h) * W + w) * C + c];
                if (v > best || where == NO_ARGMAX) best = v, where = (unsigned char)(r * KS + s);
            }
        }
        y[i] = best;
        argmax[i] = where;
    }
}

__global__ void __launch_bounds__(POOL_THREADS) max_pool_backward(const float* gy, const unsigned char* argmax,
                                                                  float* gx, int N, int H, int W, int C, int P,
                                                                  int Q, int KS, int stride, int pad) {
    int total = N * H * W * C;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int c = i % C, w = i / C % W, h = i / (C * W) % H, n = i / (C * W * H);
        // windows p with p·stride − pad ≤ h ≤ p·stride − pad + KS − 1
        int p_first = max(0, (h + pad - KS + stride) / stride), p_last = min(P - 1, (h + pad) / stride);
        int q_first = max(0, (w + pad - KS + stride) / stride), q_last = min(Q - 1, (w + pad) / stride);
        float sum = 0.0f;
        for (int p = p_first; p <= p_last; ++p)
            for (int q = q_first; q <= q_last; ++q) {
                int o = ((n * P + p) * Q + q) * C + c;
                int position = (h + pad - p * stride) * KS + (w + pad - q * stride);
                if (argmax[o] == position) sum += gy[o];
            }
        gx[i] = sum;
    }
}

__global__ void __launch_bounds__(POOL_THREADS) global_avg_pool_forward(const float* x, float* y, int N, int HW,
                                                                        int C) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N * C; i += gridDim.x * blockDim.x) {
        int n = i / C, c = i % C;
        const float* column = x + (long long)n * HW * C + c;
        float sum = 0.0f;
        for (int j = 0; j < HW; ++j) sum += column[(long long)j * C];
        y[i] = sum / HW;
    }
}

__global__ void __launch_bounds__(POOL_THREADS) global_avg_pool_backward(const float* gy, float* gx, int N, int HW,
                                                                         int C) {
    long long total = (long long)N * HW * C;
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int c = int(i % C);
        long long n = i / ((long long)HW * C);
        gx[i] = gy[n * C + c] / HW;  // the reference divides gy by H·W once per (n, c): the same value
    }
}
