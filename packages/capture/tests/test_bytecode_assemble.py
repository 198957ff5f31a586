"""Assembling edited code: EXTENDED_ARG growth, edits inside handlers, tables, constants."""

import dis

import pytest

from kiln.capture.bytecode import ExceptionEntry, Instr, Positions, assemble, const_key, decode
from kiln.capture.bytecode.build import binary_op, make_function, new_body
from kiln.capture.bytecode.tables import (
    RawExceptionEntry,
    encode_exception_table,
    parse_exception_table,
)
from kiln.capture.errors import CaptureError


def summing_loop(n):
    t = 0
    for i in range(n):
        t += i
    return t


def guarded(a, b):
    try:
        r = a / b
    except ZeroDivisionError:
        r = "zero"
    return r


def _rebuild(body, fn):
    return make_function(assemble(body), fn.__globals__, defaults=fn.__defaults__)


def test_padding_forces_extended_arg_on_jumps():
    body = decode(summing_loop.__code__)
    store_t = [
        i for i, ins in enumerate(body.instrs) if ins.opname == "STORE_FAST" and ins.arg == "t"
    ][-1]
    body.instrs[store_t:store_t] = [Instr("NOP") for _ in range(600)]
    fn = _rebuild(body, summing_loop)
    assert fn(10) == summing_loop(10)
    jumps = [
        ins
        for ins in dis.get_instructions(fn)
        if ins.opname.startswith(("JUMP_BACKWARD", "FOR_ITER"))
    ]
    assert any(ins.arg > 255 for ins in jumps)
    assert any(ins.opname == "EXTENDED_ARG" for ins in dis.get_instructions(fn))


def test_edits_inside_a_try_stay_protected():
    body = decode(guarded.__code__)
    div = next(i for i, ins in enumerate(body.instrs) if ins.opname == "BINARY_OP")
    # raise inside the protected range, before the division: the handler must see it
    body.instrs[div:div] = [
        Instr("NOP"),
        Instr("LOAD_FAST", "a"),
        Instr("LOAD_CONST", 0),
        binary_op("/"),
        Instr("POP_TOP"),
    ]
    fn = _rebuild(body, guarded)
    assert fn(1, 2) == "zero"
    assert fn(1, 0) == "zero"


def test_positions_survive_every_encoding_form():
    forms = [
        Positions(3, 3, 4, 9),  # short form
        Positions(4, 4, 100, 120),  # one-line form
        Positions(6, 6, 0, 300),  # long: wide columns
        Positions(6, 9, 2, 1),  # long: several lines
        Positions(2, 2, None, None),  # no columns
        None,  # no location
        Positions(1000, 1000, 1, 2),  # big line jump
        Positions(1, 1, 0, 5),  # backwards line jump
    ]
    body = new_body("f", [], firstlineno=2)
    body.instrs += [Instr("NOP").at(p) for p in forms] + [
        Instr("LOAD_CONST", None),
        Instr("RETURN_VALUE"),
    ]
    code = assemble(body)
    got = list(code.co_positions())[len(body.instrs) - len(forms) - 2 : len(body.instrs) - 2]
    want = [tuple(p) if p is not None else (None, None, None, None) for p in forms]
    want[4] = (2, 2, None, None)
    assert got == want


def test_long_runs_split_into_entries():
    body = new_body("f", [])
    where = Positions(5, 5, 1, 2)
    body.instrs += [Instr("NOP").at(where) for _ in range(20)] + [
        Instr("LOAD_CONST", 1).at(where),
        Instr("RETURN_VALUE").at(where),
    ]
    code = assemble(body)
    assert set(list(code.co_positions())[1:]) == {tuple(where)}


def test_exception_table_round_trip_with_large_values():
    rows = [
        RawExceptionEntry(0, 8, 40, 0, False),
        RawExceptionEntry(8, 100_000, 200_002, 70, True),
        RawExceptionEntry(100_000, 100_002, 4, 1 << 12, False),
    ]
    assert parse_exception_table(encode_exception_table(rows)) == rows


def test_decoded_table_is_cpython_table():
    for fn in (guarded, summing_loop):
        body = decode(fn.__code__)
        assert assemble(body).co_exceptiontable == fn.__code__.co_exceptiontable


def test_constants_keep_types_apart():
    class Weird:
        def __eq__(self, other):
            raise AssertionError("constants must not be compared")

        __hash__ = object.__hash__

    w = Weird()
    values = [1, 1.0, True, 0.0, -0.0, (1,), (1.0,), (0.0,), (-0.0,), w, "1", b"1"]
    assert len({const_key(v) for v in values}) == len(values)
    body = new_body("f", [])
    body.instrs += [i for v in values for i in (Instr("LOAD_CONST", v), Instr("POP_TOP"))]
    body.instrs += [Instr("LOAD_CONST", w), Instr("RETURN_VALUE")]
    code = assemble(body)
    assert sum(c is w for c in code.co_consts) == 1
    assert make_function(code, {})() is w


def test_jump_to_an_instruction_with_extended_arg():
    body = new_body("f", ["n"])
    for i in range(300):
        body.instrs += [Instr("LOAD_CONST", f"c{i}"), Instr("POP_TOP")]
    target = Instr("LOAD_CONST", "c299")  # index > 255: carries an EXTENDED_ARG prefix
    body.instrs += [
        Instr("LOAD_CONST", 0),
        Instr("STORE_FAST", "i"),
        target,
        Instr("POP_TOP"),
        Instr("LOAD_FAST", "i"),
        Instr("LOAD_CONST", 1),
        binary_op("+"),
        Instr("STORE_FAST", "i"),
        Instr("LOAD_FAST", "i"),
        Instr("LOAD_FAST", "n"),
        Instr("COMPARE_OP", "<"),
        Instr("POP_JUMP_IF_TRUE", target),
        Instr("LOAD_FAST", "i"),
        Instr("RETURN_VALUE"),
    ]
    fn = make_function(assemble(body), {})
    assert [fn(n) for n in (5, 1, 70, 2, 3)] == [5, 1, 70, 2, 3]  # also once specialized


def test_malformed_tables_are_refused():
    body = new_body("f", [])
    a, b = Instr("NOP"), Instr("NOP")
    body.instrs += [a, b, Instr("LOAD_CONST", None), Instr("RETURN_VALUE")]
    body.exception_table = [ExceptionEntry(b, a, a, 0, False)]
    with pytest.raises(CaptureError, match="ends before it starts"):
        assemble(body)
    body.exception_table = [ExceptionEntry(a, b, a, 0, False), ExceptionEntry(b, b, a, 0, False)]
    with pytest.raises(CaptureError, match="overlap"):
        assemble(body)


def test_forward_only_jumps_refuse_to_go_back():
    body = decode(summing_loop.__code__)
    for_iter = next(ins for ins in body.instrs if ins.opname == "FOR_ITER")
    for_iter.arg = body.instrs[0]
    with pytest.raises(CaptureError, match="cannot jump backward"):
        assemble(body)


def test_insert_before_a_jump_target_and_replace():
    body = decode(summing_loop.__code__)
    for_iter = next(ins for ins in body.instrs if ins.opname == "FOR_ITER")
    # count loop iterations in a new local, before FOR_ITER, also when the loop jumps back
    body.insert_before(
        for_iter,
        [
            Instr("LOAD_FAST_CHECK" if hasattr(dis, "hasarg") else "LOAD_FAST", "t"),
            Instr("POP_TOP"),
        ],
    )
    assert body.instrs[body.instrs.index(for_iter) - 2].opname.startswith("LOAD_FAST")
    assert all(ins.arg is not for_iter for ins in body.instrs if ins.is_jump)
    # replace the addition with a subtraction
    add = next(ins for ins in body.instrs if ins.opname == "BINARY_OP")
    body.replace(add, [binary_op("-")])
    fn = _rebuild(body, summing_loop)
    assert fn(5) == -10


def test_insert_before_keeps_protection():
    body = decode(guarded.__code__)
    div = next(ins for ins in body.instrs if ins.opname == "BINARY_OP")
    first_protected = body.exception_table[0].start
    body.insert_before(
        first_protected,
        [Instr("LOAD_CONST", 1), Instr("LOAD_CONST", 0), binary_op("/"), Instr("POP_TOP")],
    )
    assert _rebuild(body, guarded)(4, 2) == "zero"
    with pytest.raises(CaptureError, match="at least one"):
        body.replace(div, [])
    with pytest.raises(CaptureError, match="not an instruction"):
        body.replace(Instr("NOP"), [Instr("NOP")])
