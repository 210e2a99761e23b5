// The fused SGD-momentum update over the whole model's flat buffers, in one pass.
//
// Reference: minidl/ops/sgd.py (sgd_momentum_update). With s = grad_scale, λ the per-element
// weight-decay rate (decay == nullptr: none), m = momentum, η = lr:
//
//     d = s·g + λ·w          weight decay is part of the gradient
//     u = m·u + d
//     w = w − η·u            nesterov: w = w − η·(d + m·u)
//
// or, with rate_inside (Caffe2's form, the rate carried by the velocity, c = velocity_scale
// the momentum correction η_new/η_old):
//
//     u = (c·u)·m + η·d
//     w = w − u
//
// Each of w, g, u, λ is read once and w, u written once: the update is bound by memory
// bandwidth, so threads move four elements at a time (float4) when the buffers allow
// (VECTOR = 4: n a multiple of 4 and every pointer 16-byte aligned, as the flat buffers are);
// VECTOR = 1 is the general case. Every operation is an explicit IEEE single-precision
// one (__fmul_rn, __fadd_rn): nothing is contracted into an FMA, and the result equals
// NumPy's float32 reference bit for bit on normal numbers (CuPy compiles with -ftz=true:
// subnormal inputs and results are flushed to zero, as the CPU emulator does too).
//
// In a CUDA graph (minidl/training/graph.py) the launch arguments are frozen at capture, yet the rate
// changes every step: sgd_momentum_scalars reads lr, grad_scale and velocity_scale from device
// memory when it runs, and sgd_store_scalars, launched before each replay, puts them there.
//
// Shapes: any n (a grid-stride loop covers the buffer whatever the grid).

// SGD_THREADS comes from minidl/kernels/sgd.py as a -D option.
#ifndef SGD_THREADS
#error "compile with the options of minidl/kernels/sgd.py (SGD_THREADS)"
#endif

// VECTOR consecutive floats, loaded and stored as one access
template <int VECTOR> struct Pack;
template <> struct Pack<1> {
    float v[1];
    __device__ void load(const float* p, int i) { v[0] = p[i]; }
    __device__ void store(float* p, int i) const { p[i] = v[0]; }
};
template <> struct Pack<4> {
    float v[4];
    __device__ void load(const float* p, int i) {
        float4 f = reinterpret_cast<const float4*>(p)[i];
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    }
    __device__ void store(float* p, int i) const {
        reinterpret_cast<float4*>(p)[i] = make_float4(v[0], v[1], v[2], v[3]);
    }
};

template <int VECTOR>
__device__ __forceinline__ void sgd_update(float* w, const float* g, float* u, const float* decay, int n, float lr,
                                           float momentum, float grad_scale, int nesterov, int rate_inside,
                                           float velocity_scale) {
    int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n / VECTOR; i += stride) {
        Pack<VECTOR> wp, gp, up, lambda;
        wp.load(w, i), gp.load(g, i), up.load(u, i);
        if (decay) lambda.load(decay, i);
        for (int k = 0; k < VECTOR; ++k) {
            float d = __fmul_rn(gp.v[k], grad_scale);
            if (decay) d = __fadd_rn(d, __fmul_rn(lambda.v[k], wp.v[k]));
            float uk, step;
            if (rate_inside) {
                uk = __fadd_rn(__fmul_rn(__fmul_rn(up.v[k], velocity_scale), momentum), __fmul_rn(d, lr));
                step = uk;
            } else {
                uk = __fadd_rn(__fmul_rn(up.v[k], momentum), d);
                step = nesterov ? __fmul_rn(__fadd_rn(d, __fmul_rn(momentum, uk)), lr) : __fmul_rn(uk, lr);
            }
            wp.v[k] = __fsub_rn(wp.v[k], step);
            up.v[k] = uk;
        }
        wp.store(w, i), up.store(u, i);
    }
}

template <int VECTOR>
__global__ void __launch_bounds__(SGD_THREADS) sgd_momentum(float* w, const float* g, float* u, const float* decay,
                                                            int n, float lr, float momentum, float grad_scale,
                                                            int nesterov, int rate_inside, float velocity_scale) {
    sgd_update<VECTOR>(w, g, u, decay, n, lr, momentum, grad_scale, nesterov, rate_inside, velocity_scale);
}

// scalars = {lr, grad_scale, velocity_scale}, read when the kernel runs
template <int VECTOR>
__global__ void __launch_bounds__(SGD_THREADS) sgd_momentum_scalars(float* w, const float* g, float* u,
                                                                    const float* decay, int n, const float* scalars,
                                                                    float momentum, int nesterov, int rate_inside) {
    sgd_update<VECTOR>(w, g, u, decay, n, scalars[0], momentum, scalars[1], nesterov, rate_inside, scalars[2]);
}

__global__ void sgd_store_scalars(float* scalars, float lr, float grad_scale, float velocity_scale) {
    if (blockIdx.x == 0 && threadIdx.x == 0) scalars[0] = lr, scalars[1] = grad_scale, scalars[2] = velocity_scale;
}
