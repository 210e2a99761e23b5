// CPU emulation of kernels/ptx.cuh (included at the end of cuda_emu.h): the same functions, so
// a kernel written against the PTX wrappers runs unchanged. Unlike the WMMA emulation, the
// registers hold exactly what the PTX ISA puts in each lane, so a kernel that gets a fragment
// mapping wrong computes a wrong result here as on the GPU.
//
// ldmatrix and mma.sync are warp-wide (.sync.aligned): every lane publishes its operands (a row
// address, or its A, B and C registers), the warp meets at its barrier, and each lane computes
// its own result from everyone's operands. A lane that has exited, lanes at different
// instructions, or a warp of fewer than 32 threads is an error, as the hardware leaves it undefined.
//
// cp.async completes late, as on the GPU: at issue the 16 destination bytes are poisoned (0xFF,
// a NaN for floats and bf16) and the data lands only when the issuing thread's cp_async_wait
// retires the copy's group. A kernel that reads a stage before waiting for it reads NaN.
//
// kernels/wgmma.cuh's Hopper instructions are emulated in wgmma_emu.h, included at the end.
#pragma once

#define MINIDL_PTX_EMULATED 1

// A shared-memory address: here the pointer's value, integer arithmetic on it as in ptx.cuh
using SharedAddress = uintptr_t;
inline SharedAddress shared_address(const void* pointer) { return reinterpret_cast<SharedAddress>(pointer); }

namespace emu {
namespace ptx {

// ---- warp- and warpgroup-wide instructions ------------------------------------------------------
constexpr int MAX_WORDS = 10;  // mma: 4 A, 2 B and 4 C registers; wgmma: 2 descriptors, a flag, 4 A registers

// what one thread hands to a warp- or warpgroup-wide instruction
struct Operands {
    uint64_t tag;  // instruction << 48 | how many instructions of its group the thread has executed
    const void* address;
    uint32_t words[MAX_WORDS];
};
// Warp-wide (32 threads, the lanes) and warpgroup-wide (128, wgmma_emu.h) instructions: each group
// has two sets of slots, used in turn: a member writes instruction i + 1's operands only after
// every member has reached instruction i, i.e. finished reading instruction i − 1's: one barrier per
// instruction. `executed` counts, by thread_rank, the group's instructions the thread has
// executed: the same count in every member of a group that runs correctly.
template <int SIZE>
struct GroupSlots {
    static inline Operands published[2][MAX_THREADS / SIZE][SIZE];
    static inline uint64_t executed[MAX_THREADS];
    static constexpr const char* group = SIZE == 32 ? "warp" : "warpgroup";
    static constexpr const char* member = SIZE == 32 ? "lane" : "thread";
    static Barrier& barrier() { return SIZE == 32 ? my_warp() : my_warpgroup(); }
    static void forget() { std::memset(published, 0, sizeof(published)); }
};

enum Instruction : uint64_t { LDMATRIX = 0x10, MMA_BF16 = 0x20, MMA_TF32 = 0x21 };  // ldmatrix: | x << 1 | trans

// Publishes this member's operands and copies every member's (`lanes`); `ok` says whether the
// whole group executed this instruction together (a member that has exited publishes nothing
// more, and the slots are cleared between blocks: no stale tag from an earlier block can match).
template <int SIZE>
struct GroupInstruction {
    using Slots = GroupSlots<SIZE>;
    Operands lanes[SIZE];
    bool ok = false;

    GroupInstruction(const char* name, uint64_t instruction, const void* address, const uint32_t* words = nullptr) {
        uint64_t count = ++Slots::executed[thread_rank];
        int group = int(thread_rank) / SIZE, member = int(thread_rank) % SIZE;
        Operands(&slots)[SIZE] = Slots::published[count % 2][group];
        Operands& mine = slots[member];
        mine.tag = instruction << 48 | count;
        mine.address = address;
        if (words) std::memcpy(mine.words, words, sizeof(mine.words));
        Slots::barrier().arrive_and_wait();
        std::memcpy(lanes, slots, sizeof(lanes));
        if (failed) return;  // after an error barriers open early: the copy may be stale
        int threads = int(blockDim.x * blockDim.y * blockDim.z);
        if (threads - group * SIZE < SIZE) {
            fail(std::string(name) + ": the " + Slots::group + " has fewer than " + std::to_string(SIZE) +
                 " threads; every " + Slots::member + " must execute it");
            return;
        }
        for (int other = 0; other < SIZE; ++other)
            if (lanes[other].tag != mine.tag) {
                fail(std::string(name) + ": " + Slots::member + " " + std::to_string(other) + " did not execute it with the rest of the " +
                     Slots::group + " (exited, or at another instruction)");
                return;
            }
        ok = true;
    }
};
using WarpInstruction = GroupInstruction<32>;

// ---- ldmatrix ---------------------------------------------------------------------------------
// Lane l receives, in r[i], row l/4 and 16-bit columns 2(l%4), 2(l%4)+1 of matrix i (low half:
// the lower column), whose row j starts at the address of lane 8i + j; TRANS reads the stored
// matrix transposed, i.e. column l/4 at rows 2(l%4) and 2(l%4)+1.
template <int MATRICES, bool TRANS>
inline void ldmatrix(unsigned (&r)[MATRICES], const void* row, const char* name) {
    WarpInstruction warp(name, LDMATRIX | MATRICES << 1 | TRANS, row);
    for (unsigned& v : r) v = 0;
    if (!warp.ok) return;
    for (int i = 0; i < MATRICES; ++i)
        for (int half = 0; half < 2; ++half) {
            int stored_row = TRANS ? 2 * (lane_id % 4) + half : lane_id / 4;
            int stored_col = TRANS ? lane_id / 4 : 2 * (lane_id % 4) + half;
            int source = 8 * i + stored_row;
            auto* start = static_cast<const unsigned char*>(warp.lanes[source].address);
            if (!start || reinterpret_cast<uintptr_t>(start) % 16 != 0)
                return fail(std::string(name) + ": the row address of lane " + std::to_string(source) +
                            " is null or not 16-byte aligned");
            if (!shared_access(name, reinterpret_cast<uintptr_t>(start), 16)) return;
            uint16_t element;
            std::memcpy(&element, start + 2 * stored_col, 2);
            r[i] |= unsigned(element) << (16 * half);
        }
}

// ---- mma.sync m16n8k16 (bf16) and m16n8k8 (tf32) ------------------------------------------------
// Where a lane's fragment elements sit in the matrices (g = lane/4, t = lane%4), from the PTX
// ISA's "Matrix Fragments for mma.m16n8k16 with floating point type" and "for mma.m16n8k8".
struct Element {
    int row, col;
};
inline Element accumulator(int lane, int j) { return {lane / 4 + 8 * (j / 2), 2 * (lane % 4) + j % 2}; }
inline Element bf16_a(int lane, int reg, int half) { return {lane / 4 + 8 * (reg % 2), 2 * (lane % 4) + half + 8 * (reg / 2)}; }
inline Element bf16_b(int lane, int reg, int half) { return {2 * (lane % 4) + half + 8 * reg, lane / 4}; }  // (k, n)
inline Element tf32_a(int lane, int reg) { return {lane / 4 + 8 * (reg % 2), lane % 4 + 4 * (reg / 2)}; }
inline Element tf32_b(int lane, int reg) { return {lane % 4 + 4 * reg, lane / 4}; }  // (k, n)

// the warp's whole tile, gathered from every lane's registers
template <int K>
struct Tile {
    float a[16][K], b[K][8], c[16][8];
};

// Publishes a, b, c; `gather` fills the tile's A and B from the lanes' registers; C is gathered
// here and this lane's four elements of A·B + C (fp32, the k terms added in order onto C, as the
// WMMA emulation does) come out in d.
template <int K, class Gather>
inline void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4], const char* name,
                uint64_t instruction, Gather gather) {
    uint32_t words[MAX_WORDS] = {a[0], a[1], a[2], a[3], b[0], b[1],
                                 __float_as_uint(c[0]), __float_as_uint(c[1]), __float_as_uint(c[2]), __float_as_uint(c[3])};
    WarpInstruction warp(name, instruction, nullptr, words);
    for (float& v : d) v = 0.0f;
    if (!warp.ok) return;
    KeepSubnormals tensor_core;  // assumed: no flush in the tensor cores (ptx_selftest.py checks it on a GPU)
    Tile<K> tile;
    for (int lane = 0; lane < 32; ++lane) {
        gather(tile, lane, warp.lanes[lane].words);
        for (int j = 0; j < 4; ++j) {
            Element e = accumulator(lane, j);
            tile.c[e.row][e.col] = __uint_as_float(warp.lanes[lane].words[6 + j]);
        }
    }
    for (int j = 0; j < 4; ++j) {
        Element e = accumulator(lane_id, j);
        float sum = tile.c[e.row][e.col];
        for (int k = 0; k < K; ++k) sum += tile.a[e.row][k] * tile.b[k][e.col];
        d[j] = sum;
    }
}

inline float bf16_half(uint32_t word, int half) {
    return nvcuda::wmma::mma_operand(__nv_bfloat16{uint16_t(word >> (16 * half))});
}

// ---- cp.async -----------------------------------------------------------------------------------
struct AsyncCopy {
    unsigned char* destination;
    unsigned char data[16];  // read at issue: changing the source before the wait is undefined anyway
    uint64_t group;          // the group it joins: the thread's commits before it
    uint64_t serial;         // the thread's copies issued before it
};
struct AsyncCopies {  // one thread's, in the running block
    std::vector<AsyncCopy> pending;  // issued, not landed, in issue order
    uint64_t committed = 0;          // groups committed
    uint64_t issued = 0;

    // the pending copies for which `lands` holds land, and leave the list
    template <class Predicate>
    void land(Predicate lands) {
        for (const auto& copy : pending)
            if (lands(copy)) std::memcpy(copy.destination, copy.data, 16);
        pending.erase(std::remove_if(pending.begin(), pending.end(), lands), pending.end());
    }
};
inline AsyncCopies async_copies[MAX_THREADS];  // by thread_rank
inline AsyncCopies& my_copies() { return async_copies[thread_rank]; }

}  // namespace ptx

void forget_hopper_thread_state();  // wgmma_emu.h
void forget_hopper_block_state();

inline void forget_thread_state() {  // declared in cuda_emu.h: a block's pending copies end with it
    forget_hopper_thread_state();    // first: it lands the copies an mbarrier tracks
    ptx::my_copies() = {};
    ptx::GroupSlots<32>::executed[thread_rank] = 0;
    ptx::GroupSlots<WARPGROUP>::executed[thread_rank] = 0;
}
inline void forget_warp_state() {
    ptx::GroupSlots<32>::forget();
    ptx::GroupSlots<WARPGROUP>::forget();
    forget_hopper_block_state();
}
}  // namespace emu

inline void ldmatrix_x1(unsigned (&r)[1], SharedAddress row) {
    emu::ptx::ldmatrix<1, false>(r, reinterpret_cast<const void*>(row), "ldmatrix_x1");
}
inline void ldmatrix_x2(unsigned (&r)[2], SharedAddress row) {
    emu::ptx::ldmatrix<2, false>(r, reinterpret_cast<const void*>(row), "ldmatrix_x2");
}
inline void ldmatrix_x4(unsigned (&r)[4], SharedAddress row) {
    emu::ptx::ldmatrix<4, false>(r, reinterpret_cast<const void*>(row), "ldmatrix_x4");
}
inline void ldmatrix_x1_trans(unsigned (&r)[1], SharedAddress row) {
    emu::ptx::ldmatrix<1, true>(r, reinterpret_cast<const void*>(row), "ldmatrix_x1_trans");
}
inline void ldmatrix_x2_trans(unsigned (&r)[2], SharedAddress row) {
    emu::ptx::ldmatrix<2, true>(r, reinterpret_cast<const void*>(row), "ldmatrix_x2_trans");
}
inline void ldmatrix_x4_trans(unsigned (&r)[4], SharedAddress row) {
    emu::ptx::ldmatrix<4, true>(r, reinterpret_cast<const void*>(row), "ldmatrix_x4_trans");
}

inline void mma_bf16_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]) {
    using namespace emu::ptx;
    mma<16>(d, a, b, c, "mma_bf16_m16n8k16", MMA_BF16, [](Tile<16>& tile, int lane, const uint32_t* words) {
        for (int half = 0; half < 2; ++half) {
            for (int reg = 0; reg < 4; ++reg) {
                Element e = bf16_a(lane, reg, half);
                tile.a[e.row][e.col] = bf16_half(words[reg], half);
            }
            for (int reg = 0; reg < 2; ++reg) {
                Element e = bf16_b(lane, reg, half);
                tile.b[e.row][e.col] = bf16_half(words[4 + reg], half);
            }
        }
    });
}

inline void mma_tf32_m16n8k8(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]) {
    using namespace emu::ptx;
    mma<8>(d, a, b, c, "mma_tf32_m16n8k8", MMA_TF32, [](Tile<8>& tile, int lane, const uint32_t* words) {
        for (int reg = 0; reg < 4; ++reg) {
            Element e = tf32_a(lane, reg);
            tile.a[e.row][e.col] = nvcuda::wmma::mma_operand(__uint_as_float(words[reg]));
        }
        for (int reg = 0; reg < 2; ++reg) {
            Element e = tf32_b(lane, reg);
            tile.b[e.row][e.col] = nvcuda::wmma::mma_operand(__uint_as_float(words[4 + reg]));
        }
    });
}

inline unsigned lds_32(SharedAddress address) {
    emu::check(address % 4 == 0, "lds_32: the address must be 4-byte aligned");
    if (!emu::shared_access("lds_32", address, 4)) return 0;
    unsigned value;
    std::memcpy(&value, reinterpret_cast<const void*>(address), 4);
    return value;
}

inline void lds_128(unsigned (&r)[4], SharedAddress address) {
    emu::check(address % 16 == 0, "lds_128: the address must be 16-byte aligned");
    if (!emu::shared_access("lds_128", address, 16)) return void(std::memset(r, 0, 16));
    std::memcpy(r, reinterpret_cast<const void*>(address), 16);
}
inline void sts_128_if(SharedAddress address, const unsigned (&r)[4], bool store) {  // predicated off: no access
    emu::check(address % 16 == 0, "sts_128_if: the address must be 16-byte aligned");
    if (store && emu::shared_access("sts_128_if", address, 16)) std::memcpy(reinterpret_cast<void*>(address), r, 16);
}

inline void cp_async_16(SharedAddress shared, const void* global, bool fill) {
    void* smem = reinterpret_cast<void*>(shared);
    bool aligned = reinterpret_cast<uintptr_t>(smem) % 16 == 0 && reinterpret_cast<uintptr_t>(global) % 16 == 0;
    emu::check(aligned, "cp_async_16: the shared and global addresses must be 16-byte aligned");
    if (emu::failed || !emu::shared_access("cp_async_16", shared, 16)) return;
    auto& copies = emu::ptx::my_copies();
    emu::ptx::AsyncCopy copy{static_cast<unsigned char*>(smem), {}, copies.committed, copies.issued++};
    if (fill) std::memcpy(copy.data, global, 16);
    std::memset(smem, emu::SHARED_GARBAGE, 16);
    copies.pending.push_back(copy);
}

inline void cp_async_commit() { ++emu::ptx::my_copies().committed; }

// Groups complete in order: after the wait at most N of the committed groups are pending, so the
// copies of groups [0, committed − N) land; copies not committed yet are not waited for.
template <int N>
inline void cp_async_wait() {
    uint64_t committed = emu::ptx::my_copies().committed;
    emu::ptx::my_copies().land([committed](const emu::ptx::AsyncCopy& copy) { return copy.group + N < committed; });
}

inline unsigned tf32_bits(float x) { return __float_as_uint(nvcuda::wmma::__float_to_tf32(x)); }

namespace emu {
namespace ptx {
// The exact value s + err (s = the double nearest to it, |err| at most half an ulp of s) rounded
// to bf16, to nearest even: s's bf16 ulp is at least 2^29 of its double ulps, so err can only
// decide a tie. Subnormals are kept (bf16 arithmetic has no .ftz); past the largest finite bf16
// the result is infinite.
inline uint16_t round_to_bf16(double s, double err) {
    if (std::isnan(s)) return 0x7fff;
    if (s == 0.0) return std::signbit(s) ? 0x8000 : 0x0000;
    int exponent = std::ilogb(s);  // |s| in [2^e, 2^(e + 1))
    double ulp = std::ldexp(1.0, std::max(exponent, -126) - 7);
    double q = s / ulp, whole = std::floor(q), fraction = q - whole;
    if (fraction > 0.5 || (fraction == 0.5 && (err > 0.0 || (err == 0.0 && std::fmod(whole, 2.0) != 0.0))))
        whole += 1.0;
    float rounded = float(whole * ulp);  // exact: 8 significant bits, or a power of two past the range
    if (std::fabs(whole * ulp) >= std::ldexp(1.0, 128)) rounded = std::signbit(s) ? -INFINITY : INFINITY;
    return uint16_t(__float_as_uint(rounded) >> 16);
}
// One half of fma.rn.relu.bf16x2: a·b is exact in a double (8-bit significands), a·b + c is
// s + err exactly (Knuth's two-sum), rounded once; .relu turns a negative result into +0 and a
// NaN into the canonical NaN
inline uint16_t fma_relu_bf16(uint16_t a, uint16_t b, uint16_t c) {
    KeepSubnormals bf16_arithmetic;  // no .ftz: subnormal operands and results count
    auto value = [](uint16_t bits) { return double(__uint_as_float(uint32_t(bits) << 16)); };
    double p = value(a) * value(b), cc = value(c), s = p + cc;
    double pp = s - cc, err = std::isfinite(s) ? (p - pp) + (cc - (s - pp)) : 0.0;
    uint16_t d = round_to_bf16(s, err);
    if ((d & 0x7fff) > 0x7f80) return 0x7fff;
    return d & 0x8000 ? 0x0000 : d;
}
}  // namespace ptx
}  // namespace emu

inline unsigned fma_relu_bf16x2(unsigned a, unsigned b, unsigned c) {
    return unsigned(emu::ptx::fma_relu_bf16(uint16_t(a), uint16_t(b), uint16_t(c))) |
           unsigned(emu::ptx::fma_relu_bf16(uint16_t(a >> 16), uint16_t(b >> 16), uint16_t(c >> 16))) << 16;
}

#include "wgmma_emu.h"
