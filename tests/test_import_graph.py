"""No import circle anywhere in `python/hotloop/`: every `import` statement of every
module counts, at the top, inside a function or under `TYPE_CHECKING` (a circle hidden
from the import machinery is still two modules that cannot be read, or changed, one
without the other). The seams the protocol layer is cut along depend on it: a unit gets
a port, never the object that holds it (docs/style.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "hotloop"


def module_names(package: Path) -> dict[str, Path]:
    """Every module of `package` by dotted name: its sources, and the stubs of its native
    extensions (`_core.pyi`), which import nothing of the package."""
    names = {}
    for path in sorted(package.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi"):
            continue
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.setdefault(".".join(parts), path)
    return names


def imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that `name` imports, anywhere in its source."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                # `from package import module` imports the module, not the package.
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    found.add(submodule)
                elif source in modules:
                    found.add(source)
    found.discard(name)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative): each is a set of modules that import each other around a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for after in edges:
                if after not in index:
                    index[after] = low[after] = len(index)
                    stack.append(after)
                    on_stack.add(after)
                    work.append((after, iter(sorted(graph[after]))))
                    break
                if after in on_stack:
                    low[node] = min(low[node], index[after])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
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
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    modules = module_names(package)
    return {name: imports(name, path, modules) for name, path in modules.items()}


def test_no_module_of_the_package_is_in_an_import_circle() -> None:
    graph = import_graph(PACKAGE)
    assert "hotloop.protocol.connection" in graph and "hotloop._core" in graph
    found = circles(graph)
    detail = "\n".join(
        " <-> ".join(component)
        + ":\n"
        + "\n".join(f"  {m} -> {sorted(set(component) & graph[m])}" for m in component)
        for component in found
    )
    assert found == [], f"import circles:\n{detail}"


def test_the_protocol_units_never_import_the_connection() -> None:
    graph = import_graph(PACKAGE)
    units = ("steering", "injection", "interrupt", "summarization", "mcp_loop", "response")
    for unit in units:
        assert "hotloop.protocol.connection" not in graph[f"hotloop.protocol.{unit}"], unit


def test_a_circle_through_a_function_or_type_checking_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.c import x\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    (package / "d.py").write_text("import pkg.a\n")
    assert circles(import_graph(package)) == [["pkg.a", "pkg.b", "pkg.c"]]
    (package / "c.py").write_text("x = 1\n")
    assert circles(import_graph(package)) == []
