"""The evaluator's dispatch tables: complete, looked up along the MRO, one owner per kind."""

from __future__ import annotations

import ast
import dis
from pathlib import Path

import pytest

import kiln.capture  # noqa: F401  (imports the evaluator, which fills the tables)
from kiln.capture import dispatch, tracer
from kiln.capture.values.base import Value
from kiln.capture.values.containers import ListValue
from kiln.capture.values.ndarray import NdarrayValue
from kiln.capture.values.objects import ObjectValue
from kiln.capture.values.tensor import TensorValue

OPERATIONS = [v for v in vars(dispatch).values() if isinstance(v, dispatch.Operation)]
SRC = Path(dispatch.__file__).parent


def test_every_operation_has_a_general_handler() -> None:
    assert len(OPERATIONS) == 17
    for op in OPERATIONS:
        assert Value in op.kinds(), op.name


def test_every_opcode_has_a_handler() -> None:
    assert set(dis.opmap) <= set(tracer.OPCODES)


def test_kinds_are_answered_by_the_module_that_owns_them() -> None:
    assert dispatch.GET_ATTR[TensorValue].__module__ == "kiln.capture.torch_calls"
    assert dispatch.GET_ATTR[NdarrayValue].__module__ == "kiln.capture.numpy_calls"
    assert dispatch.GET_ITEM[TensorValue].__module__ == "kiln.capture.torch_calls"
    assert dispatch.GET_ATTR[ObjectValue].__module__ == "kiln.capture.attributes"


def test_lookup_walks_the_mro_and_a_subclass_may_take_over() -> None:
    op: dispatch.Operation[object] = dispatch.Operation("demo")
    op.register(Value)("general")
    op.register(ListValue)("list")

    class SortedList(ListValue):
        pass

    assert op[ObjectValue] == "general"
    assert op[SortedList] == "list"
    op.register(SortedList)("sorted")
    assert op[SortedList] == "sorted"
    assert op[ListValue] == "list"


def test_an_operand_of_higher_priority_answers_from_either_side() -> None:
    op: dispatch.Operation[object] = dispatch.Operation("demo")
    op.register(Value)("python")
    op.register(NdarrayValue, priority=1)("numpy")
    op.register(TensorValue, priority=2)("torch")
    assert op.answering(ObjectValue, ListValue) == ["python"]
    assert op.answering(ListValue, TensorValue) == ["torch", "python"]
    assert op.answering(NdarrayValue, TensorValue) == ["torch", "numpy", "python"]
    assert op.answering(NdarrayValue, ListValue) == ["numpy", "python"]
    assert op.answering(ListValue, NdarrayValue) == ["numpy", "python"]
    assert dispatch.BINARY_OP.answering(ObjectValue, TensorValue)[0].__module__ == (
        "kiln.capture.torch_calls"
    )


def test_each_operand_kind_is_asked_once_the_left_first_on_a_tie() -> None:
    op: dispatch.Operation[object] = dispatch.Operation("demo")
    op.register(Value)("general")
    op.register(ListValue)("list")
    op.register(ObjectValue)("object")
    assert op.answering(ListValue, ObjectValue) == ["list", "object", "general"]
    assert op.answering(ObjectValue, ListValue) == ["object", "list", "general"]
    assert op.answering(ListValue, ListValue) == ["list", "general"]
    assert op.answering(NdarrayValue, ListValue) == ["list", "general"]


def test_a_kind_has_one_owner_per_operation() -> None:
    op: dispatch.Operation[object] = dispatch.Operation("demo")
    op.register(ListValue)("first")
    with pytest.raises(ValueError, match="already has a handler for ListValue"):
        op.register(ListValue)("second")


def test_a_missing_handler_names_the_operation() -> None:
    op: dispatch.Operation[object] = dispatch.Operation("demo")
    with pytest.raises(LookupError, match="no demo handler for ListValue"):
        op[ListValue]


def _imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_values_and_the_tracer_do_not_import_the_layers_above_them() -> None:
    above = ("kiln.capture.opcodes", "kiln.capture.dispatch", "kiln.capture.evaluator")
    evaluator = {m.__name__ for m in kiln.capture.evaluator.MODULES}
    for path in [*(SRC / "values").glob("*.py"), SRC / "tracer.py", SRC / "wrap.py"]:
        for name in _imported(path):
            assert not name.startswith(above), (path.name, name)
            assert name not in evaluator, (path.name, name)
