"""Floors: a module imports only modules of its own floor or lower, and no import closes a
cycle, between modules or between packages. ``docs/floors.md`` explains the floors to
users; ``FLOORS`` below is the one place that says which module sits on which.

Imports are read with ``ast`` from the source, wherever they stand (module level, inside
a function, under ``TYPE_CHECKING``), so a lazy import cannot hide an upward arrow.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "pyrula_stream"
SOURCE = Path(__file__).resolve().parents[2] / PACKAGE

# Package (dotted, below ``pyrula_stream``) -> floor: one row per package, and one per
# module of the package root. The longest matching row wins, so a sub-package such as
# ``kafka.stores`` can stand on another floor than the package around it. "" is the
# package's own ``__init__``: the public face, on the top floor.
FLOORS: dict[str, int] = {
    # 1 leaves: what every floor needs
    "_version": 1,
    "errors": 1,
    "redaction": 1,
    # 2 the wire: codecs, journal keys, records, events, lineage, the guarded decode path
    "wire": 2,
    # 3 the outside world: the Kafka client, the model providers, telemetry
    "kafka": 3,
    "kafka.local": 3,
    "llm": 3,
    "observability": 3,
    "objects": 3,
    # 4 declarations, and the Kafka stores of the state they declare
    "tools": 4,
    "agent": 4,
    "state": 4,
    "access": 4,
    "kafka.stores": 4,
    "evals": 4,
    # 5 the step kernel: one turn's journal, replay decisions, step recording
    "durable": 5,
    # 6 the operations an agent body calls
    "context": 6,
    "mcp": 6,
    # 7 the worker
    "runtime": 7,
    "evals.stream": 7,
    # 8 clients
    "client": 8,
    "comparison": 8,
    # 9 faces
    "": 9,
    "_moved": 9,
    "testing": 9,
    "testing_servers": 9,
    "cli": 9,
    "ui": 9,
    "gateway": 9,
    "integrations": 9,
    "bench": 9,
    "chaos": 9,
}


@dataclass(frozen=True)
class Import:
    """One import of a module of ours: who, where, what."""

    module: str
    path: Path
    line: int
    target: str
    name: str

    def __str__(self) -> str:
        where = self.path.relative_to(SOURCE.parent)
        return f"{where}:{self.line} imports {self.name} from {self.target}"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def floor_of(module: str) -> int | None:
    """The floor of the longest row of ``FLOORS`` naming the module or a package above it.

    The row "" is the package's own ``__init__`` alone, never a default for the rest.
    """
    name = module.removeprefix(PACKAGE).removeprefix(".")
    if not name:
        return FLOORS.get("")
    while name:
        if name in FLOORS:
            return FLOORS[name]
        name = name.rpartition(".")[0]
    return None


def _deepest(dotted: str, known: dict[str, Path]) -> str:
    """The longest leading part of ``dotted`` that is one of our modules."""
    while dotted not in known and "." in dotted:
        dotted = dotted.rpartition(".")[0]
    return dotted


def imports_of(module: str, path: Path, known: dict[str, Path]) -> Iterator[Import]:
    """Every import of our own modules in one file, lazy and type-only ones included."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    target = _deepest(alias.name, known)
                    yield Import(module, path, node.lineno, target, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = full if full in known else _deepest(base, known)
                yield Import(module, path, node.lineno, target, alias.name)


@functools.cache
def all_imports() -> tuple[Import, ...]:
    """Every import between our modules, read once for the tests below."""
    known = modules()
    return tuple(
        found
        for module, path in known.items()
        for found in imports_of(module, path, known)
        if found.target != module
    )


def cycles(edges: Sequence[Import]) -> list[list[str]]:
    """The strongly connected components (Tarjan) with more than one module."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.module, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_floor_and_every_row_a_module() -> None:
    known = modules()
    unplaced = sorted(module for module in known if floor_of(module) is None)
    named = {module.removeprefix(PACKAGE).removeprefix(".") for module in known}
    stale = sorted(row for row in FLOORS if row not in named)
    assert not unplaced, f"modules without a floor (add a row to FLOORS): {unplaced}"
    assert not stale, f"rows of FLOORS that name no module: {stale}"


def test_no_import_goes_up_a_floor() -> None:
    upward = []
    for found in all_imports():
        low, high = floor_of(found.module), floor_of(found.target)
        if low is not None and high is not None and high > low:
            upward.append(f"{found} (floor {low} -> {high})")
    assert not upward, f"{len(upward)} imports go up a floor:\n" + "\n".join(upward)


def test_no_import_closes_a_cycle() -> None:
    edges = all_imports()
    report = []
    for component in cycles(edges):
        members = set(component)
        ties = [str(edge) for edge in edges if edge.module in members and edge.target in members]
        report.append(f"cycle of {len(component)} modules {component}:\n  " + "\n  ".join(ties))
    assert not report, f"{len(report)} import cycles:\n" + "\n".join(report)


def unit_of(module: str) -> str:
    """The package view: a module counts as the package of its row in ``FLOORS`` (the
    longest row naming it or a package above it), so ``kafka.stores`` is a unit apart."""
    name = module.removeprefix(PACKAGE).removeprefix(".")
    while name and name not in FLOORS:
        name = name.rpartition(".")[0]
    return f"{PACKAGE}.{name}" if name else PACKAGE


def test_no_two_packages_import_each_other() -> None:
    """Counting each package as one unit, no imports go round a loop either: a package
    whose modules sit on several floors must not tie two others together."""
    edges = [
        Import(unit_of(e.module), e.path, e.line, unit_of(e.target), e.name)
        for e in all_imports()
        if unit_of(e.module) != unit_of(e.target)
    ]
    report = []
    for component in cycles(edges):
        members = set(component)
        ties = sorted(
            {f"{e.module} -> {e.target}" for e in edges if {e.module, e.target} <= members}
        )
        report.append(f"tangle of {len(component)} units {component}:\n  " + "\n  ".join(ties))
    assert not report, f"{len(report)} package tangles:\n" + "\n".join(report)


def test_the_reader_sees_lazy_and_type_only_imports(tmp_path: Path) -> None:
    """The test above can fail: an import inside a function or under TYPE_CHECKING counts."""
    module = tmp_path / "probe.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pyrula_stream.runtime.worker import KafkaWorker\n"
        "def later() -> None:\n"
        "    import pyrula_stream.client.kafka_client\n"
        "    from .wire import serde\n"
    )
    known = {**modules(), "pyrula_stream.probe": module}
    found = sorted(
        (i.line, i.target, i.name) for i in imports_of("pyrula_stream.probe", module, known)
    )
    assert found == [
        (3, "pyrula_stream.runtime.worker", "KafkaWorker"),
        (5, "pyrula_stream.client.kafka_client", "pyrula_stream.client.kafka_client"),
        (6, "pyrula_stream.wire.serde", "serde"),
    ]
    assert floor_of("pyrula_stream.probe") is None
    assert floor_of("pyrula_stream.kafka.stores.memory") == 4
    assert floor_of("pyrula_stream.kafka.config") == 3
    assert floor_of(PACKAGE) == 9


def test_every_package_says_its_floor() -> None:
    """A package's ``__init__`` docstring names the floor its row in ``FLOORS`` gives, so a
    reader learns the layer where the code is, not only in this table."""
    wrong = []
    for module, path in modules().items():
        if path.name != "__init__.py":
            continue
        floor = floor_of(module)
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if f"floor {floor}" not in " ".join(docstring.split()):
            wrong.append(f"{path.relative_to(SOURCE.parent)} (floor {floor})")
    assert not wrong, "package docstrings that do not name their floor:\n" + "\n".join(wrong)


def test_the_package_root_keeps_a_handful_of_modules() -> None:
    """New concepts arrive as packages on their floor, never loose at the root."""
    loose = sorted(p.name for p in SOURCE.glob("*.py"))
    assert len(loose) <= 6, f"{len(loose)} modules at the package root: {loose}"
