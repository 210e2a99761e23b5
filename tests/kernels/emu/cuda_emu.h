// CPU emulation of the CUDA features the kernels in kernels/*.cu use, so that g++ -std=c++20
// compiles those sources unchanged and tests can run them on NumPy buffers (tests/kernels).
//
// Execution model: a launch creates one OS thread per CUDA thread of a block; the blocks of the
// grid run one after another on those threads, so `__shared__` variables can simply be
// `static` (every thread of the running block sees the same object) and the threads of a block
// really run concurrently: a missing __syncthreads shows up as a wrong result. threadIdx and
// blockIdx are thread_local. __syncthreads is a barrier per block; warp shuffles go through a
// barrier per warp and one exchange slot per lane; atomics take one global lock. A thread that
// returns early leaves the barriers (arrive-and-drop), as on Volta and later.
//
// WMMA fragments hold the whole tile in every thread of the warp (num_elements is the tile
// size), so code that touches fragment elements only elementwise (TF32 rounding, scaling) runs
// unchanged; mma_sync computes the full product in every lane in fp32. TF32 operands keep 10
// mantissa bits as the tensor cores do, bf16 products are exact in fp32.
//
// The PTX wrappers of kernels/ptx.cuh (ldmatrix, mma.sync, cp.async) are emulated in ptx_emu.h,
// included at the end: there the registers hold exactly what the PTX ISA puts in each lane.
//
// The emulator checks what the hardware would reject or silently get wrong: WMMA pointer
// alignment (32 bytes) and leading dimensions (16 bytes), cp.async sizes and alignment,
// launch limits, dynamic shared memory over the opt-in size, barriers that never complete, and
// shared-memory addresses outside the block's allocation where they reach the PTX wrappers
// (ldmatrix, ld/st.shared, cp.async) against the dynamic allocation; plain C++ accesses out of it
// fault on guard pages (see SharedGuardPages). Static __shared__ variables are plain statics, not checked.
// The first error is reported by the launch (emu_last_error) instead of aborting the process.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <linux/futex.h>
#include <mutex>
#include <new>
#include <pthread.h>
#include <string>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <type_traits>
#include <unistd.h>
#include <utility>
#include <vector>

// ---- keywords -------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// `extern __shared__` has no C++ spelling a macro can produce, so sources declare dynamic shared
// memory through this hook (defined with its CUDA meaning in the .cu when not emulated).
#define DYNAMIC_SHARED_MEMORY(type, name) type* name = reinterpret_cast<type*>(emu::dynamic_shared_memory())

// ---- built-in variables and vector types ----------------------------------------------------
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct __align__(16) int4 { int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline dim3 blockDim, gridDim;  // one launch at a time
constexpr int warpSize = 32;

namespace emu {

// ---- errors: the first one wins, the launch reports it --------------------------------------
inline std::mutex error_lock;
inline std::string first_error;
inline std::atomic<bool> failed{false};

inline void fail(const std::string& message) {
    std::lock_guard<std::mutex> guard(error_lock);
    if (first_error.empty()) {
        first_error = message + " (block " + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," +
                      std::to_string(blockIdx.z) + " thread " + std::to_string(threadIdx.x) + "," +
                      std::to_string(threadIdx.y) + "," + std::to_string(threadIdx.z) + ")";
    }
    failed = true;
}

inline void check(bool ok, const char* what) {
    if (!ok) fail(what);
}

// ---- a barrier that threads may leave, and that reports a deadlock instead of hanging ---------
constexpr int DEADLOCK_SECONDS = 60;

class Barrier {
  public:
    void reset(int count) {
        expected_.store(count);
        remaining_.store(count);
    }
    void arrive_and_wait() {
        if (failed) return;  // after an error every barrier opens: the launch only has to finish
        int generation = generation_.load();
        if (remaining_.fetch_sub(1) == 1) {
            complete();
            return;
        }
        timespec step{1, 0};
        for (int waited = 0; generation_.load() == generation && !failed; ++waited) {
            if (waited == DEADLOCK_SECONDS) {
                fail("deadlock: a barrier (__syncthreads or a warp operation) was not reached by every thread");
                wake_all();
                return;
            }
            syscall(SYS_futex, &generation_, FUTEX_WAIT_PRIVATE, generation, &step, nullptr, 0);
        }
    }
    void arrive_and_drop() {  // a thread that has returned from the kernel
        expected_.fetch_sub(1);
        if (remaining_.fetch_sub(1) == 1) complete();
    }
    void wake_all() { syscall(SYS_futex, &generation_, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0); }

  private:
    void complete() {
        remaining_.store(expected_.load());
        generation_.fetch_add(1);
        wake_all();
    }
    std::atomic<int> expected_{0}, remaining_{0};
    alignas(4) std::atomic<int> generation_{0};
    static_assert(sizeof(std::atomic<int>) == 4, "futex word");
};

// ---- per-launch state ---------------------------------------------------------------------
struct LaunchConfig {
    unsigned grid[3], block[3];
    unsigned long long shared_bytes, max_dynamic_shared_bytes;
};

constexpr int MAX_WARPS = 32;
constexpr size_t STATIC_SHARED_LIMIT = 48 * 1024, DYNAMIC_SHARED_LIMIT = 227 * 1024;
constexpr unsigned char SHARED_GARBAGE = 0xFF;  // NaN for floats: reading unwritten smem shows

inline Barrier block_barrier;
inline Barrier warp_barriers[MAX_WARPS];
inline uint64_t exchange[MAX_WARPS][32];  // one shuffle slot per lane
inline std::mutex atomic_lock;
// Dynamic shared memory lies in a region of whole pages, as large as the largest allocation plus a
// page either side; any address in the region outside the launch's bytes is out of range. A launch
// places its bytes (rounded up to SHARED_ALIGNMENT, the alignment of its start) to end at a page
// boundary and makes the pages around them inaccessible while it runs (SharedGuardPages), so that
// plain C++ reads and writes out of range fault and are reported too; the < 256 rounding bytes
// after the end are guard bytes, which catch writes.
constexpr size_t PAGE = 4096, SHARED_ALIGNMENT = 256;
constexpr size_t SHARED_REGION = PAGE + (DYNAMIC_SHARED_LIMIT + PAGE - 1) / PAGE * PAGE + PAGE;
alignas(PAGE) inline unsigned char shared_region[SHARED_REGION];
inline unsigned char* dynamic_shared_base = shared_region + PAGE;
inline size_t dynamic_shared_bytes = 0, dynamic_shared_padded = 0;  // the launch's bytes, rounded up
inline thread_local int lane_id, warp_id;

// ---- flush-to-zero: CuPy compiles every kernel with -ftz=true (minidl/kernels/loader.py), so fp32
// arithmetic treats subnormal inputs as zero and flushes subnormal results to zero. Kernel threads
// run with the CPU's same modes (x86 MXCSR DAZ | FTZ, Arm FPCR.FZ); the instructions the
// hardware runs without .ftz (the bf16 fma, the tensor-core products) keep subnormals through
// KeepSubnormals around their emulation.
#if defined(__x86_64__) || defined(__i386__)
constexpr uint64_t FLUSH_MODE = 0x8040;  // MXCSR: FTZ (bit 15) | DAZ (bit 6)
inline uint64_t float_mode() { return __builtin_ia32_stmxcsr(); }
inline void set_float_mode(uint64_t mode) { __builtin_ia32_ldmxcsr(unsigned(mode)); }
#elif defined(__aarch64__)
constexpr uint64_t FLUSH_MODE = 1u << 24;  // FPCR.FZ: inputs and results
inline uint64_t float_mode() { return __builtin_aarch64_get_fpcr64(); }
inline void set_float_mode(uint64_t mode) { __builtin_aarch64_set_fpcr64(mode); }
#else
#error "the emulator models -ftz=true through the x86 or Arm floating-point control register"
#endif

struct KeepSubnormals {
    uint64_t saved = float_mode();
    KeepSubnormals() { set_float_mode(saved & ~FLUSH_MODE); }
    ~KeepSubnormals() { set_float_mode(saved); }
};

inline void* dynamic_shared_memory() { return dynamic_shared_base; }

inline Barrier& my_warp() { return warp_barriers[warp_id]; }

template <typename T>
inline uint64_t to_bits(T value) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    return bits;
}

template <typename T>
inline T from_bits(uint64_t bits) {
    T value;
    std::memcpy(&value, &bits, sizeof(T));
    return value;
}

// every lane publishes `value`, then reads lane `source`'s
template <typename T>
inline T exchange_with(T value, int source) {
    exchange[warp_id][lane_id] = to_bits(value);
    my_warp().arrive_and_wait();
    T result = from_bits<T>(exchange[warp_id][source]);
    my_warp().arrive_and_wait();  // nobody overwrites a slot before everyone has read
    return result;
}

struct Grid {
    const LaunchConfig& config;
    unsigned threads;
    Barrier between_blocks;
    void (*body)(void*);
    void* context;
};

inline void prepare_block() { std::memset(dynamic_shared_base, SHARED_GARBAGE, dynamic_shared_padded); }

inline bool guard_intact() {
    for (size_t i = dynamic_shared_bytes; i < dynamic_shared_padded; ++i)
        if (dynamic_shared_base[i] != SHARED_GARBAGE) return false;
    return true;
}

// ---- out-of-range plain C++ accesses: a fault on the guard pages ends the thread's block ---------
inline thread_local sigjmp_buf* fault_exit = nullptr;  // while the thread runs the kernel's body

inline long long shared_offset(uintptr_t address) {
    return static_cast<long long>(address - reinterpret_cast<uintptr_t>(dynamic_shared_base));
}

inline void report_out_of_range(const std::string& what, uintptr_t address, size_t bytes) {
    fail(what + ": shared-memory access of " + std::to_string(bytes) + " bytes at offset " +
         std::to_string(shared_offset(address)) + " outside the block's allocation (" +
         std::to_string(dynamic_shared_bytes) + " bytes of dynamic shared memory)");
}

// The pages of the region outside the launch's bytes are inaccessible for the launch; a SIGSEGV
// there, in a kernel thread, is reported (fail: the fault is synchronous, in kernel code, so the
// lock and the allocation are safe in practice) and the thread leaves its block; any other fault
// goes to the handler that was there before, which sees it again when the instruction re-runs.
class SharedGuardPages {
  public:
    SharedGuardPages() {
        protect(PROT_NONE);
        struct sigaction mine {};
        mine.sa_sigaction = on_fault;
        mine.sa_flags = SA_SIGINFO | SA_NODEFER;  // a longjmp leaves the handler: keep SIGSEGV unblocked
        sigemptyset(&mine.sa_mask);
        sigaction(SIGSEGV, &mine, &previous());
    }
    ~SharedGuardPages() {
        sigaction(SIGSEGV, &previous(), nullptr);
        protect(PROT_READ | PROT_WRITE);
    }

  private:
    static struct sigaction& previous() {
        static struct sigaction saved;
        return saved;
    }
    static void protect(int access) {
        unsigned char* below = shared_region + (dynamic_shared_base - shared_region) / PAGE * PAGE;
        unsigned char* above = dynamic_shared_base + dynamic_shared_padded;
        mprotect(shared_region, below - shared_region, access);
        mprotect(above, shared_region + SHARED_REGION - above, access);
    }
    static void on_fault(int, siginfo_t* info, void*) {
        auto address = reinterpret_cast<uintptr_t>(info->si_addr), region = reinterpret_cast<uintptr_t>(shared_region);
        if (fault_exit && address >= region && address < region + SHARED_REGION) {
            report_out_of_range("a plain C++ access (no PTX wrapper)", address, 1);
            siglongjmp(*fault_exit, 1);
        }
        sigaction(SIGSEGV, &previous(), nullptr);
    }
};

// Where a launch of `bytes` puts its dynamic shared memory: ending at a page boundary
inline void place_dynamic_shared(size_t bytes) {
    dynamic_shared_bytes = bytes;
    dynamic_shared_padded = (bytes + SHARED_ALIGNMENT - 1) / SHARED_ALIGNMENT * SHARED_ALIGNMENT;
    size_t pages = (dynamic_shared_padded + PAGE - 1) / PAGE;
    dynamic_shared_base = shared_region + PAGE + pages * PAGE - dynamic_shared_padded;
}

inline void reset_barriers(unsigned threads) {
    block_barrier.reset(threads);
    for (unsigned w = 0; w * 32 < threads; ++w) warp_barriers[w].reset(std::min(32u, threads - w * 32));
}

// Whether [address, address + bytes) is a valid shared access: inside the launch's dynamic
// allocation, or outside the region (a static __shared__ variable: those are plain statics here,
// not checked). Else the launch fails with the offset from the allocation's start, as the
// hardware faults ("warp out-of-range address").
inline bool shared_access(const char* what, uintptr_t address, size_t bytes) {
    auto base = reinterpret_cast<uintptr_t>(dynamic_shared_base), region = reinterpret_cast<uintptr_t>(shared_region);
    bool inside = address >= base && address + bytes <= base + dynamic_shared_bytes;
    bool in_region = address + bytes > region && address < region + sizeof(shared_region);
    if (inside || !in_region) return true;
    report_out_of_range(what, address, bytes);
    return false;
}

inline void forget_thread_state();  // ptx_emu.h: what a thread's PTX instructions left of this block
inline void forget_warp_state();    // ptx_emu.h: what the warps published, once every thread is done

// The kernel's body for this thread and block; a fault on the guard pages (reported) ends it early
__attribute__((noinline)) inline void run_body(Grid* grid) {
    sigjmp_buf exit_point;
    if (sigsetjmp(exit_point, 0) == 0) {
        fault_exit = &exit_point;
        grid->body(grid->context);
    }
    fault_exit = nullptr;
}

inline void* run_thread(Grid* grid, unsigned tid) {
    const LaunchConfig& c = grid->config;
    threadIdx = {tid % c.block[0], tid / c.block[0] % c.block[1], tid / (c.block[0] * c.block[1])};
    lane_id = tid % 32;
    set_float_mode(float_mode() | FLUSH_MODE);
    warp_id = tid / 32;
    for (unsigned z = 0; z < c.grid[2]; ++z)
        for (unsigned y = 0; y < c.grid[1]; ++y)
            for (unsigned x = 0; x < c.grid[0]; ++x) {
                blockIdx = {x, y, z};
                run_body(grid);
                forget_thread_state();  // e.g. copies still pending when the thread ends never land
                block_barrier.arrive_and_drop();
                my_warp().arrive_and_drop();
                grid->between_blocks.arrive_and_wait();  // everyone is done with this block
                if (tid == 0) {
                    if (!guard_intact()) fail("write past the end of dynamic shared memory");
                    reset_barriers(grid->threads);
                    forget_warp_state();
                    prepare_block();
                }
                grid->between_blocks.arrive_and_wait();  // the next block starts clean
            }
    return nullptr;
}

inline bool valid_config(const LaunchConfig& c) {
    unsigned long long threads = 1ull * c.block[0] * c.block[1] * c.block[2];
    if (threads == 0 || threads > 1024 || c.block[2] > 64)
        return fail("launch: block has 0 or more than 1024 threads"), false;
    if (c.grid[0] == 0 || c.grid[1] == 0 || c.grid[2] == 0) return fail("launch: empty grid"), false;
    if (c.grid[1] > 65535 || c.grid[2] > 65535) return fail("launch: gridDim.y/z over 65535"), false;
    if (c.shared_bytes > DYNAMIC_SHARED_LIMIT) return fail("launch: dynamic shared memory over 227 KiB"), false;
    if (c.shared_bytes > STATIC_SHARED_LIMIT && c.shared_bytes > c.max_dynamic_shared_bytes)
        return fail("launch: over 48 KiB of dynamic shared memory without raising "
                    "max_dynamic_shared_size_bytes"), false;
    return true;
}

// Run `body(context)` as the kernel on every thread of every block; 0 on success.
inline int run_grid(const LaunchConfig& c, void (*body)(void*), void* context) {
    failed = false;
    first_error.clear();
    if (!valid_config(c)) return 1;
    unsigned threads = c.block[0] * c.block[1] * c.block[2];
    gridDim = dim3(c.grid[0], c.grid[1], c.grid[2]);
    blockDim = dim3(c.block[0], c.block[1], c.block[2]);
    place_dynamic_shared(c.shared_bytes);
    prepare_block();
    SharedGuardPages guard;
    reset_barriers(threads);
    Grid grid{c, threads, {}, body, context};
    grid.between_blocks.reset(threads);

    struct Start { Grid* grid; unsigned tid; };
    std::vector<Start> starts(threads);
    std::vector<pthread_t> handles(threads);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    for (unsigned t = 0; t < threads; ++t) {
        starts[t] = {&grid, t};
        auto entry = [](void* s) -> void* {
            auto* start = static_cast<Start*>(s);
            return run_thread(start->grid, start->tid);
        };
        if (pthread_create(&handles[t], &attr, entry, &starts[t]) != 0) {
            fprintf(stderr, "cuda_emu: cannot create thread %u of %u\n", t, threads);
            abort();  // the threads already started wait for this one: nothing sane is left to do
        }
    }
    for (unsigned t = 0; t < threads; ++t) pthread_join(handles[t], nullptr);
    pthread_attr_destroy(&attr);
    return failed ? 1 : 0;
}

// ---- launching a kernel from cudaLaunchKernel-style `void** args` ---------------------------
template <typename... A, size_t... I>
inline void call_with(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}

template <typename... A>
inline int launch(void (*kernel)(A...), const LaunchConfig& c, void** args) {
    struct Call { void (*kernel)(A...); void** args; } call{kernel, args};
    auto body = [](void* p) {
        auto* call = static_cast<Call*>(p);
        call_with(call->kernel, call->args, std::index_sequence_for<A...>{});
    };
    return run_grid(c, body, &call);
}

// Parameter types as short codes for the Python side ("f32", "i32", "f32*", "bf16*", ...).
template <typename T> struct Code;
template <> struct Code<float> { static constexpr const char* name = "f32"; };
template <> struct Code<double> { static constexpr const char* name = "f64"; };
template <> struct Code<int> { static constexpr const char* name = "i32"; };
template <> struct Code<unsigned> { static constexpr const char* name = "u32"; };
template <> struct Code<long long> { static constexpr const char* name = "i64"; };
template <> struct Code<unsigned long long> { static constexpr const char* name = "u64"; };
template <> struct Code<unsigned char> { static constexpr const char* name = "u8"; };
template <typename T> struct Code<T*> {
    static inline const std::string name = std::string(Code<std::remove_cv_t<T>>::name) + "*";
};

template <typename... A>
inline const char* signature(void (*)(A...)) {
    static const std::string joined = [] {
        std::string s;
        ((s += std::string(Code<std::remove_cv_t<A>>::name) + " "), ...);
        return s;
    }();
    return joined.c_str();
}

}  // namespace emu

// A kernel (a name or a template-id) as C entry points for the harness: launch and signature.
#define EMU_EXPORT_KERNEL(alias, ...)                                                         \
    extern "C" int emu_launch_##alias(const emu::LaunchConfig* c, void** args) {              \
        return emu::launch(__VA_ARGS__, *c, args);                                            \
    }                                                                                         \
    extern "C" const char* emu_signature_##alias() { return emu::signature(__VA_ARGS__); }

#define EMU_EXPORT_RUNTIME \
    extern "C" const char* emu_last_error() { return emu::first_error.c_str(); }

// ---- synchronization, warp operations, atomics ----------------------------------------------
inline void __syncthreads() { emu::block_barrier.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::my_warp().arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <typename T>
inline T __shfl_sync(unsigned, T value, int source, int width = 32) {
    return emu::exchange_with(value, (emu::lane_id & ~(width - 1)) + (source & (width - 1)));
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T value, int mask, int width = 32) {
    int source = emu::lane_id ^ mask;
    bool inside = (source & ~(width - 1)) == (emu::lane_id & ~(width - 1));
    return emu::exchange_with(value, inside ? source : emu::lane_id);
}
template <typename T>
inline T __shfl_down_sync(unsigned, T value, unsigned delta, int width = 32) {
    int lane = emu::lane_id, source = lane + int(delta);
    bool inside = (source & ~(width - 1)) == (lane & ~(width - 1));
    return emu::exchange_with(value, inside ? source : lane);
}
template <typename T>
inline T __shfl_up_sync(unsigned, T value, unsigned delta, int width = 32) {
    int lane = emu::lane_id, source = lane - int(delta);
    bool inside = source >= 0 && (source & ~(width - 1)) == (lane & ~(width - 1));
    return emu::exchange_with(value, inside ? source : lane);
}
inline unsigned __ballot_sync(unsigned, int predicate) {
    emu::exchange[emu::warp_id][emu::lane_id] = predicate != 0;
    emu::my_warp().arrive_and_wait();
    unsigned bits = 0;
    for (int lane = 0; lane < 32 && emu::warp_id * 32 + lane < int(blockDim.x * blockDim.y * blockDim.z); ++lane)
        bits |= unsigned(emu::exchange[emu::warp_id][lane] != 0) << lane;
    emu::my_warp().arrive_and_wait();
    return bits;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }

template <typename T>
inline T emu_atomic(T* address, T (*update)(T, T), T operand) {
    std::lock_guard<std::mutex> guard(emu::atomic_lock);
    T old = *address;
    *address = update(old, operand);
    return old;
}
template <typename T>
inline T atomicAdd(T* address, T value) {
    return emu_atomic<T>(address, [](T a, T b) { return T(a + b); }, value);
}
template <typename T>
inline T atomicMax(T* address, T value) {
    return emu_atomic<T>(address, [](T a, T b) { return a > b ? a : b; }, value);
}
template <typename T>
inline T atomicExch(T* address, T value) {
    return emu_atomic<T>(address, [](T, T b) { return b; }, value);
}
template <typename T>
inline T atomicCAS(T* address, T compare, T value) {
    std::lock_guard<std::mutex> guard(emu::atomic_lock);
    T old = *address;
    if (old == compare) *address = value;
    return old;
}

// ---- device math with CUDA's names ------------------------------------------------------------
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
// the _rn intrinsics are single IEEE operations that are never contracted into an FMA
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
template <typename T> inline T __ldg(const T* p) { return *p; }
using std::max;
using std::min;
inline float max(float a, float b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }

// ---- cuda_bf16.h ------------------------------------------------------------------------------
struct __nv_bfloat16 {
    uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16(float f) {  // round to nearest even, as the hardware does
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return {uint16_t(u >> 16)};
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16(a), __float2bfloat16(b)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float(uint32_t(h.bits) << 16); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
namespace emu {
template <> struct Code<__nv_bfloat16> { static constexpr const char* name = "bf16"; };
}

// ---- cuda_pipeline_primitives.h: cp.async copies are done at once -----------------------------
inline void __pipeline_memcpy_async(void* dst, const void* src, size_t size_and_align, size_t zfill = 0) {
    bool size_ok = size_and_align == 4 || size_and_align == 8 || size_and_align == 16;
    emu::check(size_ok && zfill <= size_and_align,
               "__pipeline_memcpy_async: size must be 4, 8 or 16 and zfill <= size");
    emu::check(reinterpret_cast<uintptr_t>(dst) % size_and_align == 0 &&
                   reinterpret_cast<uintptr_t>(src) % size_and_align == 0,
               "__pipeline_memcpy_async: addresses must be aligned to the copy size");
    if (emu::failed || !emu::shared_access("__pipeline_memcpy_async", reinterpret_cast<uintptr_t>(dst), size_and_align))
        return;
    std::memcpy(dst, src, size_and_align - zfill);
    std::memset(static_cast<char*>(dst) + (size_and_align - zfill), 0, zfill);
}
inline void __pipeline_commit() {}
inline void __pipeline_wait_prior(size_t) {}

// ---- mma.h: WMMA fragments holding the whole tile ---------------------------------------------
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
}

template <typename Use, int M, int N, int K> struct Extent;
template <int M, int N, int K> struct Extent<matrix_a, M, N, K> { static constexpr int rows = M, cols = K; };
template <int M, int N, int K> struct Extent<matrix_b, M, N, K> { static constexpr int rows = K, cols = N; };
template <int M, int N, int K> struct Extent<accumulator, M, N, K> { static constexpr int rows = M, cols = N; };

template <typename T> struct Storage { using type = T; };
template <> struct Storage<precision::tf32> { using type = float; };

// element (r, c) of the logical tile is x[r * cols + c] in every lane
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    using element_type = typename Storage<T>::type;
    static constexpr int rows = Extent<Use, M, N, K>::rows, cols = Extent<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols;
    static constexpr bool column_major = std::is_same_v<Layout, col_major>;
    element_type x[num_elements];
};

inline float __float_to_tf32(float f) {  // cvt.rna.tf32.f32: keep 10 mantissa bits, ties away
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return f;
    return __uint_as_float((u + 0x1000u) & 0xffffe000u);
}

template <typename T>
inline void check_memory_operand(const T* p, unsigned ldm) {
    emu::check(reinterpret_cast<uintptr_t>(p) % 32 == 0, "wmma load/store: pointer not 256-bit aligned");
    emu::check(ldm * sizeof(T) % 16 == 0, "wmma load/store: ldm not a multiple of 16 bytes");
}

template <typename F, typename T>
inline void load_tile(F& f, const T* p, unsigned ldm, bool column_major) {
    check_memory_operand(p, ldm);
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c) f.x[r * F::cols + c] = column_major ? p[c * ldm + r] : p[r * ldm + c];
}

template <typename Use, int M, int N, int K, typename T, typename Layout, typename E>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const E* p, unsigned ldm) {
    load_tile(f, p, ldm, fragment<Use, M, N, K, T, Layout>::column_major);
}
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
    load_tile(f, p, ldm, layout == mem_col_major);
}
template <int M, int N, int K>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
    check_memory_operand(p, ldm);
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) (layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[r * N + c];
}
template <typename Use, int M, int N, int K, typename T, typename Layout, typename V>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, V value) {
    for (auto& e : f.x) e = value;
}

// what a tensor core multiplies: TF32 keeps the top 19 bits of the fp32 pattern
inline float mma_operand(float v) { return __uint_as_float(__float_as_uint(v) & 0xffffe000u); }
inline float mma_operand(__nv_bfloat16 v) { return __bfloat162float(v); }

template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
                     const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
    emu::KeepSubnormals tensor_core;  // as ptx_emu.h's mma
    float out[M * N];
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            float sum = c.x[i * N + j];
            for (int k = 0; k < K; ++k) sum += mma_operand(a.x[i * K + k]) * mma_operand(b.x[k * N + j]);
            out[i * N + j] = sum;
        }
    std::memcpy(d.x, out, sizeof(out));
}
}  // namespace wmma
}  // namespace nvcuda

#include "ptx_emu.h"
