"""The swappable ``ops`` namespace: nesting, late binding, and a clear error."""

import pytest

from kiln.loopir import LoopIRError, V, ops, set_ops_handler
from kiln.loopir.printing import PrintHandler


class Adds:
    def add(self, a, b):
        return a + b


def test_handlers_nest_and_bind_at_call_time():
    add = ops.add  # taken before any handler exists
    with set_ops_handler(Adds()):
        assert add(2, 3) == 5
        with set_ops_handler(PrintHandler()) as printer:
            assert add("x", "y") == "tmp0"
            assert printer.lines == ["    tmp0 = add(x, y)"]
            assert V.ops_handler is printer
        assert add(1, 1) == 2


def test_calling_ops_without_a_handler_says_what_to_do():
    with pytest.raises(LoopIRError, match="set_ops_handler"):
        ops.sin(1.0)


def test_kernel_and_graph_slots():
    with V.set_kernel("k"), V.set_graph("g"):
        assert (V.kernel, V.graph) == ("k", "g")
    assert V.kernel is None and V.graph is None
