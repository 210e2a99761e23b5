"""The docs cannot rot: every `path` and `path:qualname` that docs/walkthrough.md names exists,
every relative link in README.md and docs/*.md points at a file of the repository, and every
`docs/page.md, "Heading"` or `docs/page.md §N` that a module docstring gives is there; module
docstrings stay short (what and why), their details living in those pages."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = ROOT / "docs" / "walkthrough.md"
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
BACKTICKED = re.compile(r"`([^`\s]+)`")
NAME = re.compile(r"^(?P<path>[\w./-]+?)(?::(?P<qualname>[\w.]+))?$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def is_path(text):
    return "/" in text or text.endswith((".py", ".cu", ".cuh", ".h", ".md"))


def named_references(markdown):
    """(path, qualname or None) for each backticked repository path outside code blocks."""
    found = []
    for token in BACKTICKED.findall(FENCE.sub("", markdown)):
        match = NAME.match(token)
        if match and is_path(match["path"]) and not token.startswith(("http", "-")):
            found.append((match["path"], match["qualname"]))
    return found


def python_qualnames(source):
    """Top-level functions and classes, and Class.method for the methods of each class."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{item.name}" for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return names


def defines(path, qualname):
    source = path.read_text()
    if path.suffix == ".py":
        return qualname in python_qualnames(source)
    # CUDA/C++: a function (or kernel) of that name is declared or defined
    return re.search(rf"\b{re.escape(qualname.split('.')[-1])}\s*\(", source) is not None


def problems(markdown):
    found = []
    for path, qualname in named_references(markdown):
        target = ROOT / path
        if not target.exists():
            found.append(f"{path}: no such file")
        elif qualname and not defines(target, qualname):
            found.append(f"{path}:{qualname}: not defined there")
    return found


def test_the_walkthrough_names_only_what_exists():
    references = named_references(WALKTHROUGH.read_text())
    assert len(references) >= 40, "the walkthrough names its hops as `path` or `path:function`"
    assert problems(WALKTHROUGH.read_text()) == []


@pytest.mark.parametrize("bogus", ["`minidl/trainer.py:Trainer.no_such_method`", "`minidl/no_such_file.py`",
                                   "`minidl/ops/conv.py:no_such_function`", "`kernels/sgd.cu:no_such_kernel`"])
def test_a_wrong_name_is_caught(bogus):
    assert len(problems(f"see {bogus} here")) == 1


def test_names_in_code_blocks_and_plain_words_are_not_references():
    assert named_references("```sh\npython `x/y.py`\n```\nthe `--epochs` flag, `metrics.jsonl`") == []


def relative_links(path):
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        yield target.split("#")[0]


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page):
    missing = [link for link in relative_links(page) if not (page.parent / link).exists()]
    assert missing == []


POINTER = re.compile(r'(docs/[\w-]+\.md)(?:,?\s+(?:"([^"]+)"|§(\d+)))?')


def module_docstrings():
    for path in sorted((ROOT / "minidl").rglob("*.py")):
        yield path.relative_to(ROOT), ast.get_docstring(ast.parse(path.read_text())) or ""


def headings(page):
    """The page's headings, backticks dropped: "### `minidl/x.py`" gives "minidl/x.py"."""
    return [line.lstrip("#").strip().replace("`", "") for line in FENCE.sub("", page.read_text()).splitlines()
            if line.startswith("#")]


def pointer_problems(text):
    found = []
    for page, title, section in POINTER.findall(text):
        if not (ROOT / page).exists():
            found.append(f"{page}: no such page")
        elif title and title not in headings(ROOT / page):
            found.append(f'{page}: no heading "{title}"')
        elif section and not any(h.startswith(f"{section}.") for h in headings(ROOT / page)):
            found.append(f"{page}: no section {section}")
    return found


def test_docstrings_point_at_pages_and_headings_that_exist():
    found = [f"{path}: {problem}" for path, doc in module_docstrings() for problem in pointer_problems(doc)]
    assert found == []


@pytest.mark.parametrize("bogus", ['docs/no_such_page.md', 'docs/design.md, "No such heading"', "docs/design.md §99"])
def test_a_wrong_pointer_is_caught(bogus):
    assert len(pointer_problems(f"Details: {bogus}.")) == 1


MODULE_DOCSTRING_LINES = 10


def too_long(doc):
    return len(doc.splitlines()) > MODULE_DOCSTRING_LINES


def test_module_docstrings_say_what_and_why_in_at_most_ten_lines():
    found = [f"{path}: {len(doc.splitlines())} lines" for path, doc in module_docstrings() if too_long(doc)]
    assert found == [], "move the details into a docs/ page and point at it"


def test_the_line_limit_counts_the_docstring_as_written():
    doc = ast.get_docstring(ast.parse('"""One.\n\n' + "more\n" * 9 + '"""'))
    assert len(doc.splitlines()) == 11 and too_long(doc)
    assert not too_long("\n".join(["line"] * 10))
