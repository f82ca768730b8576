"""The docs' Python examples are Python, and import what the package offers, from its home.

Every fenced block marked ``python`` (or ``py``) in ``docs/**/*.md`` and ``README.md`` must
parse on its own: an example a reader cannot paste is a broken example, and a block that
is not Python belongs in a fence marked ``text`` or ``console``. Each of its imports of
``pyrula_stream`` must name a module that exists and names that module offers. An old path
kept for one release (``pyrula_stream._moved``) still imports, with a
``DeprecationWarning``, but a page that teaches it teaches what goes away: it fails here,
naming the new home.

A module whose optional third-party extra is not installed in this venv (``quixstreams``)
cannot be imported; it is found with ``importlib.util.find_spec`` and its names are read
from the source it binds at its top level.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = "pyrula_stream"
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
PYTHON = {"python", "py", "python3"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")


@dataclass(frozen=True)
class Example:
    """One fenced Python block: the page, the line of its opening fence, its text."""

    page: Path
    line: int
    source: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path) -> Iterator[Example]:
    """The page's fenced blocks whose info string starts with a Python language name; an
    indented fence (in a list item or an admonition) loses its indent."""
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        i += 1
        if opening is None:
            continue
        start = i  # the opening fence's line number
        fence, indent = opening["fence"], opening["indent"]
        body: list[str] = []
        while i < len(lines):
            line = lines[i]
            i += 1
            if _closes(FENCE.match(line), fence):
                break
            body.append(line.removeprefix(indent))
        language = opening["info"].lstrip("{.").split(" ")[0].rstrip("}").lower()
        if language in PYTHON:
            yield Example(page, start, "\n".join(body) + "\n")


def _closes(line: re.Match[str] | None, fence: str) -> bool:
    """A bare fence of the same character, at least as long, closes the block."""
    return (
        line is not None
        and not line["info"]
        and line["fence"][0] == fence[0]
        and len(line["fence"]) >= len(fence)
    )


EXAMPLES = [example for page in PAGES for example in python_blocks(page)]


def _bound_names(origin: str) -> set[str]:
    """The names a module's source binds at its top level (for a module whose optional
    extra is not installed in this venv, so it cannot be imported here)."""
    tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


class _Checker:
    """Collects what is wrong with one example's imports, one sentence each."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def module(self, dotted: str) -> ModuleType | None:
        """Import ``dotted`` (None when only a third-party extra is missing here); an old
        path, seen by its warning or by the module answering to another name, is a
        problem."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                module = importlib.import_module(dotted)
            except ModuleNotFoundError as missing:
                if (missing.name or "").split(".")[0] == PACKAGE:
                    self.problems.append(f"{dotted}: no such module ({missing})")
                    return None
                self._not_installed(dotted)
                return None
        warned = [
            str(w.message)
            for w in caught
            if issubclass(w.category, DeprecationWarning) and PACKAGE in str(w.message)
        ]
        if warned:
            self.problems.extend(f"{dotted}: {message}" for message in warned)
        elif module.__name__ != dotted:  # imported before, so it warned then, not now
            self.problems.append(f"{dotted} is an old path: import from {module.__name__}")
        return module

    def _not_installed(self, dotted: str) -> None:
        spec = importlib.util.find_spec(dotted)
        if spec is None or spec.origin is None:
            self.problems.append(f"{dotted}: not a module of the package")

    def names(self, dotted: str, module: ModuleType | None, names: list[str]) -> None:
        """``from dotted import names``: each is an attribute or a submodule."""
        for name in names:
            if name == "*":
                continue
            if module is None:
                self._name_in_source(dotted, name)
                continue
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                try:
                    value = getattr(module, name)
                except AttributeError:
                    value = None
                except ImportError:  # a lazy name whose provider SDK is not installed
                    value = name if name in getattr(module, "__all__", ()) else None
            package = hasattr(module, "__path__")
            if value is None and package and importlib.util.find_spec(f"{dotted}.{name}"):
                self.module(f"{dotted}.{name}")  # a submodule, imported as `from` does
                continue
            if value is None:
                self.problems.append(f"{dotted} has no {name!r}")
            elif isinstance(value, ModuleType) and value.__name__ != f"{dotted}.{name}":
                self.problems.append(
                    f"{dotted}.{name} is an old path: import from {value.__name__}"
                )

    def _name_in_source(self, dotted: str, name: str) -> None:
        spec = importlib.util.find_spec(dotted)
        if spec is None or spec.origin is None:
            return  # said already by _not_installed
        if name in _bound_names(spec.origin):
            return
        package = spec.submodule_search_locations is not None
        if not package or importlib.util.find_spec(f"{dotted}.{name}") is None:
            self.problems.append(f"{dotted} has no {name!r}")


def import_problems(tree: ast.Module) -> list[str]:
    """What is wrong with the example's imports of ``pyrula_stream``."""
    check = _Checker()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    check.module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _ours(node.module):
            assert node.module is not None
            check.names(node.module, check.module(node.module), [a.name for a in node.names])
    return check.problems


def _ours(dotted: str | None) -> bool:
    return dotted is not None and dotted.split(".")[0] == PACKAGE


def test_the_examples_are_found() -> None:
    """A fence the parser misses would pass every check below by not being checked."""
    pages = {example.page.name for example in EXAMPLES}
    assert {"README.md", "getting-started.md", "outages.md"} <= pages
    assert len(EXAMPLES) >= 20


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_every_python_example_parses_and_imports_what_exists(example: Example) -> None:
    try:
        tree = ast.parse(example.source, filename=str(example))
    except SyntaxError as exc:
        pytest.fail(
            f"{example}: the python block is not valid Python on its own (line "
            f"{example.line + (exc.lineno or 0)}: {exc.msg}); make it whole, or fence it "
            "as text if it is not Python",
            pytrace=False,
        )
    problems = import_problems(tree)
    assert not problems, f"{example}: " + "; ".join(problems)
