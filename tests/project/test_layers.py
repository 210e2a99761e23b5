"""The architecture's rules, read from the source (docs/design.md §1): data flows one way, so lower
layers never import upper ones; the module-level imports form no cycle; an op chooses its
implementation through the one seam (minidl.ops.dispatch), never by guessing from attributes;
only minidl.environment reads MINIDL_* variables; only the command lines know argparse."""
import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "minidl"

# module prefix -> prefixes it must not import (at module level or inside functions)
FORBIDDEN = {
    "minidl.ops": ("minidl.nn", "minidl.models", "minidl.optim", "minidl.trainer", "minidl.training",
                   "minidl.config", "minidl.distributed", "minidl.data"),
    "minidl.kernels": ("minidl.ops", "minidl.autograd", "minidl.nn", "minidl.models", "minidl.optim",
                       "minidl.trainer", "minidl.training", "minidl.config", "minidl.distributed"),
    "minidl.autograd": ("minidl.ops", "minidl.nn", "minidl.optim", "minidl.trainer", "minidl.training"),
    "minidl.nn": ("minidl.optim", "minidl.trainer", "minidl.training", "minidl.config", "minidl.distributed"),
    "minidl.models": ("minidl.optim", "minidl.trainer", "minidl.training", "minidl.config", "minidl.distributed"),
    "minidl.optim": ("minidl.nn", "minidl.models", "minidl.trainer", "minidl.training", "minidl.config",
                     "minidl.distributed"),
    "minidl.distributed": ("minidl.optim", "minidl.nn", "minidl.models", "minidl.ops", "minidl.trainer",
                           "minidl.training", "minidl.config"),
    "minidl.data": ("minidl.nn", "minidl.models", "minidl.optim", "minidl.trainer", "minidl.training",
                    "minidl.config", "minidl.distributed"),
    "minidl.training": ("minidl.trainer", "minidl.config", "minidl.train"),
    "minidl.environment": ("minidl.backend", "minidl.parallel", "minidl.kernels", "minidl.ops", "minidl.autograd",
                           "minidl.nn", "minidl.models", "minidl.optim", "minidl.data", "minidl.distributed",
                           "minidl.config", "minidl.trainer", "minidl.training"),
}
COMMAND_LINES = ("minidl.train", "minidl.cli", "minidl.plot", "minidl.bench", "minidl.experiments",
                 "minidl.data.prepare_imagenet")


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path, ast.parse(path.read_text())


def imported(tree, name, top_level_only=False):
    """The modules `tree` imports (relative imports resolved against `name`)."""
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)  # submodules: `from minidl import ops`


def within(module, prefix):
    return module == prefix or module.startswith(prefix + ".")


ALL = list(modules())


@pytest.mark.parametrize("name, path, tree", ALL, ids=[name for name, _, _ in ALL])
def test_no_upward_import(name, path, tree):
    rules = [banned for layer, banned in FORBIDDEN.items() if within(name, layer)]
    for target in imported(tree, name):
        for banned in rules:
            for prefix in banned:
                assert not within(target, prefix), f"{name} imports {target}: a lower layer must not import {prefix}"


def test_module_level_imports_are_acyclic():
    names = {name for name, _, _ in ALL}
    # a module's own packages are initialized before it anyway: importing from them is no edge
    graph = {name: {t for t in imported(tree, name, top_level_only=True) if t in names and not within(name, t)}
             for name, _, tree in ALL}
    done, active = set(), []

    def visit(node):
        if node in active:
            pytest.fail("import cycle: " + " -> ".join(active[active.index(node):] + [node]))
        if node in done:
            return
        active.append(node)
        for target in sorted(graph[node]):
            visit(target)
        active.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_ops_dispatch_through_the_seam_only():
    for name, path, _ in ALL:
        if within(name, "minidl.ops"):
            text = path.read_text()
            assert "kernels.wants" not in text and "hasattr(self" not in text, f"{name} decides its path by itself"
            assert "kernels.device()" not in text, f"{name} reaches the GPU kernels outside the seam"


def test_only_the_environment_module_reads_minidl_variables():
    read = re.compile(r"""environ\.get\(\s*["']MINIDL_|environ\[["']MINIDL_[A-Z_]+["']\](?!\s*=[^=])""")
    for name, path, _ in ALL:
        if name != "minidl.environment":
            assert not read.search(path.read_text()), f"{name} reads a MINIDL_* variable: use minidl.environment"


def test_only_the_command_lines_know_argparse():
    for name, _, tree in ALL:
        if "argparse" in set(imported(tree, name)):
            assert any(within(name, cli) for cli in COMMAND_LINES), f"{name} imports argparse"
