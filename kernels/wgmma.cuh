// Hopper's PTX (sm_90a) as small inline wrappers, in ptx.cuh's style: warpgroup matrix products
// (wgmma.mma_async) on operands in shared memory described by matrix descriptors, the fences and
// groups that order them, mbarriers, the cp.async arrive-on, the async-proxy fence and setmaxnreg.
// The CPU emulator (tests/kernels/emu/wgmma_emu.h) defines the same functions after
// MINIDL_PTX_EMULATED, following the PTX ISA, so a kernel using these runs unchanged in both.
//
// wgmma (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Operation"): the four
// warps of a warpgroup (128 consecutive threads, the first a multiple of 128) compute together
// D(64×N, fp32) = A(64×16) · B(16×N) (+ D). It is asynchronous: issue wgmma_fence() before the
// first wgmma and whenever the accumulator registers were touched since, wgmma_commit_group()
// after the wgmmas of a step, and read or write the accumulator only after the
// wgmma_wait_group<P>() that retires that group (call wgmma_fence_operand(d) after it, so that
// the compiler keeps the accumulator's reads and writes on the right side of the wait).
//
// Accumulator fragment (thread t of the warpgroup, w = t / 32, lane = t % 32; "Register fragments
// and shared memory matrix layouts" for wgmma .m64nNk16): d[i] holds
//     row 16w + lane/4 + 8·((i/2) % 2),  column 8·(i/4) + 2·(lane % 4) + i % 2.
// A from registers (wgmma_bf16_rs), two bf16 per register, the lower k in the low half:
//     a[0] A(16w + lane/4, 2(lane%4)..+1)   a[1] A(16w + lane/4 + 8, 2(lane%4)..+1)
//     a[2] A(16w + lane/4, 2(lane%4)+8..+9) a[3] A(16w + lane/4 + 8, 2(lane%4)+8..+9)
//   (each warp's 16-row slice is mma.m16n8k16's A fragment).
//
// Matrix descriptor (64 bits, "Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29
// leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 49-51 base offset
// (0 here: swizzled operands start on the pattern's repeat boundary), 62-63 the layout type.
// The operand is made of core matrices of 8 rows × 16 bytes (8 bf16), each stored contiguously.
#pragma once

#include "ptx.cuh"

#ifndef MINIDL_PTX_EMULATED

// the descriptor's layout_type field (bits 62-63)
enum class Swizzle : unsigned { None = 0, B128 = 1, B64 = 2, B32 = 3 };

#ifdef __CUDACC_RTC__
using uint64_t = unsigned long long;
#else
#include <cstdint>
#endif

__device__ __forceinline__ uint64_t wgmma_descriptor(SharedAddress start, unsigned leading_byte_offset,
                                                     unsigned stride_byte_offset, Swizzle swizzle) {
    return uint64_t((start >> 4) & 0x3fff) | uint64_t((leading_byte_offset >> 4) & 0x3fff) << 16 |
           uint64_t((stride_byte_offset >> 4) & 0x3fff) << 32 | uint64_t(static_cast<unsigned>(swizzle)) << 62;
}

// One thread's N/2 fp32 accumulator registers of the warpgroup's 64×N tile (layout above)
template <int N>
struct WgmmaAccumulator {
    static_assert(N >= 8 && N <= 256 && N % 8 == 0, "wgmma .m64nNk16: N is a multiple of 8 in [8, 256]");
    static constexpr int size = N / 2;
    float r[N / 2];
    __device__ __forceinline__ float& operator[](int i) { return r[i]; }
    __device__ __forceinline__ const float& operator[](int i) const { return r[i]; }
};

// Orders this thread's earlier register and shared-memory accesses before the warpgroup's next
// wgmma (required before the first wgmma and after the accumulator was touched)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// closes the group of this warpgroup's wgmmas issued since the last commit
__device__ __forceinline__ void wgmma_commit_group() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// waits until at most PENDING of this warpgroup's most recent groups are pending
template <int PENDING>
__device__ __forceinline__ void wgmma_wait_group() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}
// A compiler-only barrier on the accumulator's registers: reads and writes of d stay on their
// side of it (the wgmma asm names d, the wait does not)
template <int N>
__device__ __forceinline__ void wgmma_fence_operand(WgmmaAccumulator<N>& d) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(d.r[i])::"memory");
}

// The wgmma asm for one N: the accumulator as N/2 "+f" operands %0..%(N/2 − 1), then the
// others; the register list and the later operands' numbers are spelled out per N below.
#define MINIDL_ACC4(i) "+f"(d.r[i]), "+f"(d.r[i + 1]), "+f"(d.r[i + 2]), "+f"(d.r[i + 3])
#define MINIDL_ACC8(i) MINIDL_ACC4(i), MINIDL_ACC4(i + 4)
#define MINIDL_ACC16(i) MINIDL_ACC8(i), MINIDL_ACC8(i + 8)
#define MINIDL_ACC32(i) MINIDL_ACC16(i), MINIDL_ACC16(i + 16)
#define MINIDL_ACC64(i) MINIDL_ACC32(i), MINIDL_ACC32(i + 32)
#define MINIDL_ACC128(i) MINIDL_ACC64(i), MINIDL_ACC64(i + 64)
#define MINIDL_REGS_0_9 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9"
#define MINIDL_REGS_TENS(t) ", %" #t "0, %" #t "1, %" #t "2, %" #t "3, %" #t "4, %" #t "5, %" #t "6, %" #t "7, %" #t "8, %" #t "9"

template <int N, bool TRANS_A, bool TRANS_B>
struct WgmmaBf16;  // the asm for one N: ss() and rs()

// REGS: the accumulator list; O0..O6: the numbers of the operands after it
#define MINIDL_WGMMA_BF16(N, ACC, REGS, O0, O1, O2, O3, O4, O5, O6)                                                    \
    template <bool TRANS_A, bool TRANS_B>                                                                               \
    struct WgmmaBf16<N, TRANS_A, TRANS_B> {                                                                             \
        static __device__ __forceinline__ void ss(WgmmaAccumulator<N>& d, uint64_t desc_a, uint64_t desc_b,            \
                                                  bool accumulate) {                                                   \
            asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #O2 ", 0;\n"                                           \
                         " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" REGS "}, %" #O0 ", %" #O1     \
                         ", p, 1, 1, %" #O3 ", %" #O4 ";\n}\n"                                                          \
                         : ACC                                                                                          \
                         : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(int(TRANS_A)), "n"(int(TRANS_B)));      \
        }                                                                                                               \
        static __device__ __forceinline__ void rs(WgmmaAccumulator<N>& d, const unsigned (&a)[4], uint64_t desc_b,     \
                                                  bool accumulate) {                                                   \
            asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #O5 ", 0;\n"                                           \
                         " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" REGS "}, {%" #O0 ", %" #O1      \
                         ", %" #O2 ", %" #O3 "}, %" #O4 ", p, 1, 1, %" #O6 ";\n}\n"                                      \
                         : ACC                                                                                          \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)),              \
                           "n"(int(TRANS_B)));                                                                          \
        }                                                                                                               \
    };

MINIDL_WGMMA_BF16(8, MINIDL_ACC4(0), "%0, %1, %2, %3", 4, 5, 6, 7, 8, 9, 10)
MINIDL_WGMMA_BF16(16, MINIDL_ACC8(0), "%0, %1, %2, %3, %4, %5, %6, %7", 8, 9, 10, 11, 12, 13, 14)
MINIDL_WGMMA_BF16(32, MINIDL_ACC16(0), MINIDL_REGS_0_9 ", %10, %11, %12, %13, %14, %15", 16, 17, 18, 19, 20, 21, 22)
MINIDL_WGMMA_BF16(64, MINIDL_ACC32(0), MINIDL_REGS_0_9 MINIDL_REGS_TENS(1) MINIDL_REGS_TENS(2) ", %30, %31",
                  32, 33, 34, 35, 36, 37, 38)
MINIDL_WGMMA_BF16(128, MINIDL_ACC64(0),
                  MINIDL_REGS_0_9 MINIDL_REGS_TENS(1) MINIDL_REGS_TENS(2) MINIDL_REGS_TENS(3) MINIDL_REGS_TENS(4)
                      MINIDL_REGS_TENS(5) ", %60, %61, %62, %63",
                  64, 65, 66, 67, 68, 69, 70)
MINIDL_WGMMA_BF16(256, MINIDL_ACC128(0),
                  MINIDL_REGS_0_9 MINIDL_REGS_TENS(1) MINIDL_REGS_TENS(2) MINIDL_REGS_TENS(3) MINIDL_REGS_TENS(4)
                      MINIDL_REGS_TENS(5) MINIDL_REGS_TENS(6) MINIDL_REGS_TENS(7) MINIDL_REGS_TENS(8)
                          MINIDL_REGS_TENS(9) MINIDL_REGS_TENS(10) MINIDL_REGS_TENS(11)
                              ", %120, %121, %122, %123, %124, %125, %126, %127",
                  128, 129, 130, 131, 132, 133, 134)

#undef MINIDL_WGMMA_BF16
#undef MINIDL_REGS_TENS
#undef MINIDL_REGS_0_9
#undef MINIDL_ACC128
#undef MINIDL_ACC64
#undef MINIDL_ACC32
#undef MINIDL_ACC16
#undef MINIDL_ACC8
#undef MINIDL_ACC4

// d = A·B (+ d when accumulate): A (64×16) and B (16×N) bf16 in shared memory through
// descriptors; TRANS_A / TRANS_B: the operand is stored MN-major (imm-trans-a / imm-trans-b = 1)
// instead of K-major. N: 8, 16, 32, 64, 128 or 256.
template <int N, bool TRANS_A = false, bool TRANS_B = false>
__device__ __forceinline__ void wgmma_bf16_ss(WgmmaAccumulator<N>& d, uint64_t desc_a, uint64_t desc_b,
                                              bool accumulate) {
    WgmmaBf16<N, TRANS_A, TRANS_B>::ss(d, desc_a, desc_b, accumulate);
}
// the same with A in registers (the fragment above)
template <int N, bool TRANS_B = false>
__device__ __forceinline__ void wgmma_bf16_rs(WgmmaAccumulator<N>& d, const unsigned (&a)[4], uint64_t desc_b,
                                              bool accumulate) {
    WgmmaBf16<N, false, TRANS_B>::rs(d, a, desc_b, accumulate);
}

// ---- mbarrier (a 64-bit object in shared memory, 8-byte aligned) ---------------------------------
// A phase completes when its pending arrivals (`arrivals` at init) and its transaction count both
// reach zero; then the next phase begins with the arrival count reloaded. Phase parity: 0 for
// the first phase.
__device__ __forceinline__ void mbarrier_init(SharedAddress bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(SharedAddress bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// raises the phase's transaction count by `bytes`, then arrives
__device__ __forceinline__ void mbarrier_arrive_expect_tx(SharedAddress bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// lowers the phase's transaction count by `bytes` (what a bulk copy does as its bytes land)
__device__ __forceinline__ void mbarrier_complete_tx(SharedAddress bar, unsigned bytes) {
    asm volatile("mbarrier.complete_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// whether the phase of parity `parity` has completed (may wait a while in hardware first)
__device__ __forceinline__ bool mbarrier_try_wait_parity(SharedAddress bar, unsigned parity) {
    unsigned done;
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done != 0;
}
__device__ __forceinline__ void mbarrier_wait_parity(SharedAddress bar, unsigned parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
}

// The barrier's arrive-on: triggered when all of this thread's earlier cp.asyncs have landed;
// .noinc: the arrival counts against the count given at init (no increment of the pending count)
__device__ __forceinline__ void cp_async_mbarrier_arrive(SharedAddress bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Orders this thread's generic-proxy shared-memory accesses (stores, cp.async data once landed)
// with the async proxy's (wgmma operand reads)
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Moves the warp's register budget to REGS (in [24, 256], a multiple of 8); every warp of the
// warpgroup must execute the same
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg: REGS in [24, 256], a multiple of 8");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg: REGS in [24, 256], a multiple of 8");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

#endif  // MINIDL_PTX_EMULATED
