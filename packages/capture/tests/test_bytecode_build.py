"""Code built from scratch: new signatures, cells and free variables, calls, loops, handlers."""

import dis

import pytest

from kiln.capture.bytecode import PY311, VERSION, ExceptionEntry, Instr, assemble, decode
from kiln.capture.bytecode.build import (
    binary_op,
    build_function,
    call,
    load_callable,
    make_cell,
    make_function,
    new_body,
    to_bool,
)
from kiln.capture.errors import CaptureError


def _load_callable(load):
    """``load`` and the NULL a call finds beside it, in this Python's order."""
    null = Instr("PUSH_NULL")
    return [load, null] if VERSION.null_above_callable else [null, load]


def test_signature_with_star_args_and_kwonly():
    body = new_body("f", ["a", "b"], kwonly=["k"], varargs="rest", varkw="kw")
    body.instrs += [
        *load_callable(lambda *xs, **kws: (xs, sorted(kws.items()))),
        Instr("LOAD_FAST", "a"),
        Instr("LOAD_FAST", "b"),
        Instr("LOAD_FAST", "rest"),
        Instr("LOAD_FAST", "k"),
        *call(4),
        Instr("LOAD_FAST", "kw"),
        Instr("BUILD_TUPLE", 2),
        Instr("RETURN_VALUE"),
    ]
    fn = make_function(assemble(body), {}, kwdefaults={"k": 9})
    assert fn(1, 2, 3, 4, z=5) == (((1, 2, (3, 4), 9), []), {"z": 5})
    assert fn(1, 2, k=0) == (((1, 2, (), 0), []), {})
    assert "LOAD_FAST" in dis.Bytecode(fn).dis()


def test_keyword_call_and_new_locals():
    body = new_body("g", ["x"])
    body.instrs += [
        Instr("LOAD_FAST", "x"),
        Instr("STORE_FAST", "tmp"),  # a new local: varnames grows
        *load_callable(dict),
        Instr("LOAD_FAST", "tmp"),
        Instr("LOAD_CONST", 2),
        *call(2, kw_names=("a", "b")),
        Instr("RETURN_VALUE"),
    ]
    code = assemble(body)
    assert code.co_varnames == ("x", "tmp") and code.co_nlocals == 2
    assert make_function(code, {})(7) == {"a": 7, "b": 2}


def test_cells_and_free_variables():
    # resume-style: a free variable read from the closure, a cell for an inner function.
    body = new_body("h", ["x"], cellvars=["x"], freevars=["scale"])
    inner = new_body("inner", [], freevars=["x"], qualname="h.<locals>.inner")
    inner.instrs += [Instr("LOAD_DEREF", "x"), Instr("RETURN_VALUE")]
    inner_code = assemble(inner)
    body.instrs += [
        Instr("LOAD_CLOSURE", "x"),
        Instr("BUILD_TUPLE", 1),
        Instr("LOAD_CONST", inner_code),
        *build_function(0x08),
        Instr("STORE_FAST", "fn"),
        Instr("LOAD_DEREF", "x"),
        Instr("LOAD_DEREF", "scale"),
        binary_op("*"),
        Instr("STORE_DEREF", "x"),
        *_load_callable(Instr("LOAD_FAST", "fn")),
        *call(0),
        Instr("RETURN_VALUE"),
    ]
    code = assemble(body)
    assert code.co_cellvars == ("x",) and code.co_freevars == ("scale",)
    fn = make_function(code, {}, closure=[make_cell(10)])
    assert fn(4) == 40


def test_backward_conditional_loop():
    # counts down with a conditional jump backward (3.12 has none: the assembler rewrites it)
    body = new_body("countdown", ["n"])
    top = Instr("LOAD_FAST", "n")
    body.instrs += [
        Instr("LOAD_CONST", 0),
        Instr("STORE_FAST", "acc"),
        top,
        Instr("LOAD_CONST", 1),
        binary_op("-"),
        Instr("STORE_FAST", "n"),
        Instr("LOAD_FAST", "acc"),
        Instr("LOAD_FAST", "n"),
        binary_op("+"),
        Instr("STORE_FAST", "acc"),
        Instr("LOAD_FAST", "n"),
        *to_bool(),
        Instr("POP_JUMP_IF_TRUE", top),
        Instr("LOAD_FAST", "acc"),
        Instr("RETURN_VALUE"),
    ]
    fn = make_function(assemble(body), {})
    assert fn(5) == 4 + 3 + 2 + 1


def test_generic_jump_and_handler():
    body = new_body("safe_div", ["a", "b"])
    handler = Instr("PUSH_EXC_INFO")
    done = Instr("RETURN_VALUE")
    div = [Instr("LOAD_FAST", "a"), Instr("LOAD_FAST", "b"), binary_op("/")]
    cleanup = Instr("COPY", 3)
    body.instrs += [
        Instr("NOP"),
        *div,
        Instr("JUMP", done),
        handler,
        Instr("POP_TOP"),
        Instr("POP_EXCEPT"),
        Instr("LOAD_CONST", "div by zero"),
        Instr("JUMP", done),
        cleanup,
        Instr("POP_EXCEPT"),
        Instr("RERAISE", 1),
        done,
    ]
    body.exception_table = [
        ExceptionEntry(div[0], div[-1], handler, depth=0, lasti=False),
        ExceptionEntry(handler, body.instrs[-5], cleanup, depth=1, lasti=True),
    ]
    fn = make_function(assemble(body), {})
    assert fn(6, 3) == 2.0
    assert fn(1, 0) == "div by zero"


def test_errors_are_actionable():
    body = new_body("f", ["a"])
    body.instrs += [Instr("LOAD_DEREF", "nope"), Instr("RETURN_VALUE")]
    with pytest.raises(CaptureError, match="neither a cell nor a free variable"):
        assemble(body)
    body = new_body("f", ["a"])
    body.instrs += [Instr("JUMP", Instr("NOP")), Instr("RETURN_VALUE")]
    with pytest.raises(CaptureError, match="not in the instruction list"):
        assemble(body)
    with pytest.raises(CaptureError, match="duplicate argument"):
        new_body("f", ["a", "a"])
    body = new_body("g", [], freevars=["v"])
    body.instrs += [Instr("LOAD_DEREF", "v"), Instr("RETURN_VALUE")]
    with pytest.raises(CaptureError, match="closure cells"):
        make_function(assemble(body), {})
    with pytest.raises(CaptureError, match="unknown binary operator"):
        binary_op("<>")


def test_format_and_log(caplog, tmp_path):
    import logging

    from kiln.capture import artifacts
    from kiln.capture.bytecode.format import format_bytecode, format_code, log_code

    def f(a):
        try:
            return [x for x in a]
        except TypeError:
            return None

    from kiln.capture.bytecode import decode

    listing = format_bytecode(decode(f.__code__))
    assert "except #" in listing and "-> #" in listing
    assert "stacksize=" in format_code(f.__code__)
    with caplog.at_level(logging.INFO, logger="kiln.capture.bytecode"):
        log_code("original", f.__code__)
    assert "original bytecode of" in caplog.text
    artifacts.set_debug_dir(tmp_path)
    try:
        with artifacts.frame("f"):
            log_code("resume_at_4", f.__code__)
    finally:
        artifacts.set_debug_dir(None)
    assert list(tmp_path.glob("*/bytecode_resume_at_4.txt"))


def test_assemble_leaves_its_input_alone():
    body = new_body("countdown", ["n"])
    top = Instr("LOAD_FAST", "n")
    done = Instr("LOAD_FAST", "n")
    body.instrs += [
        top,
        Instr("LOAD_CONST", 1),
        binary_op("-"),
        Instr("STORE_FAST", "n"),
        Instr("LOAD_FAST", "n"),
        *to_bool(),
        Instr("POP_JUMP_IF_TRUE", top),
        Instr("JUMP", done),
        done,
        Instr("RETURN_VALUE"),
    ]
    before = [(i.opname, i.arg) for i in body.instrs]
    first = assemble(body)
    assert [(i.opname, i.arg) for i in body.instrs] == before
    assert assemble(body).co_code == first.co_code
    assert make_function(first, {})(3) == 0


def test_backward_conditional_inside_a_handler_range():
    # the rewritten jump (3.12) must stay covered by the entry that covered it
    body = new_body("f", ["n"])
    top = Instr("LOAD_FAST", "n")
    cond = Instr("POP_JUMP_IF_TRUE", top)
    handler = Instr("PUSH_EXC_INFO")
    done = Instr("LOAD_CONST", "done")
    body.instrs += [
        top,
        Instr("LOAD_CONST", 1),
        binary_op("-"),
        Instr("STORE_FAST", "n"),
        Instr("LOAD_FAST", "n"),
        *to_bool(),
        cond,
        Instr("JUMP", done),
        handler,
        Instr("POP_TOP"),
        Instr("POP_EXCEPT"),
        Instr("LOAD_CONST", "caught"),
        Instr("RETURN_VALUE"),
        done,
        Instr("RETURN_VALUE"),
    ]
    body.exception_table = [ExceptionEntry(top, cond, handler, 0, False)]
    fn = make_function(assemble(body), {})
    assert fn(4) == "done"
    assert fn("x") == "caught"


def test_bare_global_name_and_bad_args():
    body = new_body("f", [])
    body.instrs += [Instr("LOAD_GLOBAL", "len"), Instr("RETURN_VALUE")]
    assert make_function(assemble(body), {"len": 7})() == 7
    for bad in (Instr("LOAD_FAST", 3), Instr("LOAD_GLOBAL", (True,)), Instr("BUILD_TUPLE", "x")):
        body = new_body("f", [])
        body.instrs += [bad, Instr("RETURN_VALUE")]
        with pytest.raises(CaptureError, match="needs"):
            assemble(body)


@pytest.mark.skipif(not PY311, reason="PRECALL exists on 3.11 only")
def test_precall_must_precede_call():
    body = new_body("f", [])
    body.instrs += [
        *load_callable(len),
        Instr("LOAD_CONST", "ab"),
        Instr("PRECALL", 1),
        Instr("NOP"),
        Instr("CALL", 1),
        Instr("RETURN_VALUE"),
    ]
    with pytest.raises(CaptureError, match="PRECALL"):
        assemble(body)


@pytest.mark.skipif(PY311, reason="3.12 loops end with END_FOR")
def test_for_iter_must_target_end_for():
    body = decode(_loop.__code__)
    end_for = next(ins for ins in body.instrs if ins.opname == "END_FOR")
    body.insert_before(end_for, [Instr("NOP")])
    with pytest.raises(CaptureError, match="END_FOR"):
        assemble(body)


def _loop(xs):
    for x in xs:
        pass
