"""Round trip of the corpus: decode → assemble → run, equal to the original."""

import dis
import importlib.util
import types
from pathlib import Path

import pytest

from kiln.capture.bytecode import decode, max_stack_depth
from kiln.capture.bytecode.format import format_code


def _load(stem):
    spec = importlib.util.spec_from_file_location(stem, Path(__file__).with_name(f"{stem}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tools = _load("bytecode_corpus_tools")
corpus = tools.load_sibling("bytecode_corpus")
roundtrip, roundtrip_code, outcome = tools.roundtrip, tools.roundtrip_code, tools.outcome
FUNCTIONS = list({id(fn): fn for fn, _, _ in corpus.CASES}.values())


def _fields(code):
    return (
        code.co_code,
        tuple("<code>" if isinstance(c, types.CodeType) else c for c in code.co_consts),
        code.co_linetable,
        code.co_names,
        code.co_varnames,
        code.co_cellvars,
        code.co_freevars,
        code.co_exceptiontable,
        code.co_stacksize,
        code.co_flags,
        code.co_nlocals,
        list(code.co_positions()),
    )


def _walk(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _walk(c)


def test_corpus_is_large():
    assert len(FUNCTIONS) >= 60


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"), corpus.CASES, ids=lambda v: getattr(v, "__name__", "")
)
def test_roundtrip_runs_equal(fn, args, kwargs):
    assert outcome(roundtrip(fn), args, kwargs, repeat=12) == outcome(fn, args, kwargs)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_roundtrip_is_byte_identical(fn):
    for original, rebuilt in zip(
        _walk(fn.__code__), _walk(roundtrip_code(fn.__code__)), strict=True
    ):
        assert _fields(rebuilt) == _fields(original), original.co_qualname


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_stack_depth_matches_cpython(fn):
    for code in _walk(fn.__code__):
        body = decode(code)
        assert max_stack_depth(body.instrs, body.exception_table) == code.co_stacksize, (
            code.co_qualname
        )


def test_dis_prints_assembled_code():
    code = roundtrip_code(corpus.long_jumps.__code__)
    text = format_code(code)
    assert "EXTENDED_ARG" in text and "long_jumps" in text
    assert dis.Bytecode(code).dis() == dis.Bytecode(corpus.long_jumps.__code__).dis()


def test_docstring_survives():
    assert roundtrip(corpus.docstring_only).__doc__ == corpus.docstring_only.__doc__


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"), corpus.CASES[::3], ids=lambda v: getattr(v, "__name__", "")
)
def test_padded_with_nops_runs_equal(fn, args, kwargs):
    """Hundreds of NOPs scattered through the body: offsets, EXTENDED_ARGs and tables all move."""
    import random

    from kiln.capture.bytecode import Instr, assemble
    from kiln.capture.bytecode.build import make_function

    rng = random.Random(fn.__name__)
    body = decode(fn.__code__)
    first = next(i for i, ins in enumerate(body.instrs) if ins.opname == "RESUME") + 1
    for _ in range(300):
        at = rng.randrange(first, len(body.instrs) + 1)
        # 3.11 keeps PRECALL; CALL together, 3.13 END_FOR; POP_TOP (FOR_ITER skips both)
        if body.instrs[at - 1].opname not in ("PRECALL", "END_FOR"):
            body.instrs.insert(at, Instr("NOP"))
    padded = make_function(
        assemble(body),
        fn.__globals__,
        closure=fn.__closure__,
        defaults=fn.__defaults__,
        kwdefaults=fn.__kwdefaults__,
    )
    assert outcome(padded, args, kwargs, repeat=12) == outcome(fn, args, kwargs)
