// CPU emulation of kernels/wgmma.cuh (included at the end of ptx_emu.h): the same functions,
// following the PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate", "mbarrier",
// "cp.async.mbarrier.arrive", "Memory Consistency Model: proxies", "setmaxnreg"), so that a kernel
// using them runs unchanged, and its misuses are reported instead of computing garbage.
//
// wgmma: every thread of the warpgroup publishes its operands (descriptors, A registers, its
// accumulator fragment) and the warpgroup meets at its barrier; the first thread past it fetches
// A and B from shared memory through the descriptors (core matrices, strides, swizzle) and
// computes the 64×N product in fp32, k in order; each thread keeps its fragment of it as a pending
// result that lands in its accumulator only at the wgmma_wait_group that retires the wgmma's group.
// Chained wgmmas on one accumulator read the previous one's pending result, as the hardware
// orders them. The emulated WgmmaAccumulator checks every element access: one while a wgmma on it
// is pending is reported (read or written, the element and the wgmma), and so is a wgmma issued
// when the accumulator was accessed after the thread's last wgmma_fence (or with no fence at all).
// The A registers of wgmma_bf16_rs are plain arrays: their accesses are not checked.
//
// The async proxy: wgmma reads shared memory through it, while stores and cp.async write through
// the generic proxy, and only fence.proxy.async orders the two. Plain C++ stores cannot be
// intercepted, so each block keeps its dynamic shared memory as it stood at the last
// fence_proxy_async_shared (of any of its threads) and a wgmma operand byte that differs from that
// copy is reported. The model's limits: a fence by any thread counts for all (the hardware needs it
// in the writing thread before its release, or the reading one after its acquire), a store that
// rewrites the same value is not seen, and only dynamic shared memory is tracked (wgmma operands
// must lie there: static __shared__ variables are plain statics in the emulator).
//
// The swizzle XORs bits 4-6 (128B), 4-5 (64B) or 4 (32B) of the byte address with bits 7-9,
// 7-8 or 7 (the ISA's Swizzle<3,4,3>, <2,4,3>, <1,4,3>); addresses count from the start of
// dynamic shared memory, which the kernels align to 1024 bytes on the GPU, and the descriptor's
// base offset must be 0.
//
// mbarrier: the state (phase, pending arrivals, the arrival count, the transaction count) lives
// beside the 8-byte object, by address, for the running block. A try_wait that finds its phase
// incomplete lets the other threads run; when every thread of the block has polled without any
// progress (an arrival, a transaction, a barrier opening, a thread ending) the wait is reported as
// a deadlock. cp_async_mbarrier_arrive tracks the thread's cp.asyncs issued so far: they land, and
// the arrival (.noinc: one of the count given at init) is made, only when a thread polls that
// mbarrier (or the issuing thread ends), so a consumer that reads a stage without waiting reads
// the 0xFF poison.
#pragma once

#include <deque>
#include <map>

enum class Swizzle : unsigned { None = 0, B128 = 1, B64 = 2, B32 = 3 };

namespace emu {
namespace hopper {

// "the mbarrier at shared offset 64" (dynamic shared memory) or "at a static __shared__ address"
inline std::string where(uintptr_t address) {
    long long offset = shared_offset(address);
    if (offset >= 0 && size_t(offset) < dynamic_shared_bytes) return "shared offset " + std::to_string(offset);
    return "a static __shared__ address";
}

// ---- warpgroup instructions -----------------------------------------------------------------------
using WarpgroupInstruction = ptx::GroupInstruction<WARPGROUP>;
enum Instruction : uint64_t {
    WGMMA = 0x4000,  // | rs << 12 | trans_a << 11 | trans_b << 10 | N
    WGMMA_FENCE = 0x100, WGMMA_COMMIT = 0x101, WGMMA_WAIT = 0x200,  // wait: | PENDING
    SETMAXNREG = 0x800,  // | inc << 9 | REGS
};

// ---- accumulators: the element accesses are checked -------------------------------------------------
struct AccumulatorState {
    float values[128];
    int registers;
    int pending = 0;          // wgmmas on it issued, not retired
    uint64_t touched_at;      // the thread's fence count at its last element access
    std::string last_wgmma;   // the latest of them, for the report
    inline explicit AccumulatorState(int n);
    inline void access(int i, const char* how);
};

struct PendingWgmma {
    AccumulatorState* accumulator;
    uint64_t group;  // the thread's commits before it
    std::vector<float> result;
};

struct ThreadState {  // one thread's, in the running block
    std::deque<PendingWgmma> pending;  // issue order
    uint64_t fences = 0, committed = 0, issued = 0;
};
inline ThreadState threads[MAX_THREADS];  // by thread_rank
inline ThreadState& mine() { return threads[thread_rank]; }

inline AccumulatorState::AccumulatorState(int n) : registers(n), touched_at(mine().fences) {
    std::fill(values, values + 128, 0.0f);
}

inline void AccumulatorState::access(int i, const char* how) {
    if (i < 0 || i >= registers)
        return fail("WgmmaAccumulator: element " + std::to_string(i) + " " + how + ", outside its " +
                    std::to_string(registers) + " registers");
    touched_at = mine().fences;
    if (pending > 0)
        fail("WgmmaAccumulator: element " + std::to_string(i) + " " + how + " while " + last_wgmma +
             " on it is pending (before the wgmma_wait_group that retires its group)");
}

}  // namespace hopper
}  // namespace emu

// One thread's N/2 accumulator registers (the fragment of kernels/wgmma.cuh); d[i] is checked
template <int N>
struct WgmmaAccumulator : emu::hopper::AccumulatorState {
    static_assert(N >= 8 && N <= 256 && N % 8 == 0, "wgmma .m64nNk16: N is a multiple of 8 in [8, 256]");
    static constexpr int size = N / 2;
    WgmmaAccumulator() : AccumulatorState(N / 2) {}

    class Element {  // d[i]: a read converts it, a write assigns it
      public:
        Element(AccumulatorState& d, int i) : d_(d), i_(i) {}
        operator float() const {
            d_.access(i_, "read");
            return d_.values[i_ & 127];
        }
        Element& operator=(float v) {
            d_.access(i_, "written");
            d_.values[i_ & 127] = v;
            return *this;
        }
        Element& operator=(const Element& other) { return *this = float(other); }
        Element& operator+=(float v) { return *this = float(*this) + v; }
        Element& operator-=(float v) { return *this = float(*this) - v; }
        Element& operator*=(float v) { return *this = float(*this) * v; }
        Element& operator/=(float v) { return *this = float(*this) / v; }

      private:
        AccumulatorState& d_;
        int i_;
    };
    Element operator[](int i) { return Element(*this, i); }
    float operator[](int i) const {
        const_cast<WgmmaAccumulator&>(*this).access(i, "read");
        return values[i & 127];
    }
};

namespace emu {
namespace hopper {

// ---- operands in shared memory through descriptors ---------------------------------------------------
struct Descriptor {
    size_t start, leading, stride;  // bytes
    unsigned base_offset;
    Swizzle swizzle;
};
inline Descriptor decode(uint64_t bits) {
    auto field = [bits](int at, int width) { return size_t(bits >> at & ((uint64_t(1) << width) - 1)); };
    return {field(0, 14) << 4, field(16, 14) << 4, field(32, 14) << 4, unsigned(field(49, 3)),
            static_cast<Swizzle>(field(62, 2))};
}

inline int swizzle_bits(Swizzle s) { return s == Swizzle::B128 ? 3 : s == Swizzle::B64 ? 2 : s == Swizzle::B32 ? 1 : 0; }

// The byte offset (from the descriptor's start) of element (mn, k) of a bf16 operand stored
// K-major or MN-major, by the ISA's canonical layouts (T = 8 bf16 per 16 bytes; W the swizzle's
// row bytes): K-major, no swizzle: ((8,m),(T,2k)):((1T,SBO),(1,LBO)); K-major, swizzled:
// ((8,m),(T,2k)):((W/16·T,SBO),(1,T)); MN-major, no swizzle: ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO));
// MN-major, swizzled: ((T,W/16,m),(8,k)):((1,T,LBO),(W/16·T,SBO)) (in elements; LBO, SBO in bytes).
inline size_t layout_offset(const Descriptor& d, bool mn_major, int mn, int k) {
    size_t row_bytes = size_t(16) << swizzle_bits(d.swizzle);  // W: 16 without swizzle
    if (!mn_major) {
        if (d.swizzle == Swizzle::None) return (mn % 8) * 16 + (mn / 8) * d.stride + (k % 8) * 2 + (k / 8) * d.leading;
        return (mn % 8) * row_bytes + (mn / 8) * d.stride + k * 2;
    }
    if (d.swizzle == Swizzle::None) return (mn % 8) * 2 + (mn / 8) * d.stride + (k % 8) * 16 + (k / 8) * d.leading;
    size_t per_row = row_bytes / 2;  // elements of one swizzle row
    return (mn % per_row) * 2 + (mn / per_row) * d.leading + (k % 8) * row_bytes + (k / 8) * d.stride;
}

inline size_t swizzled(size_t address, Swizzle s) {
    int bits = swizzle_bits(s);
    return address ^ ((address >> 7 & ((size_t(1) << bits) - 1)) << 4);
}

// ---- the async proxy's view: dynamic shared memory as of the last fence.proxy.async ------------------
inline std::vector<unsigned char> fenced;

// Operand A (64×16) or B (16×N) of a wgmma, as float, from shared memory; false after a reported error
inline bool fetch(const char* name, const char* operand, uint64_t bits, bool mn_major, int mn_size,
                  std::vector<float>& out) {  // out[mn * 16 + k]
    Descriptor d = decode(bits);
    auto report = [&](const std::string& what) { return fail(std::string(name) + ": operand " + operand + " " + what), false; };
    if (d.base_offset != 0) return report("has a base offset (not modelled: start swizzled operands on the pattern's boundary)");
    out.assign(size_t(mn_size) * 16, 0.0f);
    for (int mn = 0; mn < mn_size; ++mn)
        for (int k = 0; k < 16; ++k) {
            size_t at = swizzled(d.start + layout_offset(d, mn_major, mn, k), d.swizzle);
            if (at + 2 > dynamic_shared_bytes)
                return report("element (" + std::to_string(mn) + ", " + std::to_string(k) + ") at shared offset " +
                              std::to_string(at) + " lies outside the " + std::to_string(dynamic_shared_bytes) +
                              " bytes of dynamic shared memory");
            if (std::memcmp(dynamic_shared_base + at, fenced.data() + at, 2) != 0)
                return report("reads shared offset " + std::to_string(at) +
                              ", written through the generic proxy (a store or cp.async) after the last "
                              "fence_proxy_async_shared: the wgmma may not see it");
            uint16_t element;
            std::memcpy(&element, dynamic_shared_base + at, 2);
            out[size_t(mn) * 16 + k] = __uint_as_float(uint32_t(element) << 16);
        }
    return true;
}

// Where d[i] of thread t of the warpgroup sits in the 64×N tile (the ISA's figure for m64nNk16)
inline int fragment_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * (i / 2 % 2); }
inline int fragment_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + i % 2; }
// register r (half h: the low or high 16 bits) of the A fragment of wgmma_bf16_rs
inline int a_row(int t, int r) { return 16 * (t / 32) + (t % 32) / 4 + 8 * (r % 2); }
inline int a_col(int t, int r, int h) { return 2 * (t % 4) + h + 8 * (r / 2); }

// The warpgroup's product, computed by its first thread past the barrier (`tag` says for which wgmma)
struct Product {
    uint64_t tag = 0;
    float d[64][256];
};
inline Product products[MAX_WARPGROUPS];

constexpr int DESC_A = 0, DESC_B = 2, ACCUMULATE = 4, A_REGISTERS = 5;  // in the published words

inline void compute(const char* name, int n, bool rs, bool trans_a, bool trans_b,
                    const ptx::Operands (&lanes)[WARPGROUP], Product& product) {
    const uint32_t* first = lanes[0].words;
    for (int t = 1; t < WARPGROUP; ++t)
        if (std::memcmp(lanes[t].words, first, A_REGISTERS * sizeof(uint32_t)) != 0)
            return fail(std::string(name) + ": thread " + std::to_string(t) +
                        " of the warpgroup gave other descriptors or another accumulate flag than thread 0");
    auto descriptor = [first](int at) { return uint64_t(first[at]) | uint64_t(first[at + 1]) << 32; };
    std::vector<float> a, b;  // a[m * 16 + k], b[n * 16 + k]
    if (rs) {
        a.assign(64 * 16, 0.0f);
        for (int t = 0; t < WARPGROUP; ++t)
            for (int r = 0; r < 4; ++r)
                for (int h = 0; h < 2; ++h)
                    a[a_row(t, r) * 16 + a_col(t, r, h)] = __uint_as_float((lanes[t].words[A_REGISTERS + r] >> (16 * h)) << 16);
    } else if (!fetch(name, "A", descriptor(DESC_A), trans_a, 64, a)) {
        return;
    }
    if (!fetch(name, "B", descriptor(DESC_B), trans_b, n, b)) return;
    bool accumulate = first[ACCUMULATE] != 0;
    static float c[64][256];  // one thread computes at a time
    std::memset(c, 0, sizeof(c));
    if (accumulate)
        for (int t = 0; t < WARPGROUP; ++t) {
            auto* fragment = static_cast<const float*>(lanes[t].address);
            for (int i = 0; i < n / 2; ++i) c[fragment_row(t, i)][fragment_col(t, i)] = fragment[i];
        }
    KeepSubnormals tensor_core;  // as ptx_emu.h's mma
    for (int m = 0; m < 64; ++m)
        for (int col = 0; col < n; ++col) {
            float sum = c[m][col];
            for (int k = 0; k < 16; ++k) sum += a[size_t(m) * 16 + k] * b[size_t(col) * 16 + k];
            product.d[m][col] = sum;
        }
}

inline void issue(AccumulatorState& d, int n, bool rs, bool trans_a, bool trans_b, uint64_t desc_a, uint64_t desc_b,
                  bool accumulate, const unsigned* a, const char* name) {
    ThreadState& me = mine();
    if (!failed && d.touched_at >= me.fences)
        fail(std::string(name) + ": issued without a wgmma_fence after the accumulator's registers were accessed "
                                 "(or before the warpgroup's first wgmma_fence)");
    // the accumulator as the wgmma reads it: the latest pending result on it, else the registers
    const float* input = d.values;
    for (auto it = me.pending.rbegin(); it != me.pending.rend(); ++it)
        if (it->accumulator == &d) {
            input = it->result.data();
            break;
        }
    uint32_t words[ptx::MAX_WORDS] = {uint32_t(desc_a), uint32_t(desc_a >> 32), uint32_t(desc_b), uint32_t(desc_b >> 32),
                                      uint32_t(accumulate)};
    if (a) std::copy(a, a + 4, words + A_REGISTERS);
    uint64_t instruction = WGMMA | uint64_t(rs) << 12 | uint64_t(trans_a) << 11 | uint64_t(trans_b) << 10 | uint64_t(n);
    WarpgroupInstruction group(name, instruction, input, words);
    if (!group.ok) return;
    Product& product = products[thread_rank / WARPGROUP];
    if (product.tag != group.lanes[thread_rank % WARPGROUP].tag) {
        product.tag = group.lanes[thread_rank % WARPGROUP].tag;
        compute(name, n, rs, trans_a, trans_b, group.lanes, product);
    }
    int t = int(thread_rank % WARPGROUP);
    PendingWgmma pending{&d, me.committed, std::vector<float>(size_t(n / 2))};
    for (int i = 0; i < n / 2; ++i) pending.result[i] = product.d[fragment_row(t, i)][fragment_col(t, i)];
    me.pending.push_back(std::move(pending));
    ++d.pending;
    d.last_wgmma = std::string(name) + " (this thread's wgmma #" + std::to_string(++me.issued) + ")";
}

// ---- mbarriers ---------------------------------------------------------------------------------------
struct Mbarrier {
    uint64_t phase = 0;
    long long pending = 0, count = 0, transactions = 0;
};
inline std::map<uintptr_t, Mbarrier> mbarriers;  // by address, the running block's

struct ArriveOn {  // a cp_async_mbarrier_arrive not yet triggered
    uintptr_t barrier;
    unsigned thread;  // thread_rank of the issuing thread
    uint64_t copies;  // its cp.asyncs issued before it: these must land first
};
inline std::vector<ArriveOn> arrive_ons;

inline uint64_t fruitless_polls = 0, progress_seen = 0;  // try_waits that found nothing changed

inline int warp_registers[MAX_WARPS];  // setmaxnreg's count per warp of the running block; 0: the launch's, not known

inline Mbarrier* find(const char* name, uintptr_t address) {
    auto it = mbarriers.find(address);
    if (it != mbarriers.end()) return &it->second;
    fail(std::string(name) + ": the mbarrier at " + where(address) + " was not initialized (mbarrier_init)");
    return nullptr;
}

inline void complete_if_done(Mbarrier& bar) {
    if (bar.pending == 0 && bar.transactions == 0) {
        ++bar.phase;
        bar.pending = bar.count;
    }
}

inline void arrive(const char* name, uintptr_t address) {
    Mbarrier* bar = find(name, address);
    if (!bar) return;
    ++progress;
    if (bar->pending == 0)
        return fail(std::string(name) + ": more arrivals on the mbarrier at " + where(address) +
                    " than its count, in one phase (its transactions are still pending)");
    --bar->pending;
    complete_if_done(*bar);
}

// The arrive-ons on `address` (any, if 0) for which `chosen` holds are triggered:
// their tracked copies land, then they arrive
template <class Predicate>
inline void trigger_arrive_ons(uintptr_t address, Predicate chosen) {
    std::vector<ArriveOn> due;
    auto triggers = [&](const ArriveOn& on) { return (address == 0 || on.barrier == address) && chosen(on); };
    for (const ArriveOn& on : arrive_ons)
        if (triggers(on)) due.push_back(on);
    arrive_ons.erase(std::remove_if(arrive_ons.begin(), arrive_ons.end(), triggers), arrive_ons.end());
    for (const ArriveOn& on : due) {
        uint64_t before = on.copies;
        ptx::async_copies[on.thread].land([before](const ptx::AsyncCopy& copy) { return copy.serial < before; });
        arrive("cp_async_mbarrier_arrive", on.barrier);
    }
}

}  // namespace hopper

inline void forget_hopper_thread_state() {  // declared in ptx_emu.h
    unsigned me = thread_rank;
    hopper::trigger_arrive_ons(0, [me](const hopper::ArriveOn& on) { return on.thread == me; });
    hopper::mine() = {};
}
inline void forget_hopper_block_state() {
    hopper::mbarriers.clear();
    hopper::arrive_ons.clear();
    hopper::fruitless_polls = 0;
    hopper::fenced.assign(dynamic_shared_bytes, SHARED_GARBAGE);  // as prepare_block leaves it
    for (auto& product : hopper::products) product.tag = 0;
    std::fill(std::begin(hopper::warp_registers), std::end(hopper::warp_registers), 0);
}
}  // namespace emu

// ---- the wrappers ---------------------------------------------------------------------------------------
inline uint64_t wgmma_descriptor(SharedAddress start, unsigned leading_byte_offset, unsigned stride_byte_offset,
                                 Swizzle swizzle) {
    long long offset = emu::shared_offset(start);
    if (offset < 0 || size_t(offset) >= emu::dynamic_shared_bytes || offset % 16 != 0 || offset >= (1 << 18))
        emu::fail("wgmma_descriptor: the operand must start in dynamic shared memory, 16-byte aligned, below 256 KiB "
                  "(start at offset " + std::to_string(offset) + ")");
    auto encode = [](long long x) { return uint64_t((x & 0x3FFFF) >> 4); };
    return encode(offset) | encode(leading_byte_offset) << 16 | encode(stride_byte_offset) << 32 |
           uint64_t(static_cast<unsigned>(swizzle)) << 62;
}

template <int N>
inline void wgmma_fence_operand(WgmmaAccumulator<N>&) {}  // a compiler barrier on the GPU

inline void wgmma_fence() {
    emu::hopper::WarpgroupInstruction group("wgmma_fence", emu::hopper::WGMMA_FENCE, nullptr);
    ++emu::hopper::mine().fences;
}
inline void wgmma_commit_group() {
    emu::hopper::WarpgroupInstruction group("wgmma_commit_group", emu::hopper::WGMMA_COMMIT, nullptr);
    ++emu::hopper::mine().committed;
}
// Groups retire in order: after the wait at most PENDING committed groups are pending; their
// wgmmas' results land in the accumulators (wgmmas not committed yet are not waited for)
template <int PENDING>
inline void wgmma_wait_group() {
    emu::hopper::WarpgroupInstruction group("wgmma_wait_group", emu::hopper::WGMMA_WAIT | PENDING, nullptr);
    auto& me = emu::hopper::mine();
    auto retired = [&me](const emu::hopper::PendingWgmma& w) { return w.group + PENDING < me.committed; };
    for (auto& w : me.pending)
        if (retired(w)) {
            std::copy(w.result.begin(), w.result.end(), w.accumulator->values);
            --w.accumulator->pending;
        }
    me.pending.erase(std::remove_if(me.pending.begin(), me.pending.end(), retired), me.pending.end());
}

template <int N, bool TRANS_A = false, bool TRANS_B = false>
inline void wgmma_bf16_ss(WgmmaAccumulator<N>& d, uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    emu::hopper::issue(d, N, false, TRANS_A, TRANS_B, desc_a, desc_b, accumulate, nullptr, "wgmma_bf16_ss");
}
template <int N, bool TRANS_B = false>
inline void wgmma_bf16_rs(WgmmaAccumulator<N>& d, const unsigned (&a)[4], uint64_t desc_b, bool accumulate) {
    emu::hopper::issue(d, N, true, false, TRANS_B, 0, desc_b, accumulate, a, "wgmma_bf16_rs");
}

inline void mbarrier_init(SharedAddress bar, unsigned arrivals) {
    if (bar % 8 != 0) return emu::fail("mbarrier_init: the mbarrier's address must be 8-byte aligned");
    if (arrivals < 1 || arrivals >= (1u << 20))
        return emu::fail("mbarrier_init: the arrival count must be in [1, 2^20 - 1], not " + std::to_string(arrivals));
    emu::hopper::mbarriers[bar] = {0, arrivals, arrivals, 0};
    ++emu::progress;
}
inline void mbarrier_arrive(SharedAddress bar) { emu::hopper::arrive("mbarrier_arrive", bar); }
inline void mbarrier_arrive_expect_tx(SharedAddress bar, unsigned bytes) {
    if (auto* state = emu::hopper::find("mbarrier_arrive_expect_tx", bar)) state->transactions += bytes;
    emu::hopper::arrive("mbarrier_arrive_expect_tx", bar);
}
inline void mbarrier_complete_tx(SharedAddress bar, unsigned bytes) {
    auto* state = emu::hopper::find("mbarrier_complete_tx", bar);
    if (!state) return;
    ++emu::progress;
    state->transactions -= bytes;
    emu::hopper::complete_if_done(*state);
}

// Whether the phase of this parity has completed; if not, the other threads run first (the
// arrive-ons on it are triggered here: their copies land now)
inline bool mbarrier_try_wait_parity(SharedAddress bar, unsigned parity) {
    using namespace emu::hopper;
    if (emu::failed) return true;  // after an error the launch only has to finish
    trigger_arrive_ons(bar, [](const ArriveOn&) { return true; });
    Mbarrier* state = find("mbarrier_try_wait_parity", bar);
    if (!state) return true;
    if ((state->phase & 1) != (parity & 1)) return true;
    if (emu::progress != progress_seen) progress_seen = emu::progress, fruitless_polls = 0;
    if (++fruitless_polls > 4 * uint64_t(emu::live) + 8) {
        emu::fail("mbarrier deadlock: the wait for the phase of parity " + std::to_string(parity & 1) +
                  " of the mbarrier at " + where(bar) + " never completes (" + std::to_string(state->pending) +
                  " arrivals and " + std::to_string(state->transactions) +
                  " transaction bytes missing, and no thread can make progress)");
        emu::open_all_barriers();
        return true;
    }
    emu::ready.push(emu::current);  // let the others run
    emu::run_next();
    return false;
}
inline void mbarrier_wait_parity(SharedAddress bar, unsigned parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
}

inline void cp_async_mbarrier_arrive(SharedAddress bar) {
    if (!emu::hopper::find("cp_async_mbarrier_arrive", bar)) return;
    emu::hopper::arrive_ons.push_back({bar, emu::thread_rank, emu::ptx::my_copies().issued});
}

inline void fence_proxy_async_shared() {
    std::memcpy(emu::hopper::fenced.data(), emu::dynamic_shared_base, emu::dynamic_shared_bytes);
}

template <bool INC, int REGS>
inline void setmaxnreg(const char* name) {
    using namespace emu::hopper;
    if (REGS < 24 || REGS > 256 || REGS % 8 != 0)
        return emu::fail(std::string(name) + ": " + std::to_string(REGS) + " registers; the count must be in [24, 256], a multiple of 8");
    WarpgroupInstruction group(name, SETMAXNREG | uint64_t(INC) << 9 | REGS, nullptr);
    if (!group.ok) return;
    int& current = warp_registers[emu::warp_id];
    if (current != 0 && (INC ? REGS < current : REGS > current))
        return emu::fail(std::string(name) + ": " + std::to_string(REGS) + (INC ? " is below" : " is above") +
                         " the warp's current " + std::to_string(current) + " registers");
    current = REGS;
}
template <int REGS>
inline void setmaxnreg_inc() { setmaxnreg<true, REGS>("setmaxnreg_inc"); }
template <int REGS>
inline void setmaxnreg_dec() { setmaxnreg<false, REGS>("setmaxnreg_dec"); }
