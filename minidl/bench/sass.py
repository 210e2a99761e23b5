"""`python -m minidl.bench sass [--json FILE] [FAMILY ...]`: tensor-core kernel quality read from
the machine code (SASS), without a GPU.

Each tensor-core family of kernels/*.cu is compiled for sm_90 (sm_90a where it includes wgmma.cuh)
and disassembled by nvdisasm; per kernel its main loop (the innermost loop holding both HMMA and
LDGSTS, or HGMMA) is counted: instructions per MMA (HMMA or HGMMA), HGMMA, LDSM, LDGSTS, generic
memory, MOVM, integer divisions, local memory, registers, spills. docs/design.md §3 says what good
looks like; `audit(path, names, options)` audits any source.

Details: docs/kernels.md, "minidl/bench/sass.py".
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from minidl.bench._nvcc import ARCH, compile_cubin, find_nvcc
from minidl.errors import UserError
from minidl.fileio import writable, write_json_atomic

DISASSEMBLER_WHEELS = "pip install nvidia-cuda-cuobjdump==13.2.* nvidia-cuda-nvdisasm==13.2.*"
TENSOR_CORE_SOURCE = re.compile(r"\bwmma::|\bmma_\w+\(|ptx\.cuh")
HOPPER_SOURCE = re.compile(r'#include "wgmma\.cuh"')  # built for sm_90a
INSTRUCTION_BYTES = 16  # sm_70 and later
DIVISION_WINDOW = 64    # how far apart the scheduler may place the steps of a division
GENERIC_MEMORY = {"LD", "ST"}  # LDS/STS, LDG/STG, LDL/STL, LDSM, LDGSTS name their state space


def default_sources():
    """(family, path, kernel name expressions, compiler options) of every family whose source
    uses tensor cores: the one place that reads minidl.kernels' family table."""
    from minidl.kernels import FAMILIES, loader
    return [(family, loader.source_path(family), module.NAMES, loader.compile_options(module.DEFINES))
            for family, module in FAMILIES.items() if TENSOR_CORE_SOURCE.search(loader.source_path(family).read_text())]


def find_nvdisasm():
    """nvdisasm from an installed nvidia wheel (nvidia/<package>/bin), else from the CUDA toolkit."""
    wheels = [f for p in sys.path if p for f in sorted(glob.glob(os.path.join(p, "nvidia", "*", "bin", "nvdisasm")))]
    candidates = wheels + [shutil.which("nvdisasm"), os.path.join(os.environ.get("CUDA_PATH", "/usr/local/cuda"),
                                                                  "bin", "nvdisasm")]
    return next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


@dataclass(frozen=True)
class Instruction:
    opcode: str    # with modifiers: "HMMA.16816.F32.BF16"
    operands: str  # comma-separated: "R4,R8,R2,R4"

    @property
    def base(self):
        return self.opcode.split(".")[0]

    def destination(self):  # the first operand: a register for the ALU instructions that matter here
        return self.operands.split(",")[0].split(".")[0]

    def sources(self):
        return set(re.findall(r"\bR\d+\b", self.operands.partition(",")[2]))


def disassemble(cubin, nvdisasm):
    """{mangled kernel name: [Instruction]} of a cubin (nvdisasm -json)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.cubin"
        path.write_bytes(cubin)
        result = subprocess.run([nvdisasm, "-json", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {result.stderr.strip()}")
    sections = json.loads(result.stdout)
    functions = next(s for s in sections if isinstance(s, list))
    return {f["function-name"]: [Instruction(i["opcode"], i.get("operands", "")) for i in f["sass-instructions"]]
            for f in functions}


def main_loop(instructions):
    """(first, last) instruction index of the innermost loop holding both HMMA and LDGSTS, or
    HGMMA (a warp-specialized kernel's consumers: their copies are another warpgroup's loop), or None."""
    ends = {}  # loop head -> its last backward branch
    for i, instruction in enumerate(instructions):
        target = re.search(r"0x([0-9a-f]+)$", instruction.operands)
        if instruction.base == "BRA" and target and int(target.group(1), 16) // INSTRUCTION_BYTES <= i:
            head = int(target.group(1), 16) // INSTRUCTION_BYTES
            ends[head] = max(ends.get(head, i), i)
    loops = [(head, end) for head, end in ends.items()
             if {"HMMA", "LDGSTS"} <= {x.base for x in instructions[head:end + 1]}
             or "HGMMA" in {x.base for x in instructions[head:end + 1]}]
    return min(loops, key=lambda loop: loop[1] - loop[0], default=None)


def integer_divisions(instructions):
    """How many MUFU.RCP take the reciprocal of an I2F result that, adjusted, reaches an F2I: the
    sequence nvcc emits for a 32-bit integer division or remainder by a runtime value."""
    count = 0
    for i, instruction in enumerate(instructions):
        if not instruction.opcode.startswith("MUFU.RCP"):
            continue
        source = next(iter(instruction.sources()), None)
        writer = next((x for x in reversed(instructions[:i]) if x.destination() == source), None)
        count += writer is not None and writer.base == "I2F" and _reaches_f2i(instructions, i)
    return count


def _reaches_f2i(instructions, start, steps=3):
    """Whether the value written at `start` flows into an F2I within `steps` consuming instructions."""
    value = instructions[start].destination()
    for _ in range(steps):
        reader = next((i for i in range(start + 1, min(len(instructions), start + 1 + DIVISION_WINDOW))
                       if value in instructions[i].sources()), None)
        if reader is None:
            return False
        if instructions[reader].base == "F2I":
            return True
        start, value = reader, instructions[reader].destination()
    return False


def audit_kernel(name, instructions, resources):
    """One row of the audit (see the module's docstring); the loop fields are None without a main loop."""
    spills = resources.get("spill_store_bytes", 0) + resources.get("spill_load_bytes", 0)
    row = {"kernel": name, "registers": resources.get("registers"), "spill_bytes": spills,
           "local_memory_bytes": resources.get("stack_bytes"),
           "local_loads_stores": sum(x.base in ("LDL", "STL") for x in instructions),
           "integer_divisions": integer_divisions(instructions)}
    loop = main_loop(instructions)
    body = instructions[loop[0]:loop[1] + 1] if loop else None
    counts = {"loop_instructions": lambda x: True, "loop_mma": lambda x: x.base in ("HMMA", "HGMMA"),
              "loop_hgmma": lambda x: x.base == "HGMMA",
              "loop_ldsm": lambda x: x.base == "LDSM", "loop_ldgsts": lambda x: x.base == "LDGSTS",
              "loop_ldgsts_128": lambda x: x.base == "LDGSTS" and ".128" in x.opcode,
              "loop_generic_memory": lambda x: x.base in GENERIC_MEMORY, "loop_movm": lambda x: x.base == "MOVM"}
    for key, wanted in counts.items():
        row[key] = sum(map(wanted, body)) if body else None
    row["instructions_per_mma"] = row["loop_instructions"] / row["loop_mma"] if body else None
    return row


def audit(path, names, options=(), nvcc=None, nvdisasm=None):
    """Rows for every kernel of the .cu at `path`, compiled with the kernel name expressions
    `names` instantiated and the extra nvcc `options` (-D, -I, ...)."""
    nvcc, nvdisasm = nvcc or find_nvcc(), nvdisasm or find_nvdisasm()
    if nvcc is None:
        raise UserError("no nvcc found (PATH, $CUDA_PATH/bin, /usr/local/cuda/bin): install the CUDA toolkit")
    if nvdisasm is None:
        raise UserError(f"no nvdisasm found (an nvidia wheel's bin, PATH, $CUDA_PATH/bin): {DISASSEMBLER_WHEELS}")
    arch = "sm_90a" if HOPPER_SOURCE.search(Path(path).read_text()) else ARCH
    compiled = compile_cubin(path, names, options, nvcc, arch)
    if compiled.returncode != 0:
        raise UserError(f"nvcc failed on {path}: {compiled.log.strip().splitlines()[-1]}")
    functions = disassemble(compiled.cubin, nvdisasm)
    return [audit_kernel(name, functions[mangled], compiled.resources[name])
            for mangled, name in compiled.names.items()]  # the kernels ptxas compiled, not their subroutines


COLUMNS = (("loop", "loop_instructions"), ("mma", "loop_mma"), ("ins/mma", "instructions_per_mma"),
           ("ldsm", "loop_ldsm"), ("ldgsts", "loop_ldgsts"), ("of 128", "loop_ldgsts_128"),
           ("generic", "loop_generic_memory"), ("movm", "loop_movm"), ("idiv", "integer_divisions"),
           ("ldl/stl", "local_loads_stores"), ("stack", "local_memory_bytes"), ("regs", "registers"),
           ("spill", "spill_bytes"))


def _cell(value):
    return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def table(rows):
    lines = [f"{'kernel':40}" + "".join(f" {title:>7}" for title, _ in COLUMNS)]
    for r in rows:
        lines.append(f"{r['family'] + ': ' + r['kernel']:40}" + "".join(f" {_cell(r[key]):>7}" for _, key in COLUMNS))
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(prog="python -m minidl.bench sass", description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help="kernels/<FAMILY>.cu to audit (default: every tensor-core family)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows here, as a JSON list")
    args = parser.parse_args(argv)
    if args.json:  # before auditing, not after
        writable("--json", args.json)
    sources = default_sources()
    unknown = set(args.families) - {family for family, *_ in sources}
    if unknown:
        raise UserError(f"no tensor-core family {', '.join(sorted(unknown))}: choose from "
                        f"{', '.join(family for family, *_ in sources)}")
    rows = []
    for family, path, names, options in sources:
        if not args.families or family in args.families:
            rows += [{"family": family, **row} for row in audit(path, names, options)]
    print(table(rows))
    if args.json:
        write_json_atomic(args.json, rows)
    return 0
