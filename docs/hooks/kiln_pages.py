"""MkDocs hook: the reference parts of the user docs, generated from the code they describe.

A page writes a marker such as ``<!-- kiln:options -->`` on a line of its own and the hook puts
the table the code defines in its place: graph-break kinds from capture's registry, the
``kiln.compile`` options and modes, every package's settings dataclass, each environment
variable the packages read, and the log channels. A new option, break kind or variable shows
up on the next build without editing a page; an environment variable without a description
below is a warning, which fails ``mkdocs build --strict``.

The hook also checks links that leave ``docs/``: MkDocs publishes only ``docs/``, so a link to
a repository file (a package README) becomes its path in the repository, and a link to a file
that does not exist is a warning.

For the API reference it teaches griffe (mkdocstrings' loader) where ``kiln``'s subpackages
are: each distribution installs its own ``kiln/<package>`` folder and the frontend's
``kiln/__init__`` extends ``__path__`` over them, which griffe does not follow by itself.

It imports nothing from MkDocs, so ``tests/test_readme.py`` runs the same generators.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.kiln_pages")

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGES = ROOT / "packages"

# What each environment variable means to a user. Which variables exist, and where they are read,
# comes from the source (``environment_variables``); a variable missing here fails the build.
ENV_HELP: dict[str, str] = {
    "KILN_LOGS": "comma list of log channels to switch on (`+name` for debug level, `+kiln` for "
    "all); see [Debugging](debugging.md#logs)",
    "KILN_DEBUG_DIR": "folder to dump every artifact into, one folder per compiled frame "
    "(the `debug_dir` option sets it per compiled function)",
    "KILN_REPRO": "`after_capture` or `after_aot`: write a minified `repro.py` for a graph that "
    "fails at that stage; see [Debugging](debugging.md#the-minifier)",
    "KILN_REPRO_LEVEL": "what counts as failing for `KILN_REPRO`: `exception` (default) or "
    "`accuracy` (a result that differs from eager)",
    "KILN_CACHE_DIR": "root of the on-disk caches (default `$XDG_CACHE_HOME/kiln`, else "
    "`~/.cache/kiln`)",
    "XDG_CACHE_HOME": "the usual base folder for caches; the default cache root is "
    "`$XDG_CACHE_HOME/kiln`",
    "KILN_CACHE_SIZE_MB": "size limit of each on-disk cache folder in megabytes (default 1024); "
    "the least recently used entries are evicted first",
    "KILN_GRAPH_CACHE": "`0`: compiled graphs are neither stored on disk nor reused by later "
    "processes (on by default; the `graph_cache` option sets it per compiled function)",
    "KILN_GRAPH_CACHE_DIR": "the folder of compiled graphs (default `<cache root>/graphs`; it "
    "and its parent must be private to the user)",
    "CXX": "the C++ compiler for CPU kernels (default `g++`, else `c++`)",
    "KILN_CPP_MARCH": "the `-march=` target of CPU kernels (default `native`)",
    "KILN_FREEZING": "`1`: CPU inference graphs compute what depends on parameters and buffers "
    "alone once, also where parameters require grad; `0`: never (by default, only where none "
    "requires grad; the `freezing` option sets it per compiled function); see "
    "[Configuration](configuration.md#cpu-inference-freezing)",
    "KILN_FREEZING_PREPACK": "`0`: frozen CPU graphs call ATen's convolutions and linears "
    "rather than oneDNN's on weights reordered once, with the activation or residual add after "
    "them fused (on by default where torch has oneDNN); see "
    "[Configuration](configuration.md#cpu-inference-freezing)",
    "KILN_MAX_AUTOTUNE": "`1`: the Triton backend tries more kernel configurations and matmul "
    "templates by default",
    "KILN_TRITON_CACHE": "folder of the Triton kernel cache (default `triton` under `KILN_CACHE_DIR`'s root)",
    "KILN_TRITON_PARALLEL_COMPILE": "`0`: compile Triton kernels in the calling process rather "
    "than in worker processes",
    "TRITON_INTERPRET": "Triton's own switch for its interpreter; Kiln's Triton kernels follow "
    "it (for debugging kernels on CPU)",
}


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def rst_to_markdown(text: str) -> str:
    """Docstrings use reST literals and roles (``:class:`~a.B` ``); the site renders Markdown."""
    text = re.sub(r":[a-z]+:`~([^`]+)`", lambda m: f"`{m.group(1).split('.')[-1]}`", text)
    text = re.sub(r":[a-z]+:`([^`]+)`", r"`\1`", text)
    text = re.sub(r"::$", ":", text, flags=re.M)  # the indented block after it is code either way
    return text.replace("``", "`")


def _break_reasons_module() -> Any:
    """The capture module whose ``REASONS`` registry lists every graph-break kind."""
    capture_src = PACKAGES / "capture" / "src"
    for path in sorted((capture_src / "kiln" / "capture").rglob("*.py")):
        if re.search(r"^REASONS\b", path.read_text(), re.M):
            module = ".".join(path.relative_to(capture_src).with_suffix("").parts)
            return importlib.import_module(module)
    msg = "no module of kiln.capture defines REASONS"
    raise LookupError(msg)


def break_kinds() -> str:
    """Every graph-break kind: what it means and what to do about it."""
    reasons = _break_reasons_module().REASONS
    rows = [(f"`{kind}`", r.explanation, r.hint) for kind, r in reasons.items()]
    return _table(("kind", "what happened", "what to do"), rows)


def compile_options() -> str:
    """``kiln.compile(options=...)``: every key, its type, who reads it, and what it does."""
    config = importlib.import_module("kiln.config")
    rows = []
    for key, (kind, help_text) in config.OPTIONS.items():
        reader = "backend" if key in config.BACKEND_OPTIONS else "frontend (every backend)"
        rows.append((f"`{key}`", f"`{kind.__name__}`", reader, help_text))
    return _table(("option", "type", "read by", "what it does"), rows)


def modes() -> str:
    """``kiln.compile(mode=...)``: each mode and the options it implies."""
    config = importlib.import_module("kiln.config")
    rows = []
    for mode in config.MODES:
        settings = config.CompileConfig(mode=mode)
        implied = [f"`{k}={settings.option(k)!r}`" for k in config.OPTIONS if k in _implied(mode)]
        rows.append((f"`{mode}`", ", ".join(implied) or "nothing"))
    return _table(("mode", "implies"), rows)


def _implied(mode: str) -> set[str]:
    config = importlib.import_module("kiln.config")
    plain = config.CompileConfig()
    settings = config.CompileConfig(mode=mode)
    return {k for k in config.OPTIONS if settings.option(k) != plain.option(k)}


@dataclasses.dataclass
class _Field:
    name: str
    annotation: str
    default: str
    doc: str


def _default_text(value: ast.expr | None) -> str:
    """A field's default as its source says it; one read from the environment says which."""
    if value is None:
        return "required"
    if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field"):
        for keyword in value.keywords:
            if keyword.arg == "default":
                return _default_text(keyword.value)
            if keyword.arg == "default_factory" and isinstance(keyword.value, ast.Lambda):
                return _default_text(keyword.value.body)
            if keyword.arg == "default_factory":
                return ast.unparse(keyword.value) + "()"
    for node in ast.walk(value):
        if isinstance(node, ast.Call) and node.args and node.args[0] in _env_reads(node):
            name = ast.unparse(node.args[0]).strip("'\"")
            fallback = ast.unparse(node.args[1]) if len(node.args) > 1 else "unset"
            return f"${name}, else {fallback}"
    return ast.unparse(value)


def _settings_classes(tree: ast.Module) -> list[tuple[ast.ClassDef, str | None]]:
    """Dataclasses of a config module, each with the module-level instance that holds it."""
    instances = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    instances[ast.unparse(stmt.value.func)] = target.id
    return [
        (stmt, instances.get(stmt.name))
        for stmt in tree.body
        if isinstance(stmt, ast.ClassDef)
        and any("dataclass" in ast.unparse(d) for d in stmt.decorator_list)
    ]


def _fields(cls: ast.ClassDef) -> list[_Field]:
    fields: list[_Field] = []
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            fields.append(
                _Field(
                    stmt.target.id,
                    ast.unparse(stmt.annotation),
                    _default_text(stmt.value),
                    "",
                )
            )
        elif (
            fields
            and isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            fields[-1].doc = " ".join(stmt.value.value.split())
    return fields


def package_settings() -> str:
    """The run-time settings dataclass of every package (``packages/*/src/kiln/*/config.py``)."""
    parts = []
    for path in sorted(PACKAGES.glob("*/src/kiln/*/config.py")):
        module = ".".join(path.relative_to(path.parents[2]).with_suffix("").parts)
        tree = ast.parse(path.read_text())
        for cls, instance in _settings_classes(tree):
            where = f"`{module}.{instance}`" if instance else f"`{module}.{cls.name}`"
            parts.append(f"### {where}\n")
            doc = ast.get_docstring(cls) or ""
            if doc:
                parts.append(rst_to_markdown(doc) + "\n")
            rows = [
                (f"`{f.name}`", f"`{f.annotation}`", f"`{f.default}`", rst_to_markdown(f.doc))
                for f in _fields(cls)
            ]
            parts.append(_table(("field", "type", "default", "notes"), rows) + "\n")
    return "\n".join(parts)


def _string_constants(tree: ast.Module) -> dict[str, str]:
    return {
        target.id: stmt.value.value
        for stmt in tree.body
        if isinstance(stmt, ast.Assign)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
        for target in stmt.targets
        if isinstance(target, ast.Name)
    }


def _env_reads(tree: ast.AST) -> list[ast.expr]:
    """The name arguments of ``os.environ.get(...)``, ``os.getenv(...)``, ``os.environ[...]``
    and of helpers called with a ``KILN_`` literal (``_flag("KILN_X", default)``)."""
    names: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            first = node.args[0]
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if func in ("os.environ.get", "os.getenv", "environ.get", "getenv") or (
                literal and str(first.value).startswith("KILN_")  # type: ignore[attr-defined]
            ):
                names.append(first)
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ",):
            names.append(node.slice)
    return names


def environment_variables() -> dict[str, list[str]]:
    """Every environment variable the packages read, with the modules that read it."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGES.glob("*/src/kiln/**/*.py")):
        tree = ast.parse(path.read_text())
        constants = _string_constants(tree)
        src = path.parts.index("src")
        module = ".".join(Path(*path.parts[src + 1 :]).with_suffix("").parts)
        for arg in _env_reads(tree):
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                name: str | None = arg.value
            else:
                name = constants.get(ast.unparse(arg))
            if name is not None and module not in found.setdefault(name, []):
                found[name].append(module)
    return dict(sorted(found.items()))


def environment() -> str:
    """The environment-variable table; a variable without a description is a warning."""
    rows = []
    for name, modules in environment_variables().items():
        help_text = ENV_HELP.get(name)
        if help_text is None:
            log.warning("environment variable %s (read in %s) is not described in %s",
                        name, ", ".join(modules), Path(__file__).relative_to(ROOT))  # fmt: skip
            help_text = ""
        readers = ", ".join(f"`{m}`" for m in modules)
        rows.append((f"`{name}`", help_text, readers))
    return _table(("variable", "what it does", "read in"), rows)


def log_channels() -> str:
    """The ``KILN_LOGS`` channels and what each one prints."""
    logs = importlib.import_module("kiln.logs")
    rows = [(f"`{name}`", text) for name, text in logs.CHANNELS.items()]
    return _table(("channel", "what it logs"), rows)


GENERATORS: dict[str, Callable[[], str]] = {
    "break-kinds": break_kinds,
    "options": compile_options,
    "modes": modes,
    "settings": package_settings,
    "environment": environment,
    "log-channels": log_channels,
}
MARKER = re.compile(r"^<!-- kiln:([a-z-]+) -->$", re.M)
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def expand(markdown: str, where: str) -> str:
    """``markdown`` with every marker replaced by what its generator writes."""

    def replace(match: re.Match[str]) -> str:
        generator = GENERATORS.get(match.group(1))
        if generator is None:
            log.warning("%s: unknown marker %r", where, match.group(0))
            return match.group(0)
        return generator()

    return MARKER.sub(replace, markdown)


def outside_links(markdown: str, page: Path) -> str:
    """Links that leave ``docs/`` become repository paths; a missing target is a warning."""

    def replace(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if re.match(r"[a-z]+:", target) or target.startswith("/"):
            return match.group(0)
        resolved = (page.parent / target).resolve()
        if resolved.is_relative_to(DOCS):
            return match.group(0)
        if not resolved.exists():
            log.warning("%s links to %s, which does not exist", page.relative_to(ROOT), target)
            return match.group(0)
        return f"{text} (`{resolved.relative_to(ROOT)}` in the repository)"

    chunks = re.split(r"(^```.*?^```)", markdown, flags=re.M | re.S)
    return "".join(c if c.startswith("```") else LINK.sub(replace, c) for c in chunks)


def _split_namespace_submodules() -> None:
    """Make griffe list the other distributions' ``kiln/*`` folders as submodules of ``kiln``."""
    original = griffe.ModuleFinder.submodules
    if getattr(original, "kiln_split", False):
        return

    def submodules(self: griffe.ModuleFinder, module: griffe.Module) -> list[Any]:
        found = list(original(self, module))
        if module.name == "kiln" and isinstance(module.filepath, Path):
            own = module.filepath.parent
            others = [p / "kiln" for p in self.search_paths if (p / "kiln").is_dir()]
            found += self.iter_submodules([d for d in others if d != own])
        return sorted(found, key=lambda item: len(item[0]))  # parents before children

    submodules.kiln_split = True  # type: ignore[attr-defined]
    griffe.ModuleFinder.submodules = submodules  # type: ignore[method-assign]


try:
    import griffe
except ImportError:  # the tests' environment: only the generators are used there
    pass
else:

    class ReSTDocstrings(griffe.Extension):
        """A griffe extension: every docstring of the API reference in Markdown."""

        def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
            if obj.docstring is not None:
                obj.docstring.value = rst_to_markdown(obj.docstring.value)


def on_config(config: Any) -> Any:
    """MkDocs' event, before any page is read: set up the API reference's loader."""
    _split_namespace_submodules()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs' event: generate the marked tables, then settle links out of ``docs/``."""
    source = Path(page.file.abs_src_path)
    return outside_links(expand(markdown, page.file.src_path), source)
