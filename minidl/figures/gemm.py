"""The implicit GEMM of one convolution cut into the v2 kernel's block tiles, warp tiles and
mma fragments, and the XOR swizzle of its shared-memory rows.

The tile sizes are a V2Tile of minidl/kernels/conv_v2.py, the fragment shape is the mma
instruction of kernels/ptx.cuh, and the swizzle is the expression of `swizzle` in
kernels/conv_v2.cu, read from the source and evaluated here with C's integer operators: the
pictures change when the code does.
"""
import re

from matplotlib.patches import Rectangle

from minidl.bench.kernels import resnet50_layers
from minidl.kernels import conv_v2, loader
from minidl.figures.style import new_figure

LAYER = "layer4.0.conv2 3x3/2"  # ResNet-50's, at batch 32: a 1568 × 512 product, an edge in the last block row
TILE = "bf16_128x256"
BANK_GROUP_BYTES, CHUNK_BYTES = 128, 16  # 32 banks of 4 bytes; a cp.async / ldmatrix row is 16 bytes


def mma_shape(precision="bf16"):
    """(m, n, k) of the kernels' mma.sync instruction for `precision`, read from kernels/ptx.cuh."""
    source = (loader.source_dir() / "ptx.cuh").read_text()
    found = re.search(rf"mma\.sync\.aligned\.m(\d+)n(\d+)k(\d+)\.row\.col\.f32\.{precision}", source)
    return tuple(int(v) for v in found.groups())


def swizzle_function():
    """`swizzle<ROW_CHUNKS>(row, chunk)` of kernels/conv_v2.cu as a Python function of (row, chunk,
    row_chunks): its GROUPS constant and return expression, with C's `/` on non-negative ints."""
    source = (loader.source_dir() / "conv_v2.cu").read_text()
    body = re.search(r"int swizzle\(int row, int chunk\) \{(.*?)\}", source, re.S).group(1)
    groups = re.search(r"GROUPS = (.*?);", body).group(1)
    result = re.search(r"return (.*?);", body).group(1)

    def python(expression):  # C's ?: and integer / in Python's words
        expression = re.sub(r"(\S+) < (\S+) \? (\S+) : (\S+)", r"(\3 if \1 < \2 else \4)", expression)
        return expression.replace("/", "//")

    groups_code, result_code = compile(python(groups), "swizzle", "eval"), compile(python(result), "swizzle", "eval")

    def swizzle(row, chunk, row_chunks):
        names = {"ROW_CHUNKS": row_chunks, "row": row, "chunk": chunk}
        names["GROUPS"] = eval(groups_code, {"__builtins__": {}}, names)
        return eval(result_code, {"__builtins__": {}}, names)
    return swizzle


def _grid(axes, width, height, step_x, step_y, color, linewidth):
    for x in range(0, width + 1, step_x):
        axes.plot([x, x], [0, height], color=color, linewidth=linewidth)
    for y in range(0, height + 1, step_y):
        axes.plot([0, width], [y, y], color=color, linewidth=linewidth)


def _panel(axes, width, height, title, xlabel, ylabel):
    axes.set_xlim(-0.02 * width, 1.02 * width)
    axes.set_ylim(1.02 * height, -0.02 * height)  # row 0 on top, as a matrix
    axes.set_aspect("equal")
    axes.set_title(title, fontsize=9)
    axes.set_xlabel(xlabel, fontsize=8)
    axes.set_ylabel(ylabel, fontsize=8)
    axes.tick_params(labelsize=7)


def tiling_figure():
    """Three panels: the output matrix in block tiles, one block in warp tiles, one warp tile in
    mma fragments."""
    n, h, w, c, k, r, stride, padding = dict(resnet50_layers(32))[LAYER]
    p = (h + 2 * padding - r) // stride + 1
    rows, columns, reduction = n * p * p, k, r * r * c
    tile = conv_v2.TILES[TILE]
    mma_m, mma_n, mma_k = mma_shape("bf16")
    figure, (whole, block, warp) = new_figure(1, 3, (13, 5.2))
    padded_rows = -(-rows // tile.bm) * tile.bm
    axes = whole
    axes.add_patch(Rectangle((0, 0), columns, rows, color="#dde6f0"))
    _grid(axes, columns, padded_rows, tile.bn, tile.bm, "#4c72b0", 0.8)
    axes.add_patch(Rectangle((0, 0), tile.bn, tile.bm, color="#dd8452", alpha=0.8))
    axes.add_patch(Rectangle((0, rows), columns, padded_rows - rows, hatch="///", fill=False, color="#999999"))
    _panel(axes, columns, padded_rows, f"{LAYER}, batch {n}\nC = A·B: {rows}×{columns}, k = R·S·C = {reduction}\n"
           f"{padded_rows // tile.bm}×{columns // tile.bn} blocks of {tile.bm}×{tile.bn}\n"
           "(hatched: past the last pixel, masked)", "N: output channel k", "M: output pixel (n, p, q)")
    axes = block
    warps_m, warps_n = tile.bm // tile.wm, tile.bn // tile.wn
    _grid(axes, tile.bn, tile.bm, tile.wn, tile.wm, "#4c72b0", 1.2)
    axes.add_patch(Rectangle((0, 0), tile.wn, tile.wm, color="#55a868", alpha=0.8))
    for i in range(warps_m):
        for j in range(warps_n):
            axes.text((j + 0.5) * tile.wn, (i + 0.5) * tile.wm, f"warp {i * warps_n + j}", ha="center",
                      va="center", fontsize=8)
    _panel(axes, tile.bn, tile.bm, f"one block ({tile.threads} threads): {warps_m}×{warps_n} warps of "
           f"{tile.wm}×{tile.wn};\nk in stages of BK = {tile.bk}, {tile.stages} in flight", "", "")
    axes = warp
    _grid(axes, tile.wn, tile.wm, mma_n, mma_m, "#55a868", 1.0)
    axes.add_patch(Rectangle((0, 0), mma_n, mma_m, color="#c44e52", alpha=0.8))
    _panel(axes, tile.wn, tile.wm, f"one warp: {tile.wm // mma_m}×{tile.wn // mma_n} accumulators of {mma_m}×{mma_n}\n"
           f"(mma.sync m{mma_m}n{mma_n}k{mma_k}: {tile.bk // mma_k} k-steps per stage)", "", "")
    figure.suptitle(f"implicit GEMM of the v2 convolution, tile {TILE} (minidl/kernels/conv_v2.py)", fontsize=10)
    return figure


def swizzle_figure(rows=16, row_chunks=8):
    """Where each 16-byte chunk of a K-major bf16 tile row lands (row_chunks = BK·2 bytes / 16):
    left the logical tile, right the shared-memory layout; one ldmatrix's 8 rows at one chunk
    marked in both."""
    swizzle = swizzle_function()
    figure, (logical, physical) = new_figure(1, 2, (10, 6))
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c"]
    for row in range(rows):
        for chunk in range(row_chunks):
            place = swizzle(row, chunk, row_chunks)
            marked = chunk == 0 and row < 8  # the rows one ldmatrix reads at chunk 0
            for axes, x in ((logical, chunk), (physical, place)):
                axes.add_patch(Rectangle((x, row), 1, 1, facecolor=colors[chunk % len(colors)], alpha=0.9 if marked else 0.35,
                                         linewidth=2 if marked else 0.5, edgecolor="black"))
                axes.text(x + 0.5, row + 0.5, str(chunk), ha="center", va="center", fontsize=7)
    per_group = BANK_GROUP_BYTES // CHUNK_BYTES
    for axes, title, xlabel in ((logical, "logical tile: chunk c of row r", "chunk (16 bytes) within the row"),
                                (physical, f"shared memory: chunk c of row r at c ^ f(r)\n"
                                 f"(swizzle<{row_chunks}>, kernels/conv_v2.cu)",
                                 f"16-byte slot within the row = bank group (of {per_group} per 128 bytes)")):
        axes.set_xlim(0, row_chunks)
        axes.set_ylim(rows, 0)
        axes.set_xticks([i + 0.5 for i in range(row_chunks)], range(row_chunks), fontsize=7)
        axes.set_yticks([i + 0.5 for i in range(rows)], range(rows), fontsize=7)
        axes.set_title(title, fontsize=9)
        axes.set_xlabel(xlabel, fontsize=8)
        axes.set_ylabel("row", fontsize=8)
    figure.suptitle("bold: the 8 rows one ldmatrix reads at chunk 0 — 8 different bank groups after the swizzle, "
                    "so the read takes one pass", fontsize=9)
    return figure
