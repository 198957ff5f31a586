"""Stack depth and liveness on hand-made examples (the corpus checks depth against CPython)."""

import importlib.util
from pathlib import Path

import pytest

from kiln.capture.bytecode import (
    ExceptionEntry,
    Instr,
    decode,
    live_locals,
    max_stack_depth,
    stack_depths,
)
from kiln.capture.bytecode.assemble import split_pair
from kiln.capture.bytecode.build import new_body
from kiln.capture.errors import CaptureError

_PAIRS = ("LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST")


def _halves(body):
    """``body`` with 3.13's two-local superinstructions split into their halves."""
    for ins in list(body.instrs):
        if ins.opname in _PAIRS:
            body.replace(ins, split_pair(ins))
    return body


def _live_before(fn, opname, arg=None, nth=0):
    body = _halves(decode(fn.__code__))
    live = live_locals(body.instrs, body.exception_table)
    hits = [
        i
        for i, ins in enumerate(body.instrs)
        if ins.opname == opname and (arg is None or ins.arg == arg)
    ]
    return live[hits[nth]]


def branches(a, b, c):
    x = a + 1
    if b:
        y = x
    else:
        y = c
    return y


def loop(n):
    t = 0
    i = 0
    while i < n:
        t += i
        i += 1
    return t


def handler_reads(a, b):
    try:
        r = a / b
    except ZeroDivisionError:
        return a
    return r


def deleted(a):
    x = a
    unused = 3
    del x
    return a


def test_live_on_both_branches():
    assert _live_before(branches, "LOAD_FAST", "a") == {"a", "b", "c"}
    assert _live_before(branches, "STORE_FAST", "x") == {"b", "c"}
    assert _live_before(branches, "LOAD_FAST", "b") == {"b", "c", "x"}
    assert _live_before(branches, "RETURN_VALUE") == frozenset()
    assert _live_before(branches, "LOAD_FAST", "y") == {"y"}


def test_live_around_a_loop():
    # After the loop header, all three are live: the back edge carries them.
    assert _live_before(loop, "LOAD_FAST", "n") == {"i", "n", "t"}
    assert _live_before(loop, "STORE_FAST", "i", nth=1) == {"n", "t"}  # i is being overwritten
    assert _live_before(loop, "LOAD_FAST", "t", nth=-1) == {"t"}


def test_superinstructions_live_as_their_halves():
    spec = importlib.util.spec_from_file_location(
        "bytecode_corpus", Path(__file__).with_name("bytecode_corpus.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    corpus = [fn for fn, _, _ in module.CASES]
    for fn in [loop, branches, deleted, handler_reads, *corpus]:
        body = decode(fn.__code__)
        fused = live_locals(body.instrs, body.exception_table)
        starts = list(body.instrs)
        split = _halves(body.clone())
        halves = live_locals(split.instrs, split.exception_table)
        firsts = {ins.offset: live for ins, live in zip(split.instrs, halves, strict=True)}
        for ins, live in zip(starts, fused, strict=True):
            assert live == firsts[ins.offset], (fn.__name__, ins)


def test_handler_keeps_locals_live():
    # 'a' is read by the handler, so it is live through the protected division.
    assert "a" in _live_before(handler_reads, "BINARY_OP")
    assert _live_before(handler_reads, "STORE_FAST", "r") >= {"a"}


def test_store_kills_and_delete_reads():
    assert "unused" not in _live_before(deleted, "LOAD_CONST", 3)
    assert "x" in _live_before(deleted, "DELETE_FAST", "x")
    assert "x" not in _live_before(deleted, "LOAD_FAST", "a", nth=1)


def test_stack_depths_before_each_instruction():
    def f(a, b):
        return (a + b) * a

    body = decode(f.__code__)
    depths = stack_depths(body.instrs, body.exception_table)
    ops = [(ins.opname, d) for ins, d in zip(body.instrs, depths)]
    assert ops[-1] == ("RETURN_VALUE", 1)
    assert ("BINARY_OP", 2) in ops
    assert max_stack_depth(body.instrs) == f.__code__.co_stacksize


def test_handler_depth_from_table():
    body = decode(handler_reads.__code__)
    depths = stack_depths(body.instrs, body.exception_table)
    for entry in body.exception_table:
        target = body.instrs.index(entry.target)
        assert depths[target] == entry.depth + entry.lasti + 1


def test_inconsistent_depths_are_refused():
    body = new_body("bad", ["a"])
    join = Instr("RETURN_VALUE")
    body.instrs += [
        Instr("LOAD_FAST", "a"),
        Instr("LOAD_FAST", "a"),
        Instr("POP_JUMP_IF_TRUE", join),  # depth 1 at join on this edge
        Instr("LOAD_FAST", "a"),  # depth 2 on the fall-through
        join,
    ]
    with pytest.raises(CaptureError, match="stack depths"):
        stack_depths(body.instrs)


def test_underflow_is_refused():
    body = new_body("bad", [])
    body.instrs += [Instr("POP_TOP"), Instr("RETURN_VALUE")]
    with pytest.raises(CaptureError, match="underflow"):
        max_stack_depth(body.instrs)


def test_unreachable_code_has_no_depth():
    body = new_body("f", ["a"])
    body.instrs += [Instr("LOAD_FAST", "a"), Instr("RETURN_VALUE"), Instr("NOP")]
    assert stack_depths(body.instrs)[-1] is None


def test_reachable_and_prune():
    from kiln.capture.bytecode.analysis import prune_unreachable, reachable

    body = decode(handler_reads.__code__)
    everything = reachable(body.instrs, body.exception_table)
    normal = reachable(body.instrs, body.exception_table, handlers=False)
    assert len(everything) == len(body.instrs)
    handler = body.instrs.index(body.exception_table[0].target)
    assert handler in everything and handler not in normal

    # cut the handler off: the division's entry goes, and so does the handler
    body = new_body("f", ["a"])
    dead = Instr("NOP")
    body.instrs += [Instr("LOAD_FAST", "a"), Instr("RETURN_VALUE"), dead, Instr("RETURN_VALUE")]
    body.exception_table = [ExceptionEntry(body.instrs[1], dead, dead, 0, False)]
    instrs, table = prune_unreachable(body.instrs, body.exception_table)
    assert dead in instrs  # reached through the handler edge of RETURN_VALUE's entry
    assert [(e.start, e.end) for e in table] == [(body.instrs[1], dead)]
    instrs, table = prune_unreachable(body.instrs[:4], [])
    assert dead not in instrs and len(instrs) == 3


def test_falling_off_the_end_is_refused():
    body = new_body("f", ["a"])
    body.instrs += [Instr("LOAD_FAST", "a"), Instr("POP_TOP")]
    with pytest.raises(CaptureError, match="falls off the end"):
        max_stack_depth(body.instrs)
