// CPU emulation of the CUDA features the kernels in kernels/*.cu use, so that g++ -std=c++20
// compiles those sources unchanged and tests can run them on NumPy buffers (tests/kernels).
//
// Execution model: a launch runs on the calling OS thread. Each CUDA thread of a block is a
// user-level context (a fiber) with its own stack, and the blocks of the grid run one after
// another, so `__shared__` variables can simply be `static`. Fibers are scheduled cooperatively:
// a fiber runs until it reaches a barrier (__syncthreads, or the warp barrier behind every warp
// operation), then the next ready one runs; a barrier releases its waiters when every live member
// has arrived, and a fiber that returns leaves the barriers (arrive-and-drop, as on Volta and
// later). Each block starts its fibers in thread order and a barrier hands them on in arrival
// order, so between two barriers thread t runs after threads 0..t-1 and before t+1..: a missing
// __syncthreads makes a thread read what a later thread has not written yet (0xFF poison in
// dynamic shared memory, or the previous value), a wrong result as on the GPU. threadIdx,
// lane_id, warp_id and the PTX state of the running fiber are plain globals that every switch
// sets; atomics need no lock.
//
// WMMA fragments hold the whole tile in every thread of the warp (num_elements is the tile
// size), so code that touches fragment elements only elementwise (TF32 rounding, scaling) runs
// unchanged; mma_sync computes the full product in every lane in fp32. TF32 operands keep 10
// mantissa bits as the tensor cores do, bf16 products are exact in fp32.
//
// The PTX wrappers of kernels/ptx.cuh (ldmatrix, mma.sync, cp.async) are emulated in ptx_emu.h,
// included at the end: there the registers hold exactly what the PTX ISA puts in each lane; and
// those of kernels/wgmma.cuh (wgmma, mbarrier, setmaxnreg) in wgmma_emu.h, which it includes.
//
// The emulator checks what the hardware would reject or silently get wrong: WMMA pointer
// alignment (32 bytes) and leading dimensions (16 bytes), cp.async sizes and alignment,
// launch limits, dynamic shared memory over the opt-in size, barriers that never complete, and
// shared-memory addresses outside the block's allocation where they reach the PTX wrappers
// (ldmatrix, ld/st.shared, cp.async) against the dynamic allocation; plain C++ accesses out of it
// fault on guard pages (see GuardPages). Static __shared__ variables are plain statics, not checked.
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
#include <new>
#include <pthread.h>
#include <string>
#include <sys/mman.h>
#include <type_traits>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
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

inline uint3 threadIdx;  // the running fiber's (see emu::resume)
inline uint3 blockIdx;
inline dim3 blockDim, gridDim;  // one launch at a time
constexpr int warpSize = 32;

namespace emu {

// ---- errors: the first one wins, the launch reports it --------------------------------------
inline std::string first_error;
inline bool failed = false;

inline void fail(const std::string& message) {
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

// ---- per-launch state ---------------------------------------------------------------------
struct LaunchConfig {
    unsigned grid[3], block[3];
    unsigned long long shared_bytes, max_dynamic_shared_bytes;
};

constexpr int MAX_WARPS = 32;
constexpr size_t STATIC_SHARED_LIMIT = 48 * 1024, DYNAMIC_SHARED_LIMIT = 227 * 1024;
constexpr unsigned char SHARED_GARBAGE = 0xFF;  // NaN for floats: reading unwritten smem shows

// Dynamic shared memory lies in a region of whole pages, as large as the largest allocation plus a
// page either side; any address in the region outside the launch's bytes is out of range. A launch
// places its bytes (rounded up to SHARED_ALIGNMENT, the alignment of its start) to end at a page
// boundary and makes the pages around them inaccessible while it runs (GuardPages), so that
// plain C++ reads and writes out of range fault and are reported too; the < 256 rounding bytes
// after the end are guard bytes, which catch writes.
constexpr size_t PAGE = 4096, SHARED_ALIGNMENT = 256;
constexpr size_t SHARED_REGION = PAGE + (DYNAMIC_SHARED_LIMIT + PAGE - 1) / PAGE * PAGE + PAGE;
alignas(PAGE) inline unsigned char shared_region[SHARED_REGION];
inline unsigned char* dynamic_shared_base = shared_region + PAGE;
inline size_t dynamic_shared_bytes = 0, dynamic_shared_padded = 0;  // the launch's bytes, rounded up

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

// ---- fibers: one user-level context per CUDA thread of the running block ----------------------
constexpr unsigned MAX_THREADS = 1024;
constexpr size_t STACK_BYTES = 256 * 1024;  // per fiber, the lowest page a guard (a fault there is reported)

// A switch saves the callee-saved registers and the floating-point control words on the old
// stack and restores them from the new one, so each fiber keeps its own float mode
// (KeepSubnormals); the first switch to a new fiber "returns" into emu_fiber_start, which calls
// the entry function. swapcontext would do the same with a sigprocmask system call per switch.
#if defined(__x86_64__)
extern "C" void emu_switch_stack(void** save_sp, void* load_sp);
extern "C" void emu_fiber_start();
asm(R"(
    .pushsection .text.emu_switch_stack,"axG",@progbits,emu_switch_stack,comdat
    .weak emu_switch_stack
    .hidden emu_switch_stack
    .type emu_switch_stack, @function
emu_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_stack, .-emu_switch_stack
    .weak emu_fiber_start
    .hidden emu_fiber_start
    .type emu_fiber_start, @function
emu_fiber_start:
    callq *%r12
    ud2
    .size emu_fiber_start, .-emu_fiber_start
    .popsection
)");

struct Context {
    void* sp = nullptr;
};
// `entry` runs on [stack, stack + bytes) with the current float mode; it must never return
inline void prepare_context(Context& context, unsigned char* stack, size_t bytes, void (*entry)()) {
    auto* frame = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15)) - 8;
    uint16_t x87;
    asm volatile("fnstcw %0" : "=m"(x87));
    frame[0] = float_mode() | uint64_t(x87) << 32;  // then r15, r14, r13, r12, rbx, rbp, the return address
    std::fill(frame + 1, frame + 7, 0);
    frame[4] = reinterpret_cast<uintptr_t>(entry);
    frame[7] = reinterpret_cast<uintptr_t>(&emu_fiber_start);
    context.sp = frame;
}
inline void switch_context(Context& from, Context& to) { emu_switch_stack(&from.sp, to.sp); }
#else
struct Context {
    ucontext_t state;
};
inline void prepare_context(Context& context, unsigned char* stack, size_t bytes, void (*entry)()) {
    getcontext(&context.state);
    context.state.uc_stack = {stack, 0, bytes};
    context.state.uc_link = nullptr;
    makecontext(&context.state, entry, 0);
}
inline void switch_context(Context& from, Context& to) { swapcontext(&from.state, &to.state); }
#endif

struct Fiber {
    Context context;
    Fiber* next = nullptr;  // in the ready queue or in a barrier's queue
    unsigned rank;          // threadIdx with x fastest
    uint3 thread;
    sigjmp_buf exit;        // where a fault in the kernel's body leaves to (GuardPages)
};

struct FiberQueue {  // first in, first out
    Fiber *head = nullptr, *tail = nullptr;
    bool empty() const { return head == nullptr; }
    void push(Fiber* f) {
        f->next = nullptr;
        (head ? tail->next : head) = f;
        tail = f;
    }
    Fiber* pop() {
        Fiber* f = head;
        if (f) head = f->next;
        return f;
    }
    void append(FiberQueue& other) {  // and empties `other`
        if (other.empty()) return;
        (head ? tail->next : head) = other.head;
        tail = other.tail;
        other = {};
    }
};

inline Fiber fibers[MAX_THREADS];
inline Fiber* current = nullptr;  // the running fiber; null while the launch itself runs
inline Context launcher;          // the launch's own context, resumed once every fiber of the block has ended
inline FiberQueue ready;
inline unsigned live = 0;  // fibers of the block that have not ended
inline unsigned thread_rank = 0;
inline int lane_id = 0, warp_id = 0;
inline unsigned char* stacks = nullptr;  // MAX_THREADS stacks of STACK_BYTES, reserved at the first launch
// counts what can unblock a thread that polls (an mbarrier's try_wait, wgmma_emu.h): a barrier
// opening, a thread ending, an mbarrier's arrival or transaction
inline uint64_t progress = 0;

inline unsigned char* fiber_stack(unsigned rank) {
    if (!stacks) {
        void* p = mmap(nullptr, MAX_THREADS * STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            fprintf(stderr, "cuda_emu: cannot reserve %zu MiB for the kernel threads' stacks\n",
                    MAX_THREADS * STACK_BYTES >> 20);
            abort();
        }
        stacks = static_cast<unsigned char*>(p);
        for (unsigned t = 0; t < MAX_THREADS; ++t) mprotect(stacks + t * STACK_BYTES, PAGE, PROT_NONE);
    }
    return stacks + rank * STACK_BYTES + PAGE;
}

inline bool in_stack_guard(uintptr_t address) {
    auto start = reinterpret_cast<uintptr_t>(stacks);
    return stacks && address >= start && address < start + MAX_THREADS * STACK_BYTES && (address - start) % STACK_BYTES < PAGE;
}

// Makes `f` the running CUDA thread: the globals the kernel and the emulation read
inline void enter(Fiber* f) {
    current = f;
    threadIdx = f->thread;
    thread_rank = f->rank;
    lane_id = int(f->rank % 32);
    warp_id = int(f->rank / 32);
}

// ---- a barrier that fibers may leave, and that reports a deadlock instead of hanging ----------
class Barrier {
  public:
    void reset(int count) {
        expected_ = count;
        arrived_ = 0;
        waiting_ = {};
    }
    inline void arrive_and_wait();
    void arrive_and_drop() {  // a fiber that has returned from the kernel
        --expected_;
        if (arrived_ > 0 && arrived_ == expected_) open();
    }
    void open() {  // the waiting fibers go to the back of the ready queue, in arrival order
        ++progress;
        ready.append(waiting_);
        arrived_ = 0;
    }

  private:
    int expected_ = 0, arrived_ = 0;
    FiberQueue waiting_;
};

inline Barrier block_barrier;
inline Barrier warp_barriers[MAX_WARPS];
constexpr int WARPGROUP = 128, MAX_WARPGROUPS = MAX_THREADS / WARPGROUP;
inline Barrier warpgroup_barriers[MAX_WARPGROUPS];  // behind every warpgroup operation (wgmma_emu.h)
inline uint64_t exchange[MAX_WARPS][32];  // one shuffle slot per lane

inline void open_all_barriers() {
    block_barrier.open();
    for (Barrier& b : warp_barriers) b.open();
    for (Barrier& b : warpgroup_barriers) b.open();
}

// The running fiber waits (at a barrier, or released at the back of the ready queue) or has
// ended: the next ready fiber runs, or the launch once the last fiber has ended. No fiber ready
// while some live is a barrier that cannot complete: reported, and every barrier opens (as after
// any error) so that the block can finish.
inline void run_next() {
    if (ready.empty() && live > 0) {
        if (!failed) fail("deadlock: a barrier (__syncthreads or a warp operation) was not reached by every thread");
        open_all_barriers();
    }
    Fiber *from = current, *next = ready.pop();
    if (next == from) return;
    if (next) {
        enter(next);
        switch_context(from->context, next->context);
    } else {
        current = nullptr;
        switch_context(from->context, launcher);
    }
}

inline void Barrier::arrive_and_wait() {
    if (failed) return;  // after an error every barrier opens: the launch only has to finish
    if (++arrived_ < expected_) {
        waiting_.push(current);
    } else {
        open();
        ready.push(current);  // after the others, so that they run in the order they arrived
    }
    run_next();
}

inline void* dynamic_shared_memory() { return dynamic_shared_base; }

inline Barrier& my_warp() { return warp_barriers[warp_id]; }
inline Barrier& my_warpgroup() { return warpgroup_barriers[thread_rank / WARPGROUP]; }

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

inline void prepare_block() { std::memset(dynamic_shared_base, SHARED_GARBAGE, dynamic_shared_padded); }

inline bool guard_intact() {
    for (size_t i = dynamic_shared_bytes; i < dynamic_shared_padded; ++i)
        if (dynamic_shared_base[i] != SHARED_GARBAGE) return false;
    return true;
}

// ---- faults: out-of-range plain C++ accesses, and stack overflows ------------------------------
inline long long shared_offset(uintptr_t address) {
    return static_cast<long long>(address - reinterpret_cast<uintptr_t>(dynamic_shared_base));
}

inline void report_out_of_range(const std::string& what, uintptr_t address, size_t bytes) {
    fail(what + ": shared-memory access of " + std::to_string(bytes) + " bytes at offset " +
         std::to_string(shared_offset(address)) + " outside the block's allocation (" +
         std::to_string(dynamic_shared_bytes) + " bytes of dynamic shared memory)");
}

inline pthread_t launching_thread;  // the OS thread the running launch's fibers run on

// While a launch runs, the pages of the shared region outside the launch's bytes are
// inaccessible. A SIGSEGV there, or on the guard page below a fiber's stack, in a fiber, is
// reported (fail: the fault is synchronous, in kernel code, so the allocation is safe in
// practice) and the fiber's thread leaves its block; any other fault goes to the handler that was
// there before, which sees it again when the instruction re-runs. The handler runs on a stack of
// its own, since the fault may be a fiber's stack overflowing.
class GuardPages {
  public:
    GuardPages() {
        protect(PROT_NONE);
        stack_t own{signal_stack, 0, sizeof(signal_stack)};
        sigaltstack(&own, &previous_stack_);
        struct sigaction mine {};
        mine.sa_sigaction = on_fault;
        mine.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;  // a longjmp leaves the handler: keep SIGSEGV unblocked
        sigemptyset(&mine.sa_mask);
        sigaction(SIGSEGV, &mine, &previous());
    }
    ~GuardPages() {
        sigaction(SIGSEGV, &previous(), nullptr);
        sigaltstack(&previous_stack_, nullptr);
        protect(PROT_READ | PROT_WRITE);
    }

  private:
    static inline unsigned char signal_stack[64 * 1024];
    stack_t previous_stack_{};
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
        if (current && pthread_equal(pthread_self(), launching_thread)) {
            if (address >= region && address < region + SHARED_REGION) {
                report_out_of_range("a plain C++ access (no PTX wrapper)", address, 1);
                siglongjmp(current->exit, 1);
            }
            if (in_stack_guard(address)) {
                fail("stack overflow: a kernel thread used more than " + std::to_string(STACK_BYTES / 1024 - 4) +
                     " KiB of stack");
                siglongjmp(current->exit, 1);
            }
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
    for (unsigned g = 0; g * WARPGROUP < threads; ++g)
        warpgroup_barriers[g].reset(std::min(unsigned(WARPGROUP), threads - g * WARPGROUP));
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

inline void (*kernel_body)(void*);  // the launch's kernel and its arguments
inline void* kernel_arguments;

// The kernel's body for this thread and block; a fault (reported) ends it early
__attribute__((noinline)) inline void run_body() {
    if (sigsetjmp(current->exit, 0) == 0) kernel_body(kernel_arguments);
}

[[noreturn]] inline void fiber_main() {
    run_body();
    forget_thread_state();  // e.g. copies still pending when the thread ends never land
    block_barrier.arrive_and_drop();
    my_warp().arrive_and_drop();
    my_warpgroup().arrive_and_drop();
    --live;
    ++progress;
    run_next();
    __builtin_unreachable();  // an ended fiber is never resumed
}

// Runs every thread of block blockIdx to its end, in thread order until the first barrier
inline void run_block(const LaunchConfig& c, unsigned threads) {
    reset_barriers(threads);
    forget_warp_state();
    prepare_block();
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = fibers[t];
        f.rank = t;
        f.thread = {t % c.block[0], t / c.block[0] % c.block[1], t / (c.block[0] * c.block[1])};
        prepare_context(f.context, fiber_stack(t), STACK_BYTES - PAGE, fiber_main);
        ready.push(&f);
    }
    live = threads;
    Fiber* first = ready.pop();
    enter(first);
    switch_context(launcher, first->context);
    threadIdx = {0, 0, 0};  // what a failure of the block as a whole names
    if (!guard_intact()) fail("write past the end of dynamic shared memory");
}

inline bool valid_config(const LaunchConfig& c) {
    unsigned long long threads = 1ull * c.block[0] * c.block[1] * c.block[2];
    if (threads == 0 || threads > MAX_THREADS || c.block[2] > 64)
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
    threadIdx = blockIdx = {0, 0, 0};
    if (!valid_config(c)) return 1;
    unsigned threads = c.block[0] * c.block[1] * c.block[2];
    gridDim = dim3(c.grid[0], c.grid[1], c.grid[2]);
    blockDim = dim3(c.block[0], c.block[1], c.block[2]);
    place_dynamic_shared(c.shared_bytes);
    kernel_body = body;
    kernel_arguments = context;
    launching_thread = pthread_self();
    uint64_t caller_mode = float_mode();
    set_float_mode(caller_mode | FLUSH_MODE);  // the fibers start with it
    {
        GuardPages guard;
        for (unsigned z = 0; z < c.grid[2]; ++z)
            for (unsigned y = 0; y < c.grid[1]; ++y)
                for (unsigned x = 0; x < c.grid[0]; ++x) {
                    blockIdx = {x, y, z};
                    run_block(c, threads);
                }
    }
    set_float_mode(caller_mode);
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

// fibers switch only at barriers: a read-modify-write is atomic as it is
template <typename T>
inline T emu_atomic(T* address, T (*update)(T, T), T operand) {
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
