"""The SASS audit (python -m minidl.bench sass): on code whose main loop is known, on today's
tensor-core families, and the bar every v2 tensor-core kernel (a "_v2" kernel of a V2Tile) must clear.
`pytest -s` prints the audit table."""
import json
import re

import pytest

import ptx_selftest
from minidl.bench import sass
from minidl.bench._nvcc import find_nvcc
from minidl.errors import UserError
from minidl.kernels.conv import TILES
from minidl.kernels.conv_v2 import NORMALIZE

SOURCES = sass.default_sources()
V2_KERNELS = [(family, name) for family, _, names, _ in SOURCES for name in names if "_v2<V2Tile" in name]
REQUIRED = ("kernel", "loop_instructions", "loop_mma", "loop_ldsm", "loop_generic_memory", "local_memory_bytes",
            "registers", "spill_bytes")
LOOP_FIELDS = ("loop_instructions", "loop_mma", "instructions_per_mma", "loop_ldsm", "loop_ldgsts",
               "loop_ldgsts_128", "loop_generic_memory", "loop_movm")


def same_name(a, b):  # a name expression against a demangled name: spacing aside
    return a.replace(" ", "") == b.replace(" ", "")


@pytest.fixture(scope="module")
def tools():
    if find_nvcc() is None:
        pytest.skip("nvcc not found (PATH, $CUDA_PATH/bin, /usr/local/cuda/bin): the SASS audit compiles with it")
    if sass.find_nvdisasm() is None:
        pytest.skip(f"nvdisasm not found: {sass.DISASSEMBLER_WHEELS}")


@pytest.fixture(scope="module")
def default_rows(tools):
    rows = [{"family": f, **row} for f, path, names, options in SOURCES for row in sass.audit(path, names, options)]
    print("\n" + sass.table(rows))
    return rows


def instructions(*lines):
    return [sass.Instruction(opcode, operands) for opcode, _, operands in (line.partition(" ") for line in lines)]


def test_main_loop_is_the_innermost_with_mma_and_copies_and_nested_loops_count_once():
    code = instructions("S2R R0,SR_TID.X",             # 0   outer loop head (no copies of its own)
                        "LDGSTS.E.BYPASS.128 [R1],desc[UR4][R2.64]",  # 1   main loop head
                        "HMMA.16816.F32.BF16 R4,R8,R2,R4",            # 2   a k-step loop inside
                        "LDSM.16.M88.4 R8,[R3]",
                        "BRA 0x20",                     # 4   back to 2
                        "LD.E R5,desc[UR4][R6.64]",
                        "BRA 0x10",                     # 6   back to 1: the main loop is 1..6
                        "BRA 0x0",                      # 7   back to 0: larger, not innermost
                        "EXIT",
                        "BRA 0x90")                     # 9   the trap loop after EXIT
    assert sass.main_loop(code) == (1, 6)
    row = sass.audit_kernel("k", code, {"registers": 8, "stack_bytes": 0, "spill_store_bytes": 0,
                                        "spill_load_bytes": 0})
    assert (row["loop_instructions"], row["loop_mma"], row["loop_ldsm"], row["loop_ldgsts"],
            row["loop_ldgsts_128"], row["loop_generic_memory"]) == (6, 1, 1, 1, 1, 1)
    assert row["instructions_per_mma"] == 6.0


def test_a_known_kernel(tools):
    """tile_gemm's k-tile loop, by its source: one mma, ldmatrix x4 and x2, two 16-byte cp.async
    (A, and Bᵀ from half the lanes); quotients divides once by a runtime value."""
    rows = {r["kernel"]: r for r in sass.audit(ptx_selftest.SOURCE, ("tile_gemm<true, 0>", "quotients"), ("-std=c++17",))}
    loop = rows["tile_gemm<true, 0>"]
    assert (loop["loop_mma"], loop["loop_ldsm"], loop["loop_ldgsts"], loop["loop_ldgsts_128"],
            loop["loop_generic_memory"], loop["loop_movm"]) == (1, 2, 2, 2, 0, 0)
    assert 10 < loop["loop_instructions"] == loop["instructions_per_mma"] < 100
    assert loop["local_memory_bytes"] == loop["local_loads_stores"] == loop["spill_bytes"] == 0
    assert loop["integer_divisions"] == 0
    assert rows["quotients"]["integer_divisions"] == 1
    assert all(rows["quotients"][key] is None for key in LOOP_FIELDS)


def test_every_kernel_of_the_tensor_core_families_has_a_well_formed_row(default_rows):
    assert SOURCES, "no tensor-core family found in minidl.kernels"
    for family, _, names, _ in SOURCES:
        rows = [r for r in default_rows if r["family"] == family]
        for name in names:
            assert any(same_name(name, r["kernel"]) for r in rows), f"{family}: no row for {name}"
    for row in default_rows:
        assert all(key in row for key in REQUIRED), row
        assert isinstance(row["registers"], int) and row["spill_bytes"] == 0, row
        loop = [row[key] for key in LOOP_FIELDS]
        assert all(v is None for v in loop) or (all(v is not None for v in loop) and row["loop_mma"] > 0), row
        if row["loop_mma"]:
            assert row["instructions_per_mma"] == row["loop_instructions"] / row["loop_mma"]
    tensor_core_tiles = [t.template.replace(" ", "") for t in TILES.values() if t.tensor_cores]
    tensor_core_rows = [r for r in default_rows if any(t in r["kernel"].replace(" ", "") for t in tensor_core_tiles)]
    assert tensor_core_rows and all(r["loop_mma"] for r in tensor_core_rows), "a WMMA kernel without a main loop"


def test_the_audit_has_v2_kernels_to_hold_to_the_bar():
    assert V2_KERNELS, "no family in minidl.kernels.FAMILIES has a _v2 kernel of a V2Tile"


def normalizes(kernel):
    """Whether a v2 kernel's FUSE argument (its last template argument) has FUSE_NORMALIZE."""
    return bool(int(re.search(r"(\d+)\s*>$", kernel).group(1)) & NORMALIZE)


@pytest.mark.parametrize("family, kernel", V2_KERNELS)
def test_v2_main_loop_meets_the_bar(default_rows, family, kernel):
    """docs/design.md §3: fragments through LDSM, no generic LD/ST in the main loop, no local memory,
    and at most 2.5 instructions per HMMA; a kernel that also normalizes its operand in shared
    memory (a 16-byte read, fma.rn.relu per element pair, a predicated 16-byte write per chunk)
    at most 4."""
    row = next(r for r in default_rows if r["family"] == family and same_name(kernel, r["kernel"]))
    assert row["local_memory_bytes"] == 0 and row["local_loads_stores"] == 0, row
    assert row["loop_mma"], f"{kernel}: no loop holds both HMMA and LDGSTS"
    assert row["loop_generic_memory"] == 0 and row["loop_ldsm"] > 0, row
    assert row["instructions_per_mma"] <= (4.0 if normalizes(kernel) else 2.5), row


def test_command_line_writes_the_rows_as_json(tools, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sass, "default_sources",
                        lambda: [("ptx_selftest", ptx_selftest.SOURCE, ("quotients",), ("-std=c++17",))])
    report = tmp_path / "sass.json"
    assert sass.main(["--json", str(report)]) == 0
    rows = json.loads(report.read_text())
    assert ("ptx_selftest", "quotients") in [(r["family"], r["kernel"]) for r in rows]
    assert all(set(REQUIRED) <= set(r) for r in rows) and "ptx_selftest: quotients" in capsys.readouterr().out
    with pytest.raises(UserError, match="no tensor-core family conv7"):
        sass.main(["conv7"])


V3_BAR = 24.0  # instructions per HGMMA (m64nBNk16) in a consumer's loop: per stage a wait, a fence, 4 descriptors, an arrive


def test_v3_main_loops_issue_hgmma_and_meet_the_bar(default_rows):
    """The wgmma kernels (sm_90a; conv_v3 is among the default sources, audited there): the
    consumers' loop issues HGMMA and no HMMA, no generic loads or stores, and at most V3_BAR
    instructions per HGMMA; no local memory, no spills, and no ptxas warning (C7508: setmaxnreg's
    counts not honoured)."""
    from minidl.kernels import conv_v3, loader
    path = loader.source_path(conv_v3.FAMILY)
    log = sass.compile_cubin(path, conv_v3.NAMES, loader.compile_options(conv_v3.DEFINES), arch="sm_90a").log
    assert "warning" not in log.lower(), log
    rows = [row for row in default_rows if row["family"] == conv_v3.FAMILY and "_v3<V3Tile" in row["kernel"]]
    assert len(rows) == len([name for name in conv_v3.NAMES if "_v3<V3Tile" in name])  # not the split-K sums
    for row in rows:
        assert row["loop_hgmma"] and row["loop_hgmma"] == row["loop_mma"], row
        assert row["loop_generic_memory"] == 0 and row["local_loads_stores"] == 0, row
        assert row["local_memory_bytes"] == 0 and row["spill_bytes"] == 0, row
        assert row["instructions_per_mma"] <= V3_BAR, row
