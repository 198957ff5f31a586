"""No import cycle inside a package spans more than two modules, read from the source with ``ast``.

Every import counts: module level, inside functions (a function-local import hides a cycle, it
does not remove one) and under ``if TYPE_CHECKING:`` (the types a module names are a dependency
a reader has to follow). An import names the module it loads: ``from kiln.capture.values import
base`` depends on ``kiln.capture.values.base`` where that is a module, otherwise on the package's
``__init__``. Parent packages that Python runs on the way are not counted: a package's
``__init__`` re-exporting its submodules is not a cycle with them.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_CYCLE = 2


def _modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under ``src`` (``pkg/__init__.py`` is ``pkg``)."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    drop = node.level - 1 if is_package else node.level
    base = base[: len(base) - drop]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(src: Path, others: Collection[str] = ()) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports.

    ``others`` are the modules of the other trees sharing the namespace: ``from kiln import
    capture`` in the frontend loads another distribution's package, not the frontend's
    ``kiln/__init__``.
    """
    modules = _modules(src)
    known = set(modules) | set(others)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                origin = _resolve(name, is_package, node)
                for alias in node.names:
                    sub = f"{origin}.{alias.name}"
                    targets.append(sub if sub in known else origin)
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(components)


def oversized_cycles(root: Path) -> list[list[str]]:
    """Every import cycle of more than ``MAX_CYCLE`` modules, over all packages."""
    trees = [p / "src" for p in sorted((root / "packages").iterdir()) if (p / "src").is_dir()]
    every = {name for src in trees for name in _modules(src)}
    found = []
    for src in trees:
        graph = import_graph(src, every)
        found += [c for c in strongly_connected(graph) if len(c) > MAX_CYCLE]
    return found


def test_no_import_cycle_spans_more_than_two_modules() -> None:
    assert oversized_cycles(ROOT) == []


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "packages" / "demo" / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_checker_finds_a_cycle_through_relative_and_function_local_imports(
    tmp_path: Path,
) -> None:
    root = _plant(
        tmp_path,
        {
            "kiln/demo/__init__.py": "",
            "kiln/demo/a.py": "from kiln.demo import b\n",
            "kiln/demo/b.py": "def f():\n    from .sub import c\n",
            "kiln/demo/sub/__init__.py": "",
            "kiln/demo/sub/c.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from ..a import thing\n",
        },
    )
    assert oversized_cycles(root) == [["kiln.demo.a", "kiln.demo.b", "kiln.demo.sub.c"]]


def test_checker_reads_a_namespace_sibling_as_another_tree(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "kiln/__init__.py": "from kiln.api import run\n",
            "kiln/api.py": "from kiln import other_dist\nfrom kiln import helpers\n",
            "kiln/helpers.py": "import kiln.api\n",
        },
    )
    other = tmp_path / "packages" / "other" / "src" / "kiln" / "other_dist"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    assert oversized_cycles(root) == []
    (tmp_path / "packages" / "demo" / "src" / "kiln" / "helpers.py").write_text("import kiln\n")
    assert oversized_cycles(root) == [["kiln", "kiln.api", "kiln.helpers"]]


def test_checker_allows_two_module_cycles_and_package_reexports(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "kiln/demo/__init__.py": "from kiln.demo.a import x\nfrom kiln.demo.b import y\n",
            "kiln/demo/a.py": "import kiln.demo.b\nx = 1\n",
            "kiln/demo/b.py": "from kiln.demo.a import x\ny = 2\n",
        },
    )
    assert oversized_cycles(root) == []
