"""`python -m minidl.figures DIR` redraws every picture, and what the pictures are read from is
what the code does: the swizzle read from kernels/conv_v2.cu spreads an ldmatrix over 8 bank
groups, the torus groups read from the engine's plans are the grid's rows and columns."""
import shutil
from pathlib import Path

import pytest

from minidl.figures import __main__ as figures, gemm, torus

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_the_command_writes_every_png(tmp_path, capsys):
    shutil.copy(ROOT / "docs" / "figures" / figures.TRACE, tmp_path / figures.TRACE)
    assert figures.main([str(tmp_path)]) == 0
    written = capsys.readouterr().out.split()
    assert [Path(p).name for p in written] == ["gemm_tiling.png", "smem_swizzle.png", "torus_stages.png",
                                               "bucket_overlap.png", "sony_schedule.png"]
    for path in written:
        data = Path(path).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000, path
    assert sorted(p.name for p in (ROOT / "docs" / "figures").glob("*.png")) == sorted(Path(p).name for p in written)


def test_bad_arguments_and_a_missing_trace_are_one_line_and_exit_2(tmp_path, capsys):
    assert figures.main(["a", "b"]) == 2
    assert figures.main([str(tmp_path)]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and "usage" in errors[0] and "trace.json is missing" in errors[1]


@pytest.mark.parametrize("row_chunks", [4, 8, 16])
def test_the_swizzle_read_from_the_source_spreads_an_ldmatrix_over_8_bank_groups(row_chunks):
    """Each row stays a permutation of its chunks, and the 8 rows an ldmatrix reads at one chunk
    fall in 8 different 16-byte bank groups (128 bytes of 32 banks), as conv_v2.cu claims."""
    swizzle = gemm.swizzle_function()
    for row in range(32):
        assert sorted(swizzle(row, chunk, row_chunks) for chunk in range(row_chunks)) == list(range(row_chunks))
    for first in range(0, 32, 8):
        for chunk in range(row_chunks):
            groups = {(row * row_chunks + swizzle(row, chunk, row_chunks)) % 8 for row in range(first, first + 8)}
            assert len(groups) == 8, (row_chunks, first, chunk, groups)


def test_the_mma_shapes_are_the_ptx_isas():
    assert gemm.mma_shape("bf16") == (16, 8, 16) and gemm.mma_shape("tf32") == (16, 8, 8)


@pytest.mark.parametrize("shape", [(2, 4), (4, 2), (3, 2)])
def test_the_torus_groups_from_the_plans_are_rows_and_columns(shape):
    x, y = shape
    stages = torus.stage_groups(shape)
    rows = [tuple(range(row * x, (row + 1) * x)) for row in range(y)]
    columns = [tuple(range(column, x * y, x)) for column in range(x)]
    assert [(op, group) for op, group, _, _ in stages] == [("reduce_scatter", "row"), ("allreduce", "column"),
                                                           ("allgather", "row")]
    assert stages[0][3] == stages[2][3] == rows and stages[1][3] == columns
    steps = sum(torus.STEPS[op] * (len(groups[0]) - 1) for op, _, _, groups in stages)
    assert steps == 2 * (x - 1) + 2 * (y - 1)
