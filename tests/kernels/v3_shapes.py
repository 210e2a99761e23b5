"""The shapes the v3 convolutions (kernels/conv_v3.cu) are checked on, under the emulator
(test_emulated_conv_v3.py) and then on the first GPU that runs them (gpu_cases.py's v3 group):
(n, h, w, c, k, r, stride, padding) per pass, the reduction's channels a multiple of 64 where the
pass gathers them (fwd: C, dgrad: K), every other edge a multiple of no tile."""
SHAPES = {"conv_fwd": [(1, 5, 7, 64, 72, 3, 1, 1), (2, 7, 6, 64, 40, 3, 2, 1), (1, 9, 9, 64, 16, 7, 2, 3)],
          "conv_dgrad": [(1, 5, 7, 72, 64, 3, 1, 1), (2, 7, 6, 40, 64, 3, 2, 1), (2, 6, 5, 24, 64, 1, 2, 0)],
          "conv_wgrad": [(1, 5, 7, 72, 40, 3, 1, 1), (2, 7, 6, 16, 24, 3, 2, 1), (1, 9, 9, 8, 16, 7, 2, 3)]}
