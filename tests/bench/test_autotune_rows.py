"""The rows of `python -m minidl.bench autotune` against figures written here: v1's time against
the fastest timed plan of each later version (v2, v3), a version with no timed plan left empty."""
from minidl.bench import autotune


def candidate(plan, seconds, status="ok"):
    return {"plan": plan, "status": status, "seconds": seconds, "max_error": 0.0, "error": None}


def test_each_version_is_its_fastest_timed_plan_against_v1():
    candidates = [candidate("v1:Bf16Tile:1", 0.010), candidate("v2:bf16_128x256:1", 0.008),
                  candidate("v2:bf16_128x128:2", 0.005), candidate("v3:bf16_128x128:1", 0.002),
                  candidate("v3:bf16_128x256:1", None, "failed")]
    row = autotune.row_of("conv_fwd key", candidates, "v3:bf16_128x128:1")
    assert (row["v1_ms"], row["best_v2_ms"], row["best_v3_ms"]) == (10.0, 5.0, 2.0)
    assert (row["v2_speedup"], row["v3_speedup"]) == (2.0, 5.0)
    line = autotune.format_row(row)
    assert "10.000    5.000    2.000   2.00   5.00  v3:bf16_128x128:1" in line
    assert line.endswith("(not usable: v3:bf16_128x256:1)")
    alone = autotune.row_of("conv_fwd key", candidates[:3], "v2:bf16_128x128:2")
    assert alone["best_v3_ms"] is None and alone["v3_speedup"] is None
    assert autotune.HEADER.split()[-9:] == ["v1", "ms", "v2", "ms", "v3", "ms", "v1/v2", "v1/v3", "choice"]
