"""resume_at_<offset>: continue a function from a break with hand-captured values."""

import copy
import dis
import importlib.util
import inspect
import sys
import types
from pathlib import Path

import pytest

from kiln.capture.breaks.resume import STACK_NULL, STACK_VALUE, make_resume
from kiln.capture.bytecode import PY311, VERSION, decode, stack_depths
from kiln.capture.errors import CaptureError, Unsupported


def _load(stem):
    spec = importlib.util.spec_from_file_location(stem, Path(__file__).with_name(f"{stem}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


corpus = _load("bytecode_corpus_tools").load_sibling("bytecode_corpus")


_PAIRS = {"LOAD_FAST_LOAD_FAST": "LOAD_FAST", "STORE_FAST_LOAD_FAST": "STORE_FAST"}


def offsets_of(fn, opname, arg=None):
    """Where ``opname`` (with ``arg``) starts, also as the first half of a 3.13 pair."""
    return [
        i.offset
        for i in dis.get_instructions(fn)
        if (i.opname == opname and (arg is None or i.argval == arg))
        or (arg is not None and _PAIRS.get(i.opname) == opname and i.argval[0] == arg)
    ]


def call_start(fn, name):
    """Where a call of the local ``name`` starts: its NULL before 3.13, the load after."""
    if VERSION.null_above_callable:
        return offsets_of(fn, "LOAD_FAST", name)[0]
    return next(o for o in offsets_of(fn, "PUSH_NULL") if o < offsets_of(fn, "LOAD_FAST", name)[0])


class Log:
    def __init__(self, suppress):
        self.events = []
        self.suppress = suppress

    def __enter__(self):
        self.events.append("enter")
        return self

    def __exit__(self, kind, value, tb):
        self.events.append(("exit", kind))
        return self.suppress


def in_with(cm, x):
    with cm:
        y = x * 2
        if y > 10:
            raise ValueError(y)
    return y


@pytest.mark.parametrize("x", [3, 8])
def test_with_block_is_reentered(x):
    off = offsets_of(in_with, "LOAD_FAST", "x")[0]
    # y is live too: an exception before its store is suppressed, then y is read
    assert make_resume(in_with.__code__, off, 1).locals == ("x", "y")
    r = make_resume(in_with.__code__, off, 1, live=("x",))
    cm = Log(suppress=True)
    cm.__enter__()
    fn = r.make_function(in_with.__globals__)
    assert fn(cm.__exit__, x) == 2 * x
    expected = Log(suppress=True)
    assert in_with(expected, x) == 2 * x
    assert cm.events == expected.events


def in_try(a, b):
    try:
        q = a / b
    except ZeroDivisionError:
        q = "caught"
    return q


def test_try_block_is_reentered():
    off = offsets_of(in_try, "LOAD_FAST", "a")[0]
    fn = make_resume(in_try.__code__, off, 0).make_function(in_try.__globals__)
    assert fn(1, 0) == "caught"
    assert fn(6, 3) == 2.0


def in_for(xs):
    total = 0
    for x in xs:
        total += x
    return total


def test_for_loop_with_iterator_on_stack():
    off = offsets_of(in_for, "LOAD_FAST", "total")[0]
    r = make_resume(in_for.__code__, off, 1, live=("total", "x"))
    it = iter([1, 2, 3, 4])
    first = next(it)
    assert r.make_function(in_for.__globals__)(it, 100, first) == 110


def keyword_call(a):
    return sorted([a, 1, 2], reverse=True)


@pytest.mark.skipif(VERSION.call_kw, reason="3.13 passes the names on the stack (below)")
def test_break_at_call_with_null_and_keywords():
    off = offsets_of(keyword_call, "CALL")[0]
    r = make_resume(keyword_call.__code__, off, [STACK_NULL, STACK_VALUE, STACK_VALUE, STACK_VALUE])
    assert r.stack_args == ("___stack1", "___stack2", "___stack3")
    assert r.make_function({})(sorted, [3, 9, 1], False) == [1, 3, 9]
    # the break moves back to the call setup (KW_NAMES, and PRECALL on 3.11)
    assert r.entry_offset == offsets_of(keyword_call, "KW_NAMES")[0] < off
    if PY311:
        assert any(i.opname == "PRECALL" for i in dis.get_instructions(r.code))


@pytest.mark.skipif(not VERSION.call_kw, reason="CALL_KW is 3.13's")
def test_break_at_call_kw_with_null_and_keywords():
    off = offsets_of(keyword_call, "CALL_KW")[0]
    kinds = [STACK_VALUE, STACK_NULL, STACK_VALUE, STACK_VALUE, STACK_VALUE]
    r = make_resume(keyword_call.__code__, off, kinds)
    assert r.stack_args == ("___stack0", "___stack2", "___stack3", "___stack4")
    assert r.make_function({})(sorted, [3, 9, 1], False, ("reverse",)) == [1, 3, 9]
    assert r.entry_offset == off


def truth_branch(v):
    if v:
        return "yes"
    return "no"


@pytest.mark.parametrize(("value", "expected"), [(0, "no"), ([], "no"), ([0], "yes"), (2, "yes")])
def test_resume_at_a_conditional_jump_takes_the_truth_of_any_value(value, expected):
    # 3.13's jumps test for the exact True/False a TO_BOOL made; a break hands in the value
    jump = next(i for i in dis.get_instructions(truth_branch) if i.opname.startswith("POP_JUMP"))
    r = make_resume(truth_branch.__code__, jump.offset, 1)
    assert r.make_function({})(value) == expected


def with_cells(n):
    count = n

    def bump():
        nonlocal count
        count += 1

    bump()
    return count


def test_cells_are_passed_as_closure():
    off = call_start(with_cells, "bump")
    r = make_resume(with_cells.__code__, off)
    assert r.locals == ("bump",) and r.closure == ("count",)
    cell = types.CellType(41)
    bump_code = next(c for c in with_cells.__code__.co_consts if isinstance(c, types.CodeType))
    bump = types.FunctionType(bump_code, {}, "bump", None, (cell,))
    assert r.make_function({}, [cell])(bump) == 42
    assert cell.cell_contents == 42


def test_free_variables_are_passed_as_closure():
    k = 3

    def uses_free(m):
        t = m * k
        return t + k

    off = offsets_of(uses_free, "LOAD_FAST", "t")[0]
    r = make_resume(uses_free.__code__, off)
    assert r.closure == ("k",)
    assert r.make_function({}, uses_free.__closure__)(5) == 8


def unbound_read(a):
    b = a + 1
    return b


def test_locals_not_passed_are_unbound():
    off = offsets_of(unbound_read, "LOAD_FAST", "b")[0]
    fn = make_resume(unbound_read.__code__, off, 0, live=()).make_function({})
    with pytest.raises(UnboundLocalError):
        fn()


def gen(n):
    for i in range(n):  # noqa: UP028 (the loop variable is the break point)
        yield i


def handler_code(a):
    try:
        return 1 / a
    except ZeroDivisionError:
        b = a + 1
        return b


def test_refusals_say_why():
    module_code = compile("x = 1\ny = x + 1\n", "<m>", "exec")
    with pytest.raises(Unsupported, match="class bodies"):
        make_resume(module_code, 4)
    with pytest.raises(Unsupported, match="generator"):
        make_resume(gen.__code__, offsets_of(gen, "LOAD_FAST", "i")[0], 2)
    off = offsets_of(handler_code, "LOAD_FAST", "a")[-1]
    body = decode(handler_code.__code__)
    depth = stack_depths(body.instrs, body.exception_table)[body.index(off)]
    with pytest.raises(Unsupported, match="exception handler") as info:
        make_resume(handler_code.__code__, off, depth)
    assert info.value.kind == "resume_in_handler" and info.value.hint
    with pytest.raises(CaptureError, match="stack items"):
        make_resume(in_for.__code__, offsets_of(in_for, "LOAD_FAST", "total")[0], 0)
    with pytest.raises(CaptureError, match="not the start of an instruction"):
        make_resume(in_for.__code__, 1)
    with pytest.raises(CaptureError, match="stack kinds"):
        make_resume(in_for.__code__, 0, ["tensor"])
    with pytest.raises(CaptureError, match="closure cells"):
        make_resume(with_cells.__code__, call_start(with_cells, "bump"), live=("count",))


# Every corpus function without cells, resumed at statement starts with an empty stack,
# from locals captured by tracing the original: the outcome must equal the original's.


def _resume_points(fn, limit=5):
    body = decode(fn.__code__)
    depths = stack_depths(body.instrs, body.exception_table)
    points, last_line = [], None
    for ins, depth in zip(body.instrs, depths):
        line = ins.lineno
        if (
            depth == 0
            and line is not None
            and line != last_line
            and ins.opname not in ("RESUME", "NOP")
        ):
            points.append(ins.offset)
        last_line = line if line is not None else last_line
    step = max(1, len(points) // limit)
    return points[::step][:limit]


def _capture_locals(fn, args, kwargs, offset):
    captured = []

    def tracer(frame, event, arg):
        if frame.f_code is not fn.__code__:
            return None
        frame.f_trace_opcodes = True
        # 3.12 honours f_trace_opcodes only from the next call on; line events suffice
        # for statement starts.
        if event in ("line", "opcode") and frame.f_lasti == offset and not captured:
            captured.append(copy.deepcopy(dict(frame.f_locals)))
        return tracer

    sys.settrace(tracer)
    try:
        fn(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    except Exception:
        pass
    finally:
        sys.settrace(None)
    return captured[0] if captured else None


def _outcome(thunk):
    try:
        return ("ok", thunk())
    except Exception as e:
        return ("raise", type(e), str(e))


def _corpus_cases():
    seen = set()
    for fn, args, kwargs in corpus.CASES:
        code = fn.__code__
        if code.co_cellvars or code.co_flags & 0x20 or fn.__name__ in seen:
            continue
        seen.add(fn.__name__)
        yield fn, args, kwargs


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"), list(_corpus_cases()), ids=lambda v: getattr(v, "__name__", "")
)
def test_corpus_resumes_at_statement_starts(fn, args, kwargs):
    expected = _outcome(lambda: fn(*copy.deepcopy(args), **copy.deepcopy(kwargs)))
    tried = 0
    for offset in _resume_points(fn, limit=5 if len(fn.__code__.co_code) < 1000 else 2):
        try:
            values = _capture_locals(fn, args, kwargs, offset)
        except (TypeError, copy.Error):
            continue  # a local that cannot be copied
        if values is None:
            continue  # not reached with these arguments
        try:
            r = make_resume(fn.__code__, offset, 0)
        except Unsupported as e:
            assert e.kind == "resume_in_handler"
            continue
        passed = tuple(n for n in r.locals if n in values)
        r = make_resume(fn.__code__, offset, 0, live=passed)
        resumed = r.make_function(fn.__globals__, fn.__closure__ or ())
        got = _outcome(lambda: resumed(*copy.deepcopy([values[n] for n in passed])))
        for _ in range(10):  # again, once CPython has specialized the resumed code
            assert _outcome(lambda: resumed(*copy.deepcopy([values[n] for n in passed]))) == got
        if inspect.isgenerator(expected[1]):
            continue
        assert got == expected, (fn.__name__, offset)
        tried += 1
    assert tried or fn.__name__ in ("empty_body",)


def raises_later(a):
    b = a + 1
    c = [b][b]
    return c


def test_tracebacks_show_the_users_lines():
    import traceback

    off = offsets_of(raises_later, "LOAD_FAST", "b")[0]
    fn = make_resume(raises_later.__code__, off, 0).make_function({})
    with pytest.raises(IndexError) as info:
        fn(2)
    frame = traceback.extract_tb(info.tb)[-1]
    assert frame.lineno == raises_later.__code__.co_firstlineno + 2
    assert frame.name.startswith("resume_at_")


def after_try(a):
    try:
        a = 1 / a
    except ZeroDivisionError:
        pass
    b = a - 1
    return b


def test_dead_code_before_the_break_is_dropped():
    off = offsets_of(after_try, "LOAD_FAST", "a")[-1]
    r = make_resume(after_try.__code__, off, 0)
    ops = [i.opname for i in dis.get_instructions(r.code)]
    assert "BINARY_OP" in ops and "PUSH_EXC_INFO" not in ops and "JUMP_FORWARD" not in ops
    assert r.code.co_exceptiontable == b""
    assert r.make_function({})(5) == 4


def late_closure(n):
    k = n * 2
    m = 1

    def get():
        return k + m

    return get() + k


def test_cells_by_value_when_no_closure_exists_yet():
    from kiln.capture.breaks.resume import CELLS_AS_VALUES

    # where the closure's cells are loaded (3.13: LOAD_FAST of the cells' slots)
    if VERSION.cells_by_load_fast:
        off = offsets_of(late_closure, "LOAD_FAST", "k")[0]
    else:
        off = offsets_of(late_closure, "LOAD_CLOSURE")[0]
    r = make_resume(late_closure.__code__, off, 0, cells=CELLS_AS_VALUES)
    assert r.closure == () and set(r.locals) == {"k", "m"}
    values = {"k": 10, "m": 5}
    assert r.make_function({})(*(values[n] for n in r.locals)) == 25
    assert r.code.co_cellvars == late_closure.__code__.co_cellvars
    # an empty cell is simply left out
    r = make_resume(late_closure.__code__, off, 0, live=("k",), cells=CELLS_AS_VALUES)
    with pytest.raises(NameError):
        r.make_function({})(10)
    with pytest.raises(CaptureError, match="cells must be"):
        make_resume(late_closure.__code__, off, 0, cells="copy")


def comprehension(xs, k):
    return [x * k for x in xs]


def test_break_inside_a_comprehension():
    # 3.12 inlines the comprehension: the stack holds the saved x (NULL: x was unbound),
    # the list being built and the iterator. 3.11 runs it in its own code object.
    # 3.13 stores and loads x in one STORE_FAST_LOAD_FAST: the break is before it, with
    # the item still on the stack.
    if PY311:
        code = next(c for c in comprehension.__code__.co_consts if hasattr(c, "co_code"))
        kinds, k_cell = [STACK_VALUE, STACK_VALUE], True
    else:
        code = comprehension.__code__
        kinds, k_cell = [STACK_NULL, STACK_VALUE, STACK_VALUE], False
    op = "STORE_FAST_LOAD_FAST" if VERSION.superinstructions else "LOAD_FAST"
    off = [i.offset for i in dis.get_instructions(code) if i.opname == op and "x" in i.argval][-1]
    it = iter([1, 2, 3])
    x = next(it)
    item = [x] if VERSION.superinstructions else []
    r = make_resume(code, off, kinds + [STACK_VALUE] * len(item))
    assert ("x" in r.locals) != bool(item)
    values = {"x": x, "k": 10}
    cells = [types.CellType(10)] if k_cell else []
    fn = r.make_function({}, cells)
    assert fn([], it, *item, *(values[n] for n in r.locals)) == [10, 20, 30]


def two_breaks(a, b):
    c = a + b
    d = c * 2
    e = d - a
    return [c, d, e]


def test_resume_of_a_resume_function():
    first = make_resume(two_breaks.__code__, offsets_of(two_breaks, "STORE_FAST", "d")[0], 1)
    inner = first.code
    off = [
        i.offset
        for i in dis.get_instructions(inner)
        if i.opname == "STORE_FAST" and i.argval == "e"
    ][0]
    second = make_resume(inner, off, 1)
    assert second.name == f"resume_at_{off}" and set(second.locals) == {"c", "d"}
    values = {"c": 5, "d": 10}
    assert second.make_function({})(7, *(values[n] for n in second.locals)) == [5, 10, 7]
