"""Graph breaks anywhere in a function, end to end, on the whole corpus.

The function is rewritten so that on arriving at the break it stores every
stack item in a local of its own (``STORE_FAST`` takes NULLs too) and hands
``locals()`` and its cells (``LOAD_CLOSURE``) to a bridge; locals reports the NULL items as missing, which
tells the bridge the stack kinds, exactly as the symbolic evaluator knows
them. The bridge builds ``resume_at_<offset>`` and returns what it returns.
The outcome must equal the original function's, also once CPython has
specialized the code.
"""

import importlib.util
from pathlib import Path

import pytest

from kiln.capture.breaks.resume import STACK_NULL, STACK_VALUE, make_resume
from kiln.capture.bytecode import ExceptionEntry, Instr, assemble, code_info, decode
from kiln.capture.bytecode.analysis import reachable
from kiln.capture.bytecode.build import call, load_callable, make_function


def _load(stem):
    spec = importlib.util.spec_from_file_location(stem, Path(__file__).with_name(f"{stem}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tools = _load("bytecode_corpus_tools")
corpus = tools.load_sibling("bytecode_corpus")


def break_points(code):
    """Indices a graph break may stop at: normally reachable, not inside a call's setup."""
    info = code_info(code)
    instrs = info.body.instrs
    normal = reachable(instrs, info.body.exception_table, handlers=False)
    first = next(i for i, ins in enumerate(instrs) if ins.opname == "RESUME") + 1
    return [
        i
        for i in range(first, len(instrs))
        if i in normal
        and instrs[i - 1].opname not in ("KW_NAMES", "PRECALL")
        # FOR_ITER lands just past END_FOR (3.12) or the POP_TOP after it (3.13)
        and instrs[i].opname != "END_FOR"
        and instrs[i - 1].opname != "END_FOR"
    ]


def _unprotect(body, at):
    """Cut exception entries at ``at`` so code inserted before it is not protected."""
    index = {id(x): j for j, x in enumerate(body.instrs)}
    i = index[id(at)]
    out = []
    for e in body.exception_table:
        lo, hi = index[id(e.start)], index[id(e.end)]
        if lo < i <= hi:
            out.append(ExceptionEntry(e.start, body.instrs[i - 1], e.target, e.depth, e.lasti))
            out.append(ExceptionEntry(at, e.end, e.target, e.depth, e.lasti))
        else:
            out.append(e)
    body.exception_table = out


def break_at(fn, i):
    """``fn`` rewritten to hand over to a resume function on reaching instruction ``i``."""
    code = fn.__code__
    info = code_info(code)
    depth = info.depths[i]
    offset = info.body.instrs[i].offset
    slots = [f"___s{k}" for k in range(depth)]

    own_cells = [c for c in code.co_cellvars if c not in code.co_freevars]

    def bridge(local_values, cells):
        kinds = [STACK_VALUE if s in local_values else STACK_NULL for s in slots]
        stack = [local_values[s] for s in slots if s in local_values]
        names = make_resume(code, offset, kinds).locals
        live = tuple(n for n in names if n in local_values)
        r = make_resume(code, offset, kinds, live=live)
        by_name = dict(zip(code.co_freevars, fn.__closure__ or ()))
        by_name.update(zip(own_cells, cells))
        resumed = r.make_function(fn.__globals__, [by_name[c] for c in r.closure])
        return resumed(*stack, *(local_values[n] for n in live))

    body = decode(code)
    target = body.instrs[i]
    handover = [Instr("STORE_FAST", s) for s in reversed(slots)]
    handover += [*load_callable(bridge), *load_callable(locals), *call(0)]
    handover += [Instr("LOAD_CLOSURE", c) for c in own_cells]
    handover += [Instr("BUILD_TUPLE", len(own_cells)), *call(2)]
    handover.append(Instr("RETURN_VALUE"))
    for ins in handover:
        ins.positions = target.positions
    _unprotect(body, target)
    for ins in body.instrs:
        if ins.is_jump and ins.arg is target:
            ins.arg = handover[0]
    body.instrs[i:i] = handover
    return make_function(
        assemble(body),
        fn.__globals__,
        closure=fn.__closure__,
        defaults=fn.__defaults__,
        kwdefaults=fn.__kwdefaults__,
    )


def _cases():
    seen = set()
    for fn, args, kwargs in corpus.CASES:
        code = fn.__code__
        if code.co_flags & 0x20 or fn.__name__ in seen:
            continue
        seen.add(fn.__name__)
        yield fn, args, kwargs


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"), list(_cases()), ids=lambda v: getattr(v, "__name__", "")
)
def test_break_anywhere_and_resume(fn, args, kwargs):
    expected = tools.outcome(fn, args, kwargs)
    points = break_points(fn.__code__)
    step = max(1, len(points) // (10 if len(points) < 300 else 3))  # big ones cost more per point
    for i in points[::step]:
        got = tools.outcome(break_at(fn, i), args, kwargs, repeat=10)
        assert got == expected, (fn.__name__, i, code_info(fn.__code__).body.instrs[i])
