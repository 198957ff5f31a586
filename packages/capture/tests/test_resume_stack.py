"""Graph breaks in the middle of expressions, end to end, on the whole corpus.

For a point where the stack holds only values, the function is rewritten so
that on arriving there it packs its stack into a tuple and hands it, with
``locals()``, to a bridge that builds ``resume_at_<offset>`` and returns what
it returns: exactly what transformed code does at a graph break. The outcome
must equal the original function's.
"""

import importlib.util
from pathlib import Path

import pytest

from kiln.capture.bytecode import ExceptionEntry, Instr, assemble, code_info, decode
from kiln.capture.bytecode.build import call, make_function
from kiln.capture.errors import Unsupported
from kiln.capture.resume import make_resume


def _load(stem):
    spec = importlib.util.spec_from_file_location(stem, Path(__file__).with_name(f"{stem}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tools = _load("bytecode_corpus_tools")
corpus = tools.load_sibling("bytecode_corpus")

V, N, MAYBE = "value", "null", "maybe-null"
_PUSH_VALUE = {
    "LOAD_FAST",
    "LOAD_FAST_CHECK",
    "LOAD_CONST",
    "LOAD_DEREF",
    "LOAD_NAME",
    "LOAD_CLOSURE",
}
_TWO_TO_ONE = {"BINARY_OP", "COMPARE_OP", "BINARY_SUBSCR", "IS_OP", "CONTAINS_OP"}
_ONE_TO_ONE = {"UNARY_NEGATIVE", "UNARY_NOT", "UNARY_INVERT", "GET_ITER", "CALL_INTRINSIC_1"}
_POP_ONE = {
    "POP_TOP",
    "STORE_FAST",
    "STORE_DEREF",
    "STORE_GLOBAL",
    "STORE_NAME",
    "LIST_APPEND",
    "LIST_EXTEND",
    "SET_UPDATE",
    "SET_ADD",
    "DICT_UPDATE",
    "DICT_MERGE",
}
_NOTHING = {"NOP", "RESUME", "KW_NAMES", "PRECALL"}


def _step(kinds, ins):
    """The stack kinds after ``ins`` falls through, or None if this model does not know."""
    op, arg, k = ins.opname, ins.arg, list(kinds)

    def pop(n):
        if n > len(k):
            raise IndexError
        del k[len(k) - n :]

    try:
        if op in _NOTHING:
            pass
        elif op in _PUSH_VALUE:
            k.append(V)
        elif op == "LOAD_FAST_AND_CLEAR":
            k.append(MAYBE)
        elif op == "PUSH_NULL":
            k.append(N)
        elif op == "LOAD_GLOBAL":
            k += [N, V] if arg[0] else [V]
        elif op == "LOAD_METHOD" or (op == "LOAD_ATTR" and isinstance(arg, tuple) and arg[0]):
            pop(1)
            k += [MAYBE, V]
        elif op == "LOAD_ATTR":
            pop(1)
            k.append(V)
        elif op in _TWO_TO_ONE:
            pop(2)
            k.append(V)
        elif op == "BINARY_SLICE":
            pop(3)
            k.append(V)
        elif op in _ONE_TO_ONE:
            pop(1)
            k.append(V)
        elif op in ("BUILD_TUPLE", "BUILD_LIST", "BUILD_SET", "BUILD_STRING", "BUILD_SLICE"):
            pop(arg)
            k.append(V)
        elif op == "BUILD_MAP":
            pop(2 * arg)
            k.append(V)
        elif op == "BUILD_CONST_KEY_MAP":
            pop(arg + 1)
            k.append(V)
        elif op == "FORMAT_VALUE":
            pop(2 if arg & 4 else 1)
            k.append(V)
        elif op == "CALL":
            pop(arg + 2)
            k.append(V)
        elif op in _POP_ONE:
            pop(1)
        elif op == "STORE_ATTR":
            pop(2)
        elif op == "STORE_SUBSCR":
            pop(3)
        elif op == "COPY":
            k.append(k[-arg])
        elif op == "SWAP":
            k[-1], k[-arg] = k[-arg], k[-1]
        elif op.startswith("POP_JUMP"):
            pop(1)
        elif op == "FOR_ITER":
            k.append(V)
        elif op == "BEFORE_WITH":
            pop(1)
            k += [V, V]
        elif op == "UNPACK_SEQUENCE":
            pop(1)
            k += [V] * arg
        else:
            return None
    except IndexError:
        return None
    return tuple(k)


def value_only_points(code):
    """Indices where the stack surely holds only values (at least one), with their depth."""
    info = code_info(code)
    instrs = info.body.instrs
    kinds, points = None, []
    for i, ins in enumerate(instrs):
        depth = info.depths[i]
        if depth == 0:
            kinds = ()
        elif ins.offset in info.jump_targets or depth is None:
            kinds = None
        if kinds is not None and len(kinds) != depth:
            kinds = None
        # a break lands before a call's KW_NAMES/PRECALL setup, never inside it
        inside_call_setup = i > 0 and instrs[i - 1].opname in ("KW_NAMES", "PRECALL")
        if kinds and all(x == V for x in kinds) and not inside_call_setup:
            points.append(i)
        if kinds is not None:
            kinds = _step(kinds, ins)
    return points


def _split_entries(body, at):
    """Exception entries that cover ``at`` from before are cut there (inserted code is unprotected)."""
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

    def bridge(stack, local_values):
        names = make_resume(code, offset, depth).locals
        live = tuple(n for n in names if n in local_values)
        r = make_resume(code, offset, depth, live=live)
        resumed = r.make_function(fn.__globals__, fn.__closure__ or ())
        return resumed(*stack, *(local_values[n] for n in live))

    body = decode(code)
    target = body.instrs[i]
    handover = [
        Instr("BUILD_TUPLE", depth),
        Instr("PUSH_NULL"),
        Instr("SWAP", 2),
        Instr("LOAD_CONST", bridge),
        Instr("SWAP", 2),
        Instr("PUSH_NULL"),
        Instr("LOAD_CONST", locals),
        *call(0),
        *call(2),
        Instr("RETURN_VALUE"),
    ]
    for ins in handover:
        ins.positions = target.positions
    for ins in body.instrs:
        if ins.arg is target:
            ins.arg = handover[0]
    _split_entries(body, target)
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
        if code.co_cellvars or code.co_flags & 0x20 or fn.__name__ in seen:
            continue
        seen.add(fn.__name__)
        yield fn, args, kwargs


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"), list(_cases()), ids=lambda v: getattr(v, "__name__", "")
)
def test_break_mid_expression_and_resume(fn, args, kwargs):
    expected = tools.outcome(fn, args, kwargs)
    points = value_only_points(fn.__code__)
    step = max(1, len(points) // 8)
    tried = 0
    for i in points[::step]:
        try:
            broken = break_at(fn, i)
        except Unsupported:
            continue
        got = tools.outcome(broken, args, kwargs, repeat=10)
        if got[0] == "raise" and got[1] is Unsupported:
            continue  # reached only inside a handler: refused, as it should be
        assert got == expected, (fn.__name__, i, code_info(fn.__code__).body.instrs[i])
        tried += 1
    assert tried or not points
