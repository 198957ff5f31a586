"""The README and the user docs: examples run as written, links resolve inside the repository,
and the reference tables the docs site generates cover everything the code defines."""

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

import kiln
from kiln import loopir

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _pages():
    return [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)]


def _markdown_files():
    """Every Markdown file of the repository (not of environments, builds or hidden folders)."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_")) and d not in ("build", "site")]
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(found)


def _python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def _hook():
    spec = importlib.util.spec_from_file_location("kiln_pages", DOCS / "hooks" / "kiln_pages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_usage_example_runs():
    block = _python_blocks(ROOT / "README.md")[0]
    kiln.reset()
    exec(compile(block, "README.md", "exec"), {})
    assert kiln.stats().frames_captured == 1


def test_relative_links_resolve_inside_the_repository():
    """The README, the docs and every package README and changelog."""
    broken = []
    pages = _markdown_files()
    assert ROOT / "README.md" in pages and DOCS / "index.md" in pages
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            resolved = (page.parent / target.split("#")[0]).resolve()
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
    assert "../" not in re.sub(r"\]\([^)]*\)", "", (ROOT / "README.md").read_text())


@pytest.mark.parametrize(
    "page",
    ["index.md", "getting-started.md", "capture.md", "debugging.md", "export.md", "backends.md"],
)
def test_docs_examples_run(page):
    """Each page's ```python blocks run in order as one program (```py marks a fragment)."""
    scope = {}
    try:
        for block in _python_blocks(DOCS / page):
            exec(compile(block, page, "exec"), scope)
    finally:
        loopir.backend.unregister_backend("cpu")  # backends.md registers its own
        kiln.reset()


def test_generated_tables_cover_the_code():
    hook = _hook()
    reasons = hook._break_reasons_module().REASONS
    assert all(f"`{kind}`" in hook.break_kinds() for kind in reasons)
    assert all(f"`{key}`" in hook.compile_options() for key in kiln.OPTIONS)
    assert all(f"`{mode}`" in hook.modes() for mode in kiln.MODES)
    assert all(f"`{name}`" in hook.log_channels() for name in kiln.logs.CHANNELS)
    settings = hook.package_settings()
    assert all(f"`{f}`" in settings for f in kiln.guards.GuardsConfig.__dataclass_fields__)


def test_every_environment_variable_is_described():
    hook = _hook()
    read = hook.environment_variables()
    assert {"KILN_LOGS", "KILN_DEBUG_DIR", "KILN_CACHE_DIR"} <= set(read)
    assert sorted(set(read) - set(hook.ENV_HELP)) == []  # read but not described
    assert sorted(set(hook.ENV_HELP) - set(read)) == []  # described but no longer read


def test_every_marker_has_a_generator():
    hook = _hook()
    for page in _pages():
        for name in hook.MARKER.findall(page.read_text()):
            assert name in hook.GENERATORS, f"{page.name}: {name}"
