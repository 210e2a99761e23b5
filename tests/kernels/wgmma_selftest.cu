// Kernels that exercise the Hopper wrappers of kernels/wgmma.cuh (one warpgroup of 128 threads
// unless said otherwise), with results NumPy predicts from the PTX ISA
// (tests/kernels/test_emulated_wgmma.py); nvcc compiles them for sm_90a (the same test).
#include "../../kernels/wgmma.cuh"

#ifndef DYNAMIC_SHARED_MEMORY  // the CPU emulator defines its own
#define DYNAMIC_SHARED_MEMORY(type, name) extern __shared__ __align__(1024) unsigned char name##_bytes[]; \
    type* name = reinterpret_cast<type*>(name##_bytes)
#endif

// layout[]: A's start offset, leading and stride byte offsets and swizzle, then B's the same
enum Layout { A_START, A_LEADING, A_STRIDE, A_SWIZZLE, B_START, B_LEADING, B_STRIDE, B_SWIZZLE };

__device__ __forceinline__ uint64_t descriptor(SharedAddress base, const int* layout, int first) {
    return wgmma_descriptor(base + layout[first], layout[first + 1], layout[first + 2], Swizzle(layout[first + 3]));
}

// The dynamic shared memory gets `image` (`words` words), made visible to the async proxy
__device__ void stage_image(unsigned* smem, const unsigned* image, int words) {
    for (int i = threadIdx.x; i < words; i += blockDim.x) smem[i] = image[i];
    fence_proxy_async_shared();
    __syncthreads();
}

// d = c·[accumulate] + repeats·A·B by `repeats` chained wgmmas (the first one accumulating only if
// `accumulate`); c and d in fragment order (thread t's N/2 registers at t·N/2). RS: A from
// registers, loaded from a_words (read only then) (64 rows of 8 words, a word the bf16 pair k, k+1) by the ISA's
// fragment: register r = word (16w + lane/4 + 8(r%2), lane%4 + 4(r/2)).
template <int N, bool TRANS_A, bool TRANS_B, bool RS>
__global__ void wgmma_product(const unsigned* image, int words, const int* layout, const unsigned* a_words,
                              const float* c, int accumulate, int repeats, float* d) {
    DYNAMIC_SHARED_MEMORY(unsigned, smem);
    stage_image(smem, image, words);
    int t = threadIdx.x, lane = t % 32;
    WgmmaAccumulator<N> acc;
    for (int i = 0; i < N / 2; ++i) acc[i] = c[t * (N / 2) + i];
    unsigned a[4] = {};
    if constexpr (RS)
        for (int r = 0; r < 4; ++r) a[r] = a_words[(16 * (t / 32) + lane / 4 + 8 * (r % 2)) * 8 + lane % 4 + 4 * (r / 2)];
    SharedAddress base = shared_address(smem);
    uint64_t desc_a = descriptor(base, layout, A_START), desc_b = descriptor(base, layout, B_START);
    wgmma_fence();
    for (int repeat = 0; repeat < repeats; ++repeat) {
        bool add = accumulate != 0 || repeat > 0;
        if constexpr (RS) wgmma_bf16_rs<N, TRANS_B>(acc, a, desc_b, add);
        else wgmma_bf16_ss<N, TRANS_A, TRANS_B>(acc, desc_a, desc_b, add);
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operand(acc);
    for (int i = 0; i < N / 2; ++i) d[t * (N / 2) + i] = acc[i];
}

enum WgmmaMisuse { READ_BEFORE_WAIT = 1, WRITE_BEFORE_WAIT = 2, NO_FENCE = 3, UNFENCED_STORE = 4, THREAD_EXITS = 5 };

// One m64n8k16 wgmma (A and B K-major, no swizzle: A at 0, B at 2048) misused as `misuse` says
__global__ void wgmma_misuse(const unsigned* image, int words, int misuse, float* d) {
    DYNAMIC_SHARED_MEMORY(unsigned, smem);
    stage_image(smem, image, words);
    if (misuse == UNFENCED_STORE) {
        if (threadIdx.x == 0) smem[0] ^= 0x00010001u;  // a generic-proxy store after the fence
        __syncthreads();
    }
    if (misuse == THREAD_EXITS && threadIdx.x == 127) return;
    WgmmaAccumulator<8> acc;
    for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
    SharedAddress base = shared_address(smem);
    if (misuse != NO_FENCE) wgmma_fence();
    wgmma_bf16_ss<8>(acc, wgmma_descriptor(base, 128, 256, Swizzle::None),
                     wgmma_descriptor(base + 2048, 128, 256, Swizzle::None), false);
    wgmma_commit_group();
    float early = 0.0f;
    if (misuse == READ_BEFORE_WAIT) early = acc[3];
    if (misuse == WRITE_BEFORE_WAIT) acc[1] = 1.0f;
    wgmma_wait_group<0>();
    wgmma_fence_operand(acc);
    for (int i = 0; i < 4; ++i) d[threadIdx.x * 4 + i] = acc[i] + early;
}

// The phase and parity walk of two mbarriers (any block size): bar counts every thread, three
// phases; tx counts one arrival and 64 transaction bytes. out[t] = the try_wait results as bits,
// in order: per round, before this thread's arrival (its parity: false; the other: true, the
// phase before), then after its wait (true); thread 0 then: tx after expect_tx(64), after
// complete_tx(32), after another complete_tx(32).
__global__ void mbarrier_phases(unsigned* out) {
    __shared__ __align__(8) unsigned long long bars[2];
    SharedAddress bar = shared_address(&bars[0]), tx = shared_address(&bars[1]);
    if (threadIdx.x == 0) {
        mbarrier_init(bar, blockDim.x);
        mbarrier_init(tx, 1);
    }
    __syncthreads();
    unsigned trace = 0;
    int bit = 0;
    auto note = [&](bool result) { trace |= unsigned(result) << bit++; };
    for (int round = 0; round < 3; ++round) {
        note(mbarrier_try_wait_parity(bar, round % 2));
        note(mbarrier_try_wait_parity(bar, (round + 1) % 2));
        mbarrier_arrive(bar);
        mbarrier_wait_parity(bar, round % 2);
        note(mbarrier_try_wait_parity(bar, round % 2));
    }
    if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(tx, 64);
        note(mbarrier_try_wait_parity(tx, 0));
        mbarrier_complete_tx(tx, 32);
        note(mbarrier_try_wait_parity(tx, 0));
        mbarrier_complete_tx(tx, 32);
        note(mbarrier_try_wait_parity(tx, 0));
    }
    out[threadIdx.x] = trace;
}

enum PipelineMisuse { NO_WAIT = 1, MISSING_ARRIVE = 2 };

// 64 threads: warp 0 copies `tiles` tiles of 128 words through a 2-stage ring with cp.async, each
// lane's arrive-on (.noinc) on the stage's full barrier (count 32); warp 1 waits for it, copies
// the tile out rotated by one chunk (lane l reads the chunk lane l + 1 copied) and frees the stage
// (its empty barrier, count 32); the producer waits for the last stage's release before it
// ends. NO_WAIT: the consumer does not wait; MISSING_ARRIVE: the last
// tile's arrive-on is never made.
__global__ void mbarrier_pipeline(const unsigned* in, int tiles, int misuse, unsigned* out) {
    __shared__ __align__(16) unsigned ring[2][128];
    __shared__ __align__(8) unsigned long long full[2], empty[2];
    int lane = threadIdx.x % 32;
    if (threadIdx.x == 0)
        for (int s = 0; s < 2; ++s) {
            mbarrier_init(shared_address(&full[s]), 32);
            mbarrier_init(shared_address(&empty[s]), 32);
        }
    __syncthreads();
    for (int tile = 0; tile < tiles; ++tile) {
        int s = tile % 2;
        if (threadIdx.x < 32) {
            if (tile >= 2) mbarrier_wait_parity(shared_address(&empty[s]), (tile / 2 - 1) % 2);
            cp_async_16(shared_address(&ring[s][4 * lane]), in + tile * 128 + 4 * lane, true);
            if (!(misuse == MISSING_ARRIVE && tile == tiles - 1)) cp_async_mbarrier_arrive(shared_address(&full[s]));
        } else {
            if (misuse != NO_WAIT) mbarrier_wait_parity(shared_address(&full[s]), (tile / 2) % 2);
            int source = 4 * ((lane + 1) % 32);
            for (int j = 0; j < 4; ++j) out[tile * 128 + 4 * lane + j] = ring[s][source + j];
            mbarrier_arrive(shared_address(&empty[s]));
        }
    }
    if (threadIdx.x < 32 && tiles > 0)  // the producer's tail: the consumer has freed the last stage
        mbarrier_wait_parity(shared_address(&empty[(tiles - 1) % 2]), (tiles - 1) / 2 % 2);
}

enum RegisterMisuse { WARPS_DISAGREE = 1, INC_BELOW_CURRENT = 2, NOT_A_MULTIPLE_OF_8 = 3 };

// 256 threads: warpgroup 0 gives registers up (dec to 40), warpgroup 1 takes them (inc to 232);
// out[t] = 1 once past. The misuses break the ISA's constraints (NOT_A_MULTIPLE_OF_8 only in the
// emulator: nvcc rejects it at compile time).
__global__ void register_budget(int misuse, unsigned* out) {
    int warpgroup = threadIdx.x / 128, warp = threadIdx.x / 32 % 4;
    if (warpgroup == 0) {
        setmaxnreg_dec<40>();
    } else if (misuse == WARPS_DISAGREE && warp == 1) {
        setmaxnreg_inc<240>();
    } else {
        setmaxnreg_inc<232>();
        if (misuse == INC_BELOW_CURRENT) setmaxnreg_inc<200>();
#ifdef MINIDL_PTX_EMULATED
        if (misuse == NOT_A_MULTIPLE_OF_8) setmaxnreg_inc<236>();
#endif
    }
    out[threadIdx.x] = 1;
}
