"""code_info: cached per-offset facts for the evaluator."""

import dis

import pytest

from kiln.capture.bytecode import code_info
from kiln.capture.errors import CaptureError


def f(xs, k):
    out = 0
    for x in xs:
        if x > k:
            out += x
    return out


def test_facts_by_offset():
    info = code_info(f.__code__)
    assert code_info(f.__code__) is info
    ins = {i.offset: i for i in dis.get_instructions(f)}
    for_iter = next(o for o, i in ins.items() if i.opname == "FOR_ITER")
    assert info.at(for_iter).opname == "FOR_ITER"
    assert info.stack_depth(for_iter) == 1  # the iterator
    assert info.live_at(for_iter) == {"k", "out"}
    assert for_iter in info.jump_targets  # the loop's back edge lands here
    with pytest.raises(CaptureError, match="not the start"):
        info.at(for_iter + 1)


def test_body_is_shared_clone_before_editing():
    info = code_info(f.__code__)
    copy = info.body.clone()
    copy.instrs.clear()
    assert info.body.instrs


def test_equal_code_objects_of_two_files_are_analysed_apart():
    src = "def f(x):\n    return x + 1\n"
    a: dict[str, object] = {}
    b: dict[str, object] = {}
    exec(compile(src, "first.py", "exec"), a)
    exec(compile(src, "second.py", "exec"), b)
    ca, cb = a["f"].__code__, b["f"].__code__  # type: ignore[attr-defined]
    assert ca == cb  # == ignores the file
    assert code_info(ca).code.co_filename == "first.py"
    assert code_info(cb).code.co_filename == "second.py"
