"""No import cycles in engine/ or app/, counting the imports inside functions; none between engine's packages.

A cycle hidden in a function-level import works until someone moves that
import to the top of the file; then one of the two modules is half-built when
the other reads it. The graph below has an edge for every `import` and
`from ... import` anywhere in a module (relative ones resolved). Imports
under `if TYPE_CHECKING:` never run, so they cannot half-build a module; the
house still keeps them acyclic too (a cycle of types is a cycle of ideas:
engine/backends/decode_shapes.py broke the last one), and the checker counts
them when asked.

    .venv/bin/python -m pytest -q tests/test_import_cycles.py
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST, type_only: bool = False) -> Iterator[ast.AST]:
    """Every node of `tree`, without what sits under `if TYPE_CHECKING:` (type-only imports) unless `type_only`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not type_only and isinstance(child, ast.If) and _is_type_checking(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(root: Path, packages: Sequence[str], type_only: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports, at any depth of its code (with `type_only`, under
    `if TYPE_CHECKING:` too)."""
    files = {_module_name(path, root): path for package in packages for path in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path)), type_only):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
            for target in targets:
                while target and target not in files:  # `import a.b.c` where c is a name: a.b
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> b -> ... -> a) for each group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(start: str) -> None:  # Tarjan's strongly connected components, iteratively
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return [_cycle_in(group, graph) for group in groups]


def _cycle_in(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    first = min(group)
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == first:
                    return paths[node] + [first]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(group)} holds no cycle")  # unreachable for a strongly connected group


def test_engine_and_app_have_no_import_cycles() -> None:
    for type_only in (False, True):
        graph = import_graph(ROOT, ["engine", "app"], type_only)
        assert len(graph) > 40 and "engine.cli" in graph["app.main"]
        cycles = find_cycles(graph)
        assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded into engine's packages: engine.node.loop counts as engine.node; a top-level
    module (engine.cli, the package root `engine`) is its own node."""
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    folded: dict[str, set[str]] = {}
    for name, edges in graph.items():
        folded.setdefault(package(name), set()).update(package(e) for e in edges if package(e) != package(name))
    return folded


def test_engine_packages_import_each_other_without_a_cycle() -> None:
    """Between engine's packages the arrows run one way (docs/architecture.md, "Packages"): common at the
    bottom; questions, backends and models on it; rollouts; the swarm; the relay on the swarm's wire; the node
    on all of them; gguf and the experiment on the node; cli on top. Type-only imports count too."""
    for type_only in (False, True):
        packages = package_graph(import_graph(ROOT, ["engine"], type_only))
        assert {"engine.common", "engine.node", "engine.questions", "engine.rollouts", "engine.swarm",
                "engine.relay", "engine.backends", "engine.models"} <= set(packages)
        cycles = find_cycles(packages)
        assert not cycles, "package cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)
    assert package_graph({"engine.a.x": {"engine.b.y"}, "engine.b.y": {"engine.a.z"}, "engine.a.z": set()}) == {
        "engine.a": {"engine.b"}, "engine.b": {"engine.a"}}  # no module cycle, but a package one


def test_the_checker_finds_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n\nVALUE = 1\n")
    (package / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                          "    from pkg import c\n\n\n"
                                          "def f() -> int:\n    from ..a import VALUE\n\n    return VALUE\n")
    (package / "c.py").write_text("import pkg.sub.b\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.sub.b"}
    assert find_cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.a"]]
    assert import_graph(tmp_path, ["pkg"], type_only=True)["pkg.sub.b"] == {"pkg.a", "pkg.c"}  # the type-only edge
    (package / "sub" / "b.py").write_text("def f() -> int:\n    return 1\n")
    assert find_cycles(import_graph(tmp_path, ["pkg"])) == []
