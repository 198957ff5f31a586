"""The layering and the torch boundary, read from the source with ``ast``.

Dependencies run capture -> guards -> autograd_aot -> loopir -> codegen_* -> frontend; the two
codegens never import each other; each package imports only kiln packages it declares in its
pyproject; kiln-to-kiln imports sit at module level; Triton is optional (only kiln.codegen_triton
imports it, and another package imports kiln.codegen_triton only where an ``except ImportError``
catches its absence; loopir reaches it by name); and no product code reaches into the part of
torch that Kiln re-implements (docs/architecture.md, "Where torch ends").
"""

from __future__ import annotations

import ast
import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["capture", "guards", "autograd_aot", "loopir", "codegen_triton", "codegen_cpp", "frontend"]
CODEGENS = {"codegen_triton", "codegen_cpp"}
OPTIONAL = {"triton": "codegen_triton", "kiln.codegen_triton": "codegen_triton"}
"""Modules a machine may lack, and the package that alone may import them unguarded."""
FORBIDDEN_TORCH = (
    "torch._dynamo",
    "torch._inductor",
    "torch._functorch",
    "torch.compile",
    "torch.export",
    "torch.fx.experimental.proxy_tensor",
    "torch.fx.experimental.symbolic_shapes",
    "torch._subclasses",
    "torch.func.functionalize",
    "torch._higher_order_ops",
    "torch.utils._sympy",
    "torch._guards",
    "torch._logging",
)


def _dist_to_package(dist: str) -> str:
    return "frontend" if dist == "kiln" else dist.removeprefix("kiln-").replace("-", "_")


def declared(root: Path, package: str) -> set[str]:
    """The kiln packages ``package`` declares as dependencies."""
    meta = tomllib.loads((root / "packages" / package / "pyproject.toml").read_text())
    names = set()
    for dep in meta["project"]["dependencies"]:
        name = dep.split(">")[0].split("<")[0].split("=")[0].split("~")[0].strip()
        if name == "kiln" or name.startswith("kiln-"):
            names.add(_dist_to_package(name))
    return names


def _kiln_target(module: str) -> str | None:
    """The kiln package a module path belongs to (``kiln.api`` and ``kiln`` are the frontend's)."""
    parts = module.split(".")
    if parts[0] != "kiln":
        return None
    if len(parts) > 1 and parts[1] in ORDER and parts[1] != "frontend":
        return parts[1]
    return "frontend"


def _imports(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(module, line, inside a function) for every import, ``from kiln import x`` as ``kiln.x``."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, nested) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for alias in child.names:
                    found.append((f"{child.module}.{alias.name}", child.lineno, nested))
            visit(child, nested)

    visit(tree, False)
    return found


def _catches_import_error(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names |= {k.id for k in kinds if isinstance(k, ast.Name)}
    return bool(names & {"ImportError", "ModuleNotFoundError"})


def _unguarded_imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(module, line) for every import outside a ``try`` whose handler catches ImportError."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Import) and not guarded:
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not guarded:
            found.extend((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)
        if isinstance(node, ast.Try) and _catches_import_error(node):
            for stmt in node.body:
                visit(stmt, True)
            for other in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(other, guarded)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return found


def _optional_owner(module: str) -> str | None:
    for name, owner in OPTIONAL.items():
        if module == name or module.startswith(name + "."):
            return owner
    return None


def _attribute_chains(tree: ast.AST) -> list[tuple[str, int]]:
    """Dotted names used in expressions, e.g. ``torch._dynamo.reset`` without an import."""
    chains = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                parts.append(cur.id)
                chains.append((".".join(reversed(parts)), node.lineno))
    return chains


def _is_forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN_TORCH)


def violations(root: Path) -> list[str]:
    """Every layering or torch-boundary violation under ``root/packages/*/src``."""
    problems = []
    for package in ORDER:
        allowed = declared(root, package)
        src = root / "packages" / package / "src"
        for path in sorted(src.rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            where = path.relative_to(root)
            for module, line, in_function in _imports(tree):
                if _is_forbidden(module):
                    problems.append(f"{where}:{line}: imports {module}, which Kiln re-implements")
                target = _kiln_target(module)
                if target is None or target == package:
                    continue
                if ORDER.index(target) > ORDER.index(package) or {package, target} == CODEGENS:
                    problems.append(f"{where}:{line}: kiln.{package} must not import kiln.{target}")
                elif target not in allowed:
                    problems.append(
                        f"{where}:{line}: imports kiln.{target} without declaring it in pyproject"
                    )
                if in_function:
                    problems.append(f"{where}:{line}: function-local import of kiln.{target}")
            for module, line in _unguarded_imports(tree):
                owner = _optional_owner(module)
                if owner is not None and owner != package:
                    problems.append(
                        f"{where}:{line}: imports {module} unguarded (it is optional: catch "
                        "ImportError, or reach it through loopir's backend registry)"
                    )
            for chain, line in _attribute_chains(tree):
                if _is_forbidden(chain):
                    problems.append(f"{where}:{line}: uses {chain}, which Kiln re-implements")
    return sorted(set(problems))


def test_packages_respect_layering_and_torch_boundary() -> None:
    assert violations(ROOT) == []


def test_declared_dependencies_point_left() -> None:
    for package in ORDER:
        for dep in declared(ROOT, package):
            assert ORDER.index(dep) < ORDER.index(package), (package, dep)
            assert {package, dep} != CODEGENS


def _copy_tree(tmp_path: Path) -> Path:
    for package in ORDER:
        dst = tmp_path / "packages" / package
        shutil.copytree(ROOT / "packages" / package / "src", dst / "src")
        shutil.copy(ROOT / "packages" / package / "pyproject.toml", dst / "pyproject.toml")
    return tmp_path


def _add(root: Path, package: str, source: str) -> None:
    target = root / "packages" / package / "src" / "kiln"
    target = target if package == "frontend" else target / package
    (target / "planted.py").write_text(source)


def test_checker_catches_an_import_to_the_right(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    _add(root, "capture", "from kiln import loopir\n")
    assert any("kiln.capture must not import kiln.loopir" in p for p in violations(root))


def test_checker_catches_codegens_importing_each_other(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    _add(root, "codegen_cpp", "import kiln.codegen_triton.kernel\n")
    assert any("must not import kiln.codegen_triton" in p for p in violations(root))


def test_checker_catches_unguarded_optional_imports(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    _add(root, "frontend", "from kiln.codegen_triton import cudagraphify\n")
    _add(root, "loopir", "import triton\n")
    _add(root, "codegen_cpp", "try:\n    import triton\nexcept ImportError:\n    triton = None\n")
    found = "\n".join(violations(root))
    assert (
        "frontend/src/kiln/planted.py:1: imports kiln.codegen_triton.cudagraphify unguarded"
        in found
    )
    assert "loopir/planted.py:1: imports triton unguarded" in found
    assert "codegen_cpp/planted.py" not in found


def test_checker_catches_forbidden_torch(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    _add(
        root,
        "loopir",
        "import torch._inductor.ir\nfrom torch.func import functionalize\n"
        "import torch\ndef f():\n    return torch._dynamo.reset()\n",
    )
    found = "\n".join(violations(root))
    assert "torch._inductor.ir" in found
    assert "torch.func.functionalize" in found
    assert "torch._dynamo.reset" in found


def test_checker_catches_undeclared_and_function_local_imports(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    _add(root, "codegen_cpp", "def f():\n    from kiln import guards\n    return guards\n")
    found = "\n".join(violations(root))
    assert "without declaring it" in found
    assert "function-local import of kiln.guards" in found
