"""Every kernels/*.cu compiles with `nvcc -arch=sm_90 -cubin -Xptxas -v` (conv_v3 for sm_90a;
warnings are errors), every kernel minidl.kernels launches is in the cubin, and none spills
registers to local memory; the emulator's selftests compile too (the emulated semantics are
those of valid CUDA). `pytest -s` prints registers, spills and shared memory per kernel
(nvcc_check.py prints the same table standalone, or as JSON)."""
import pytest

import nvcc_check
from minidl.kernels import FAMILIES


@pytest.fixture(scope="module")
def compiled():
    nvcc = nvcc_check.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, $CUDA_PATH/bin, /usr/local/cuda/bin): the sm_90 compile check needs it")
    results = nvcc_check.compile_all(nvcc)
    print("\n" + nvcc_check.table(results))
    return results


@pytest.mark.parametrize("family", list(FAMILIES) + ["emu_selftest", "ptx_selftest"])
def test_compiles_without_spills(compiled, family):
    code, log, kernels = compiled[family]
    assert code == 0, f"nvcc failed on {family}:\n{log}"
    for name, resources in kernels.items():
        assert resources["spill_store_bytes"] == 0 and resources["spill_load_bytes"] == 0, f"{name} spills: {resources}"
        assert resources["stack_bytes"] == 0, f"{name} uses a stack frame: {resources}"
        assert resources["smem_bytes"] <= 48 * 1024, f"{name}: static shared memory over 48 KiB"


def test_every_launched_kernel_is_instantiated(compiled):
    """The demangled names cover each name expression exactly (templates included)."""
    for family, names in ((f, m.NAMES) for f, m in FAMILIES.items()):
        compiled_names = {k.replace(" ", "") for k in compiled[family][2]}  # c++filt writes "> >"
        for name in names:
            name = name.replace(" ", "")
            templated = "<" in name
            assert any(k.startswith(name) if templated else k == name for k in compiled_names), \
                f"{family}: {name} missing from {sorted(compiled_names)}"
