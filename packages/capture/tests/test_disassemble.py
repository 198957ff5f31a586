"""``bytecode.disassemble.instructions`` gives what ``dis.get_instructions`` gives, field for
field and type for type, on every code object of large modules (compiled here from source:
this interpreter's own compiler output) and on bodies that need EXTENDED_ARG."""

import dis
import importlib
import types
from pathlib import Path

import pytest
import torch.nn.functional

from kiln.capture.bytecode.disassemble import instructions

CORPUS = str(Path(__file__).with_name("bytecode_corpus.py"))
MODULES = ["dis", "argparse", "inspect", "typing", "ast", "unittest.mock", "asyncio.tasks"]


def _walk(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _walk(c)


def _same(code):
    want = tuple(dis.get_instructions(code))
    got = instructions(code)
    assert got == want, code.co_qualname
    for a, b in zip(got, want, strict=True):
        assert type(a) is type(b) and type(a.positions) is type(b.positions)
        assert type(a.argval) is type(b.argval), (code.co_qualname, a)


@pytest.mark.parametrize("module", [*MODULES, torch.nn.functional.__name__, CORPUS])
def test_module_code_objects(module):
    path = module if module == CORPUS else importlib.import_module(module).__file__
    with open(path) as f:
        top = compile(f.read(), path, "exec")
    for code in _walk(top):
        _same(code)


def test_extended_args_and_far_jumps():
    names = [f"v{i}" for i in range(300)]
    body = "\n".join(
        f"    {n} = {i}.5 if x > {i} else f'{{x!r:>{i}}}'" for i, n in enumerate(names)
    )
    loop = body.replace("\n", "\n    ")
    src = f"def big(x, *, k=1):\n{body}\n    while x:\n    {loop}\n        x -= 1\n    return k\n"
    namespace: dict = {}
    exec(compile(src, "<big>", "exec"), namespace)
    _same(namespace["big"].__code__)
    assert any(i.opname == "EXTENDED_ARG" for i in instructions(namespace["big"].__code__))
