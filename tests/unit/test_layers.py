"""The code's shape, checked: no import circles between files (core and built-in plugins),
the core's sub-packages import only their own layer or those below it, and the core names
no plugin.

Every ``import`` counts, also those under ``TYPE_CHECKING`` and inside functions: a circle
of lazy imports is still two files that cannot be read one without the other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "fanout", *sorted((ROOT / "plugins").glob("fanout-*/fanout_*"))]

LAYERS: list[set[str]] = [
    {"errors", "version", "jvm"},
    {"contract", "retry", "delta_tables"},
    {"observe", "hooks", "ledger", "deadletters", "spool"},
    {"routes", "partitioned", "sink_spec", "recipe"},
    {"steps"},
    {"fan_out", "dispatch"},
    {"spark", "testing"},
    {"app", "__init__", "__main__"},
]
"""The core's sub-packages and top-level modules, lowest first: each may import from its
own layer and the layers below (docs/architecture.md, "Layout")."""


def modules() -> dict[str, Path]:
    """Every module of the core and the built-in plugins, by dotted name."""
    found: dict[str, Path] = {}
    for source in SOURCES:
        for path in source.rglob("*.py"):
            parts = list(path.relative_to(source.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The known modules ``path`` imports (``from pkg import module`` resolves to the
    module when it is one)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                if candidate in known:
                    yield candidate
                elif node.module in known:
                    yield node.module


def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: {m for m in imports(path, known) if m != name and not _is_package_of(m, name)}
        for name, path in known.items()
    }


def _is_package_of(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def layer_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    for number, members in enumerate(LAYERS):
        if part in members:
            return number
    raise AssertionError(f"{module}: its sub-package {part!r} is in no layer of LAYERS")


def test_no_import_circles_between_files() -> None:
    assert cycles(graph()) == []


def test_core_sub_packages_import_only_their_layer_or_below() -> None:
    upward = [
        f"{source} -> {target}"
        for source, targets in sorted(graph().items())
        if source.split(".")[0] == "fanout"
        for target in sorted(targets)
        if target.split(".")[0] == "fanout" and layer_of(target) > layer_of(source)
    ]
    assert upward == []


def test_the_core_imports_no_plugin_by_name() -> None:
    named = [
        f"{path.relative_to(ROOT)}: {text}"
        for path in (ROOT / "fanout").rglob("*.py")
        for text in _plugin_mentions(path)
    ]
    assert named == []


def _plugin_mentions(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("fanout_"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fanout_"):
            yield str(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(("fanout_delta", "fanout_postgres", "fanout_kafka")):
                yield node.value


def test_the_checker_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_plugin_name_checker_finds_each_form(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "import fanout_kafka.sink\n"
        "from fanout_postgres import embedded\n"
        "import importlib\n"
        "def f():\n"
        "    return importlib.import_module('fanout_delta.plugin')\n"
    )
    assert sorted(_plugin_mentions(source)) == [
        "fanout_delta.plugin",
        "fanout_kafka.sink",
        "fanout_postgres",
    ]
