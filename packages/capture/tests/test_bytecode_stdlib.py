"""Every code object of standard-library modules and of the test files round-trips byte
for byte.

Compiled from source here, so the code is this interpreter's own compiler
output: async code, decorators, big classes, nested scopes and all.
"""

import importlib
import types
from pathlib import Path

import pytest

from kiln.capture.bytecode import assemble, decode, live_locals, max_stack_depth

MODULES = [
    "dis",
    "dataclasses",
    "contextlib",
    "asyncio.tasks",
    "json",
    "json.decoder",
    "json.encoder",
    "string",
    "collections",
    "functools",
    "argparse",
    "inspect",
    "typing",
    "enum",
    "ast",
    "re._parser",
    "pathlib",
    "logging",
    "unittest.mock",
]
ROOT = Path(__file__).resolve().parents[3]
TEST_FILES = sorted(
    str(p.relative_to(ROOT))
    for pattern in ("packages/*/tests/*.py", "tests/*.py")
    for p in ROOT.glob(pattern)
)
FIELDS = [
    "co_code",
    "co_linetable",
    "co_exceptiontable",
    "co_stacksize",
    "co_names",
    "co_varnames",
    "co_nlocals",
    "co_flags",
]


def _walk(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _walk(c)


def _round_trips(path):
    with open(path) as f:
        top = compile(f.read(), path, "exec")
    for code in _walk(top):
        body = decode(code)
        rebuilt = assemble(body)
        for field in FIELDS:
            assert getattr(rebuilt, field) == getattr(code, field), (code.co_qualname, field)
        assert len(rebuilt.co_consts) == len(code.co_consts)
        assert max_stack_depth(body.instrs, body.exception_table) == code.co_stacksize
        assert len(live_locals(body.instrs, body.exception_table)) == len(body.instrs)


@pytest.mark.parametrize("name", MODULES)
def test_module_round_trips(name):
    _round_trips(importlib.import_module(name).__file__)


def test_test_files_round_trip():
    assert len(TEST_FILES) > 50
    for name in TEST_FILES:
        _round_trips(ROOT / name)
