"""The tracer's per-code-object facts: disassembled once, shared, keyed by identity."""

from __future__ import annotations

import dis
import gc

import torch

from kiln.capture import capture, tracer
from kiln.capture.bytecode.decode import decode
from kiln.capture.tracer import _FACTS, code_facts


def _handled(x):
    try:
        return x + 1
    except ValueError:
        return x
    finally:
        x = None  # noqa: F841 - a finally block for the exception table


def test_facts_are_what_dis_and_decode_give():
    code = _handled.__code__
    facts = code_facts(code)
    assert list(facts.instructions) == list(dis.get_instructions(code))
    assert facts.index_of == {ins.offset: i for i, ins in enumerate(facts.instructions)}
    table = decode(code).exception_table
    assert table
    assert list(facts.exception_table(code)) == [
        (e.start.offset, e.end.offset, e.target.offset, e.depth, e.lasti) for e in table
    ]


def test_one_code_object_is_disassembled_once():
    code = _handled.__code__
    assert code_facts(code) is code_facts(code)
    facts = code_facts(code)
    assert facts.exception_table(code) is facts.exception_table(code)


def _make(filename):
    namespace: dict[str, object] = {}
    exec(compile("def f(x):\n    return (lambda y: y * 2)(x)\n", filename, "exec"), namespace)
    return namespace["f"]


def test_equal_code_objects_do_not_share_facts():
    """Code equality ignores the file: two such objects must keep their own constants (a
    nested code object keeps its file, which error messages and line reports read)."""
    a, b = _make("a.py").__code__, _make("b.py").__code__
    assert a == b and a is not b
    fa, fb = code_facts(a), code_facts(b)
    assert fa is not fb
    nested = [ins.argval for ins in fb.instructions if isinstance(ins.argval, type(b))]
    assert [c.co_filename for c in nested] == ["b.py"]


def test_facts_go_with_their_code_object():
    code = _make("gone.py").__code__
    key = id(code)
    code_facts(code)
    assert key in _FACTS
    del code
    gc.collect()
    assert key not in _FACTS


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        try:
            return torch.relu(self.fc(x))
        except ValueError:
            return x


def test_every_inlined_call_of_a_method_reads_the_same_facts(monkeypatch):
    made, tracers = [], []

    class Counting(tracer.CodeFacts):
        def __init__(self, code):
            made.append(code)
            super().__init__(code)

    init = tracer.Tracer.__init__

    def counting_init(self, code, *args, **kwargs):
        tracers.append(code)
        init(self, code, *args, **kwargs)

    monkeypatch.setattr(tracer, "CodeFacts", Counting)
    monkeypatch.setattr(tracer, "_FACTS", {})
    monkeypatch.setattr(tracer.Tracer, "__init__", counting_init)
    blocks = torch.nn.Sequential(_Block(), _Block(), _Block())
    x = torch.randn(2, 3)
    res = capture(
        blocks.forward, (x,), {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f
    )
    forward = _Block.forward.__code__
    assert tracers.count(forward) == 3
    assert made.count(forward) == 1
    assert len(made) == len(set(map(id, tracers)))
    assert torch.equal(res.function(x), blocks(x))
