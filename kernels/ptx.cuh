// PTX that CUDA C++ cannot express, as small inline wrappers: warp-level matrix loads
// (ldmatrix), tensor-core products (mma.sync), asynchronous global -> shared copies (cp.async),
// the TF32 rounding and the bf16 pair multiply-add with ReLU. Plain CUDA C++ for nvcc and NVRTC (sm_80 and later); the CPU emulator
// (tests/kernels/emu/ptx_emu.h) defines MINIDL_PTX_EMULATED and the same functions, following
// the PTX ISA's fragment-to-lane mappings, so a kernel using these runs unchanged in both.
//
// Fragments (lane = threadIdx.x % 32, g = lane / 4, t = lane % 4; PTX ISA, "Matrix Fragments
// for mma.m16n8k16 with floating point type" and "for mma.m16n8k8"):
//   mma_bf16_m16n8k16, two bf16 per register, the lower column (or k) in the low half:
//     a[0] A(g, 2t..2t+1)  a[1] A(g+8, 2t..)  a[2] A(g, 2t+8..)  a[3] A(g+8, 2t+8..)
//     b[0] B(2t..2t+1, g)  b[1] B(2t+8.., g)
//   mma_tf32_m16n8k8, one fp32 bit pattern per register (the unit reads its TF32 part):
//     a[0] A(g, t)  a[1] A(g+8, t)  a[2] A(g, t+4)  a[3] A(g+8, t+4)
//     b[0] B(t, g)  b[1] B(t+4, g)
//   accumulators of both: c[0], c[1] C(g, 2t), C(g, 2t+1); c[2], c[3] C(g+8, 2t), C(g+8, 2t+1)
//   ldmatrix_xN: lanes 8i..8i+7 give the addresses of the 8 rows (16 bytes each, 16-byte
//     aligned) of matrix i; r[i] of lane l holds row l/4, 16-bit columns 2(l%4) and 2(l%4)+1
//     of matrix i (_trans: of its transpose). Every lane of the warp must execute it.
//   So ldmatrix_x4 over a 16×16 bf16 tile (lanes 0-15 rows 0-15 at column 0, lanes 16-31
//   rows 0-15 at column 8) yields exactly the A fragment, and ldmatrix_x2 over B stored n-major
//   (a row per column n, k contiguous) the B fragment; for TF32 the same holds with 8×4 fp32
//   matrices (a 16-bit column pair is one fp32 element).
#pragma once

#ifndef MINIDL_PTX_EMULATED

// A shared-memory address (the .shared state space, 32 bits): computed once from a pointer,
// then plain integer arithmetic, so that address math stays in 32-bit registers and no
// generic-to-shared conversion lands in a kernel's main loop.
using SharedAddress = unsigned;
__device__ __forceinline__ SharedAddress shared_address(const void* pointer) {
    return static_cast<SharedAddress>(__cvta_generic_to_shared(pointer));
}

// ldmatrix reads shared memory that earlier __syncthreads/__syncwarp calls ordered, and
// `volatile` keeps it in program order with the other asm here; no "memory" clobber, so the
// compiler may still keep unrelated values in registers across it.
__device__ __forceinline__ void ldmatrix_x1(unsigned (&r)[1], SharedAddress row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], SharedAddress row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], SharedAddress row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x1_trans(unsigned (&r)[1], SharedAddress row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0]) : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned (&r)[2], SharedAddress row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], SharedAddress row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(row));
}

// the 32-bit word at a shared address (volatile, like the other shared-memory reads here: it
// stays after the barrier that publishes the data)
__device__ __forceinline__ unsigned lds_32(SharedAddress address) {
    unsigned value;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(address));
    return value;
}

// 16 bytes at a 16-byte aligned shared address as four 32-bit words, and back; the store is
// predicated (no branch) and happens only where `store` holds
__device__ __forceinline__ void lds_128(unsigned (&r)[4], SharedAddress address) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
__device__ __forceinline__ void sts_128_if(SharedAddress address, const unsigned (&r)[4], bool store) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n}\n"
                 :: "r"(address), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]), "r"(int(store)) : "memory");
}

// d = a·b + c on one warp's 16×8 tile (row-major A, column-major B), fp32 accumulation
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                  const float (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
__device__ __forceinline__ void mma_tf32_m16n8k8(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                 const float (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// 16 bytes global -> shared, bypassing L1; fill == false writes 16 zero bytes and reads nothing
// (src-size 0). The data may be read only after the cp_async_wait that retires its group.
__device__ __forceinline__ void cp_async_16(SharedAddress smem, const void* global, bool fill) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem), "l"(global), "r"(fill ? 16 : 0) : "memory");
}
// closes the group of this thread's copies issued since the last commit
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// waits until at most N of this thread's most recent groups are pending
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// x rounded to TF32 (10 mantissa bits, to nearest, ties away from zero), as fp32 bits
__device__ __forceinline__ unsigned tf32_bits(float x) {
    unsigned bits;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(bits) : "f"(x));
    return bits;
}

// relu(a·b + c) on two pairs of bf16 (the lower element in the low 16 bits), each computed
// exactly and rounded once to nearest even (fma.rn.relu.bf16x2, sm_80 and later)
__device__ __forceinline__ unsigned fma_relu_bf16x2(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("fma.rn.relu.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

#endif  // MINIDL_PTX_EMULATED
