"""What README.md and docs/ state that the code can check, and the checks.

Each check takes a page's markdown and returns its problems, one line each, so a test can feed
it a whole page or one sentence. The facts come from the code itself: the trainer's parser and
`config.SETTINGS`, the flags each other command's source declares, the recipes,
`environment.VARIABLES`, the tree, and the string constants of the code that writes a file.
"""
import ast
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

from test_docs import FENCE, ROOT, defines, python_qualnames

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
INLINE_CODE = re.compile(r"`([^`\n]+)`")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
COMPILER_OPTIONS = {"--gpu-architecture"}  # NVRTC's, named in prose without a command

# ---- commands and their flags -------------------------------------------------------------------

# Where a command starts in a line of code, and which source declares its flags (None: another
# program's options, not checked). The last start before a flag owns it.
COMMANDS = [
    (re.compile(r"\b(?:mpiexec|mpirun|srun|sbatch|SBATCH|scancel|scontrol|munged|apt-get|unshare|mount|pip|nvcc|ncu"
                r"|compute-sanitizer|pytest|git)\b"), None),
    (re.compile(r"\btrain\.py\b|\bminidl-train\b|-m minidl\.train\b"), "train"),
    (re.compile(r"\bminidl-plan\b"), "minidl.plan"),
    (re.compile(r"\bminidl-prepare-imagenet\b|\bprepare_imagenet\.py\b"), "minidl.data.prepare_imagenet"),
    (re.compile(r"\bgpu_check\.sh\b"), "tests/gpu_check.sh"),
    (re.compile(r"\bptx_selftest\.py\b"), "tests/kernels/ptx_selftest.py"),
    (re.compile(r"-m (minidl(?:\.\w+)+)(?: (\w+))?"), "module"),
]


def module_sources(module, sub=None):
    """The files of `python -m module [sub]`: minidl.bench's sub-command, a module, or a package's modules."""
    path = ROOT.joinpath(*module.split("."))
    if sub and (path / f"{sub}.py").exists():
        return [path / f"{sub}.py"]
    if path.with_suffix(".py").exists():
        return [path.with_suffix(".py")]
    return sorted(path.glob("*.py"))


QUOTED_FLAG = re.compile(r"[\"'](--[a-z][a-z0-9-]*)[\"']")


def declared_flags(paths):
    """The `--flags` that these sources spell as string constants (with the --no- form of an on/off flag)."""
    flags = set()
    for path in paths:
        text = path.read_text()
        found = set(QUOTED_FLAG.findall(text) if path.suffix == ".py" else FLAG.findall(text))
        if "BooleanOptionalAction" in text:
            found |= {"--no-" + flag[2:] for flag in found}
        flags |= found
    return flags | {"--help"}


@lru_cache(maxsize=None)
def trainer_flags():
    from minidl.train import build_parser
    return frozenset(build_parser()._option_string_actions)


@lru_cache(maxsize=None)
def planner_flags():
    """The planner's own flags and the trainer's settings it shares."""
    from minidl.plan.__main__ import build_parser
    return frozenset(build_parser("minidl-plan")._option_string_actions)


@lru_cache(maxsize=None)
def command_flags(command, sub=None):
    if command == "train":
        return trainer_flags()
    if command == "minidl.plan" and sub is None:
        return planner_flags()
    if command.endswith((".sh", ".py")):
        return frozenset(declared_flags([ROOT / command]))
    return frozenset(declared_flags(module_sources(command, sub)))


@lru_cache(maxsize=None)
def every_command_flag():
    """Flags of any command: what a flag named in prose, without its command, must be one of."""
    modules = {"minidl." + ".".join(p.relative_to(ROOT / "minidl").with_suffix("").parts)
               for p in (ROOT / "minidl").rglob("*.py") if "argparse" in p.read_text() or "argv" in p.read_text()}
    flags = set(trainer_flags()) | planner_flags() | command_flags("tests/gpu_check.sh")
    for module in modules:
        flags |= declared_flags([ROOT.joinpath(*module.split(".")).with_suffix(".py")])
    return frozenset(flags)


def owner(code, position):
    """(command, sub) of the last command that starts before `position` in a line of code, else None."""
    best = None
    for pattern, command in COMMANDS:
        for match in pattern.finditer(code, 0, position):
            if best is None or match.start() > best[0]:
                found = (match[1], match[2]) if command == "module" else (command, None)
                best = (match.start(), found if command else ("other", None))
    return best and best[1]


def code_lines(markdown):
    """(line number, code) for each line of a fenced block and each inline code span outside them."""
    fenced = {m.start(): m.group() for m in FENCE.finditer(markdown)}
    lines = []
    for start, block in fenced.items():
        first = markdown.count("\n", 0, start) + 1
        command = ""  # a line ending in a backslash continues on the next: one command, numbered by its first line
        for i, line in enumerate(block.splitlines()[1:-1]):
            opened = i if not command else opened
            command += line.split(" #")[0]
            if not command.endswith("\\"):
                lines.append((first + opened, command))
                command = ""
    prose = FENCE.sub(lambda m: "\n" * m.group().count("\n"), markdown)
    for number, line in enumerate(prose.splitlines(), 1):
        lines += [(number, span.replace("\\|", "|")) for span in INLINE_CODE.findall(line)]  # a table's \| is |
    return lines


def flag_problems(markdown):
    found = []
    for number, code in code_lines(markdown):
        for match in FLAG.finditer(code):
            command = owner(code, match.start())
            if command and command[0] == "other" or match.group() in COMPILER_OPTIONS:
                continue
            known = command_flags(*command) if command else every_command_flag()
            if match.group() not in known:
                where = f"python -m {' '.join(filter(None, command))}" if command else "any command"
                found.append(f"line {number}: {match.group()} is not a flag of {where}")
    return found


# ---- values and defaults of the trainer's settings -----------------------------------------------

def settings():
    from minidl.config import SETTINGS
    return {flag: setting for setting in SETTINGS for flag in setting.flags}


def choices_of(setting):
    from minidl.config import RECIPES
    return tuple(RECIPES) if setting.name == "recipe" else setting.choices


VALUE = re.compile(r"(--[a-z][a-z0-9-]*)[ =]([a-z0-9][\w.|-]*)")


def value_problems(markdown):
    """`--flag a|b|c` lists every choice of a trainer setting; `--flag value` names one of them."""
    found, known = [], settings()
    for number, code in code_lines(markdown):
        for flag, value in VALUE.findall(code):
            setting = known.get(flag)
            if setting is None or not choices_of(setting) or owner(code, code.index(flag)) not in (None, ("train", None)):
                continue
            choices = set(map(str, choices_of(setting)))
            if "|" in value and set(value.split("|")) != choices:
                found.append(f"line {number}: {flag} {value}: its choices are {'|'.join(sorted(choices))}")
            elif "|" not in value and value not in choices:
                found.append(f"line {number}: {flag} {value}: not one of {', '.join(sorted(choices))}")
    return found


DEFAULT = re.compile(r"`(--[a-z][a-z0-9-]*)[^`]*`[^.;`]{0,30}?\(default:? `?([\w./]+)")


def setting_defaults(setting):
    from minidl.config import UNSET
    values = [setting.default, setting.base, setting.embedded, setting.imagenet, setting.note]
    return {str(v).lower() for v in values if v is not UNSET and v is not None}


def same_value(text, values):
    try:
        return any(float(text) == float(v) for v in values if re.fullmatch(r"[\d.e+-]+", v))
    except ValueError:
        return text.lower() in values


def default_problems(markdown):
    """`--flag` (default X) against the setting's defaults (its own, the base's, each profile's)."""
    found, known = [], settings()
    for number, line in enumerate(FENCE.sub("", markdown).splitlines(), 1):
        for flag, value in DEFAULT.findall(line):
            if flag in known and not (same_value(value, setting_defaults(known[flag]))
                                      or value.lower() in setting_defaults(known[flag])):
                found.append(f"line {number}: {flag} defaults to {sorted(setting_defaults(known[flag]))}, not {value}")
    return found


# ---- environment variables, paths, module names ---------------------------------------------------

VARIABLE = re.compile(r"\bMINIDL_[A-Z0-9_]+\b")


def variable_problems(markdown):
    from minidl.environment import VARIABLES
    return [f"{name}: not a variable of minidl/environment.py" for name in sorted(set(VARIABLE.findall(markdown)))
            if name not in VARIABLES]


TOP = {path.name for path in ROOT.iterdir()} - {".venv", ".git"}
REPO_PATH = re.compile(r"^(?P<path>[\w.-]+(?:/[\w.-]+)*/?)(?::(?P<qualname>[\w.]+))?$")
SOURCE_FILE = re.compile(r"^[\w-]+\.(py|cu|cuh|h|sh)$")


@lru_cache(maxsize=None)
def file_names():
    names = set()
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if name not in (".venv", ".git")]
        names.update(files)
    return frozenset(names)


defined = lru_cache(maxsize=None)(defines)


def git_ignored(path):
    """A file the tree does not hold because it is made (a report, a build): git ignores it."""
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0


def path_problems(markdown):
    """Each backticked repository path exists (with its `:qualname` where one is given); a bare
    source file name (`conv_v2.cu`) is some file of the tree."""
    found = []
    for _, token in code_lines(FENCE.sub("", markdown)):
        match = REPO_PATH.match(token)
        if not match:
            continue
        path, qualname = match["path"], match["qualname"]
        if "/" in path and path.split("/")[0] in TOP:
            if not (ROOT / path).exists() and not git_ignored(path):
                found.append(f"{path}: no such file or folder")
            elif qualname and not defined(ROOT / path, qualname):
                found.append(f"{path}:{qualname}: not defined there")
        elif "/" not in path and SOURCE_FILE.match(path) and path not in file_names():
            found.append(f"{path}: no file of that name")
    return found


DOTTED = re.compile(r"^minidl(?:\.\w+)+$")


def wheel_packages():
    """The packages the wheel installs, some of them folders outside minidl/ (minidl.cuda_sources)."""
    return set(re.findall(r'"(minidl[\w.]*)"', (ROOT / "pyproject.toml").read_text()))


def module_name_problems(markdown):
    """`minidl.a.b.Name`: the longest module prefix exists and defines (or imports) what follows."""
    found = []
    for _, token in code_lines(FENCE.sub("", markdown)):
        if not DOTTED.match(token) or token in wheel_packages():
            continue
        parts = token.split(".")
        for cut in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:cut])
            source = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
            if source.exists():
                rest = parts[cut:]
                if rest and not (".".join(rest) in python_qualnames(source.read_text())
                                 or re.search(rf"\b{rest[0]}\b", source.read_text())):
                    found.append(f"{token}: {source.relative_to(ROOT)} has no {'.'.join(rest)}")
                break
        else:
            found.append(f"{token}: no such module")
    return found


# ---- output files and who writes them --------------------------------------------------------------

OUTPUT = re.compile(r"^[\w.-]+\.(?:json|jsonl|png|md|csv|h5)$")


@lru_cache(maxsize=None)
def code_strings():
    text = []
    for folder in ("minidl", "tests", "data"):
        text += [p.read_text() for p in (ROOT / folder).rglob("*.py") if "project" not in p.parts]
    text.append((ROOT / "tests" / "gpu_check.sh").read_text())
    return "\n".join(text)


def output_name_problems(markdown):
    """Each file name a page gives (`metrics.jsonl`, `runs/latest/{a.json,b.json}`) is spelled in the code."""
    found = set()
    for _, token in code_lines(FENCE.sub("", markdown)):
        names = re.split(r"[{},/]", token)
        for name in names:
            if OUTPUT.match(name) and not (ROOT / name).exists() and name not in file_names() \
                    and name not in code_strings():
                found.add(f"{name}: no code writes or reads a file of that name")
    return sorted(found)


NOT_A_STOP = r"(?:[^.;]|\.(?=\S))"  # a dot inside a name (metrics.jsonl) does not end the sentence
WRITES = re.compile(rf"`([\w/.-]+\.py):([\w.]+)`(?P<claim>[^`.;]*?\bwrites?\b{NOT_A_STOP}*?)"
                    r"(?=`[\w/.-]+\.py:|[.;]\s|$)")


def strings_of(path, qualname):
    """The string constants `qualname` uses: its own, and those assigned to each `self.x` it reads."""
    tree = ast.parse((ROOT / path).read_text())
    attributes = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
            values = node.value.elts if isinstance(node.value, ast.Tuple) and len(node.value.elts) == len(targets) \
                else [node.value] * len(targets)
            for target, value in zip(targets, values):
                if isinstance(target, ast.Attribute):
                    attributes.setdefault(target.attr, set()).update(constants(value))
    function = tree
    for name in qualname.split("."):
        function = next(n for n in ast.iter_child_nodes(function) if getattr(n, "name", None) == name)
    used = constants(function)
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute):
            used |= attributes.get(node.attr, set())
    return used


def constants(node):
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def writer_problems(markdown):
    """"`path:function` writes ... `name.jsonl`": that function's code spells the file's name."""
    found = []
    prose = FENCE.sub("", markdown)
    for match in WRITES.finditer(prose):
        path, qualname = match[1], match[2]
        if not (ROOT / path).exists() or not defined(ROOT / path, qualname):
            continue  # path_problems names it
        spelled = " ".join(strings_of(path, qualname))
        for name in INLINE_CODE.findall(match["claim"]):
            if OUTPUT.match(name) and name not in spelled:
                found.append(f"{path}:{qualname} does not write {name}")
    return found


# ---- C++ names, the variables' table ----------------------------------------------------------------

CPP_NAME = re.compile(r"^(?:std::)?\w+(?:::\w+)+$")


@lru_cache(maxsize=None)
def cpp_sources():
    paths = [*(ROOT / "kernels").glob("*.cu*"), *(ROOT / "tests" / "kernels").rglob("*.h"),
             *(ROOT / "tests" / "kernels").glob("*.cu"), *(ROOT / "minidl").rglob("*.cu")]
    return "\n".join(path.read_text() for path in paths)


def cpp_name_problems(markdown):
    """A C++ name a page gives (`std::barrier`) is used by the kernels or the emulator."""
    return [f"{token}: not used by the kernels or the emulator" for _, token in code_lines(FENCE.sub("", markdown))
            if CPP_NAME.match(token) and token not in cpp_sources()]


TABLE_VARIABLE = re.compile(r"^\|\s*`(MINIDL_[A-Z0-9_]+)`", re.MULTILINE)


def variable_table_problems(markdown):
    """A table of the variables lists every one of them."""
    from minidl.environment import VARIABLES
    listed = set(TABLE_VARIABLE.findall(markdown))
    return [f"{name}: missing from the table of variables" for name in sorted(set(VARIABLES) - listed) if listed]


# ---- statements only a reader can check: each pinned to the fact that makes it false ---------------

def source(path):
    return (ROOT / path).read_text()


def backward_pops_by_generation():
    return "heapq.heappop" in source("minidl/autograd.py") and "generation" in source("minidl/autograd.py")


def schedule_scales_lr():
    from minidl.schedule import BatchSchedule, LRSchedule
    return LRSchedule(0.1, 256, BatchSchedule([(0, 8192)]), epochs=90).target(0) == 0.1 * 8192 / 256


def data_and_grad_are_two_buffers():
    import numpy
    from minidl.nn import Parameter
    from minidl.optim import FlatParameters
    flat = FlatParameters([Parameter(numpy.zeros(3, numpy.float32))])
    return not numpy.shares_memory(flat.data, flat.grad)


def emulator_runs_fibers():
    header = source("tests/kernels/emu/cuda_emu.h")
    return "ucontext" in header and "std::thread" not in header and "std::barrier" not in header


def kernels_include_their_own_headers():
    return any(re.search(r'#include\s+"', path.read_text()) for path in (ROOT / "kernels").glob("*.cu"))


def amp_exists():
    return "--amp" in trainer_flags()


def ring_is_the_native_call():
    """`ring` has no inner group: its one stage is the communicator's own all-reduce over the world."""
    ring_branch = r'(?:algorithm|native_of\(algorithm\)) == "ring":\s*inner, outer = None, comm\b'
    return re.search(ring_branch, source("minidl/distributed/allreduce.py")) is not None


def cache_holds_the_tuner_too():
    from minidl.environment import VARIABLES
    return "autotuner" in VARIABLES["MINIDL_CACHE"].help


CONTRADICTED = (
    (re.compile(r"reverse\s+creation\s+order"), backward_pops_by_generation,
     "backward pops a heap by generation, not the tape in reverse creation order"),
    (re.compile(r"scale\s+`--lr`"), schedule_scales_lr,
     "the schedule already scales --lr by the global batch over --lr-base-batch"),
    (re.compile(r"one\s+contiguous\s+buffer\s+and\s+makes\s+each\s+parameter's\s+`\.data`\s+and\s+`\.grad`"),
     data_and_grad_are_two_buffers, ".data and .grad are views into two buffers, not one"),
    (re.compile(r"one\s+OS\s+thread\s+per\s+CUDA\s+thread|atomics\s+under\s+a\s+lock"), emulator_runs_fibers,
     "the emulator runs a block's threads as fibers on one OS thread; atomics need no lock"),
    (re.compile(r"no\s+includes\s+beyond\s+CUDA's\s+own\s+headers"), kernels_include_their_own_headers,
     "kernels/conv_v2.cu includes kernels/ptx.cuh and kernels/conv_v2_norm.cuh"),
    (re.compile(r"bf16\s+on\s+GPU\s+later"), amp_exists, "bf16 exists: --amp"),
    (re.compile(r"\|\s*native[^|\n]*\|\s*ring\s*\|"), ring_is_the_native_call,
     "`ring` is the native all-reduce itself: a column beside `native` times the same call"),
    (re.compile(r"`MINIDL_CACHE`[^\n]*embedded dataset(?![^\n]*autotun)"), cache_holds_the_tuner_too,
     "MINIDL_CACHE holds the autotuner's cache too"),
)


def contradicted_problems(markdown):
    text = FENCE.sub("", markdown)
    return [f"{why} ({pattern.search(text)[0]!r})" for pattern, _, why in CONTRADICTED if pattern.search(text)]


CHECKS = (flag_problems, value_problems, default_problems, variable_problems, path_problems, module_name_problems,
          output_name_problems, writer_problems, cpp_name_problems, variable_table_problems, contradicted_problems)


def problems(markdown):
    return [problem for check in CHECKS for problem in check(markdown)]
