// Softmax cross-entropy with label smoothing, forward and backward in one pass over the logits.
//
// Reference: minidl/ops/loss.py. For a row z of K logits with label y and smoothing ε:
//
//     log p_k = z_k − max(z) − log Σ_j exp(z_j − max(z))          (shifted: never overflows)
//     loss    = (1 − ε)·(−log p_y) + ε·(−mean_k log p_k)
//     dz_k    = (p_k − ε/K − (1 − ε)·[k = y]) · inv_n              (inv_n = 1/N, the batch mean)
//
// One block per row: the threads stride over the K classes, and three block-wide reductions
// (max, Σ exp, Σ z) go through warp shuffles and one shared slot per warp. The gradient for
// an upstream gradient of 1 is written in the same pass; backward only scales it.
//
// Shapes: any N (grid = N blocks) and K (ImageNet's 1000, CIFAR's 10); labels are int64.

// XENT_THREADS comes from minidl/kernels/softmax_xent.py as a -D option.
#ifndef XENT_THREADS
#error "compile with the options of minidl/kernels/softmax_xent.py (XENT_THREADS)"
#endif
constexpr int XENT_WARPS = XENT_THREADS / 32;

template <typename Op>
__device__ float block_reduce(float v, Op op, float* slots) {
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    __syncthreads();  // the slots may still be read from the previous reduction
    if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = v;
    __syncthreads();
    v = slots[0];
    for (int w = 1; w < XENT_WARPS; ++w) v = op(v, slots[w]);  // the same order in every thread
    return v;
}

struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
    __device__ float operator()(float a, float b) const { return a + b; }
};

__global__ void __launch_bounds__(XENT_THREADS) softmax_xent(const float* logits, const long long* labels, int K,
                                                             float smoothing, float inv_n, float* row_loss,
                                                             float* grad) {
    __shared__ float slots[XENT_WARPS];
    const float* z = logits + (long long)blockIdx.x * K;
    float* dz = grad + (long long)blockIdx.x * K;

    float top = -__int_as_float(0x7f800000);  // −inf
    for (int k = threadIdx.x; k < K; k += XENT_THREADS) top = fmaxf(top, z[k]);
    top = block_reduce(top, Max(), slots);

    float exp_sum = 0.0f, shifted_sum = 0.0f;
    for (int k = threadIdx.x; k < K; k += XENT_THREADS) {
        exp_sum += expf(z[k] - top);
        shifted_sum += z[k] - top;
    }
    float log_sum = logf(block_reduce(exp_sum, Sum(), slots));
    shifted_sum = block_reduce(shifted_sum, Sum(), slots);

    int label = int(labels[blockIdx.x]);
    if (threadIdx.x == 0) {
        float nll = log_sum - (z[label] - top);
        float smooth = log_sum - shifted_sum / K;
        row_loss[blockIdx.x] = (1.0f - smoothing) * nll + smoothing * smooth;
    }
    float off_target = smoothing / K;
    for (int k = threadIdx.x; k < K; k += XENT_THREADS) {
        float p = expf(z[k] - top - log_sum);
        dz[k] = (p - off_target - (k == label ? 1.0f - smoothing : 0.0f)) * inv_n;
    }
}
