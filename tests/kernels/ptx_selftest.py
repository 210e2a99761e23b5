"""ptx_selftest.cu and its kernels as name expressions (the templates as the tests instantiate
them), for the emulation tests, the nvcc and NVRTC compile checks and the SASS audit test."""
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "ptx_selftest.cu"
LDMATRIX = tuple(f"ldmatrix_rows<{m}, {t}>" for m in (1, 2, 4) for t in ("false", "true"))
KERNELS = LDMATRIX + ("mma_fragments<true>", "mma_fragments<false>", "tile_gemm<true, 0>", "tile_gemm<false, 0>",
                      "tile_gemm<true, 1>", "round_tf32", "fma_relu_pairs", "quotients")
