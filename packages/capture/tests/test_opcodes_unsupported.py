"""Class statements, imports, and the instructions capture never models: graph breaks that keep
the graphs around them, never a frame that compiles nothing."""

from __future__ import annotations

import dis
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from kiln.capture import capture, explain
from kiln.capture.opcodes import HANDLERS
from kiln.capture.opcodes.unsupported import refuse, why_not_modelled

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from opcode_checks import check_calls  # noqa: E402

PY312 = sys.version_info >= (3, 12)


def with_class(x: torch.Tensor) -> tuple[torch.Tensor, str]:
    y = x.sin()

    class Scale:
        k = 3

        def apply(self, v: torch.Tensor) -> torch.Tensor:
            return v * self.k

    return Scale().apply(y).cos(), Scale.__qualname__


def test_class_statement_breaks_once_with_graphs_before_and_after() -> None:
    reports = check_calls(
        with_class, lambda i: (torch.randn(3),), graphs=2, breaks=["class_statement"]
    )
    assert reports[0].ops_per_graph == [["sin"], ["mul", "cos"]]
    assert "class Scale" in reports[0].breaks[0].explanation
    assert reports[0].breaks[0].frame.source == "class Scale:"


def test_class_statement_makes_a_new_class_on_every_call() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, type]:
        class Local:
            pass

        return x + 1, Local

    result = capture(
        fn,
        (torch.randn(2),),
        {},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
    )
    first = result.function(torch.randn(2))[1]
    second = result.function(torch.randn(2))[1]
    assert first is not second and first.__name__ == second.__name__ == "Local"


def test_class_statement_with_bases_and_closure() -> None:
    def fn(x: torch.Tensor, k: int) -> torch.Tensor:
        y = x * 2

        class Base:
            scale = k

        class Child(Base):
            offset = k + 1

        return y * Child.scale + Child.offset

    # nothing runs between the two statements: the graph there is empty
    check_calls(fn, lambda i: (torch.randn(3), i), graphs=2, breaks=["class_statement"] * 2)


def test_imports_of_loaded_modules_are_lookups() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional
        from torch.nn import functional as F
        from torch.nn.modules import linear

        return F.relu(x) * torch.nn.functional.gelu(x) + len(linear.__name__)

    check_calls(fn, lambda i: (torch.randn(3),), graphs=1)


def test_a_first_import_runs_in_python_between_two_graphs(tmp_path: Path) -> None:
    name = "kiln_capture_fresh_module"
    (tmp_path / f"{name}.py").write_text("K = 7\n")
    sys.path.insert(0, str(tmp_path))
    namespace: dict[str, Any] = {"torch": torch}
    source = f"""
        def fn(x):
            y = x.sin()
            import {name}
            return y * {name}.K
    """
    exec(textwrap.dedent(source), namespace)
    try:
        x = torch.randn(3)
        first = explain(namespace["fn"])(x)  # before eager runs it: the module is new
        assert [b.kind for b in first.breaks] == ["unsupported_call"]
        assert first.ops_per_graph == [["sin"], ["mul"]]
        torch.testing.assert_close(first.result, namespace["fn"](x))
        check_calls(namespace["fn"], lambda i: (torch.randn(3),), graphs=1)  # now a lookup
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


_gone = 1


def deletes_a_global(x: torch.Tensor) -> torch.Tensor:
    global _gone
    y = x.sin() * 2
    del _gone
    _gone = 1
    return y.cos()


def test_an_instruction_without_python_equivalent_keeps_the_graph_before() -> None:
    # DELETE_GLOBAL is no call or operator: the frame runs on in Python from it
    reports = check_calls(
        deletes_a_global, lambda i: (torch.randn(3),), graphs=1, breaks=["side_effect"]
    )
    assert reports[0].ops_per_graph == [["sin", "mul"]]


@pytest.mark.skipif(not PY312, reason="PEP 695 type aliases are 3.12 syntax")
def test_type_alias_statement_keeps_the_graph_before() -> None:
    namespace: dict[str, Any] = {"torch": torch}
    source = """
        def fn(x):
            y = x.sin() * 2
            type Pair = tuple[int, int]
            return y.cos(), Pair.__name__
    """
    exec(textwrap.dedent(source), namespace)
    reports = check_calls(
        namespace["fn"], lambda i: (torch.randn(3),), graphs=1, breaks=["unsupported_opcode"]
    )
    assert "INTRINSIC_TYPEALIAS" in reports[0].breaks[0].explanation


_NEVER_IN_FUNCTIONS = {
    "ASYNC_GEN_WRAP",
    "BEFORE_ASYNC_WITH",
    "END_ASYNC_FOR",
    "GET_AITER",
    "GET_ANEXT",
    "GET_AWAITABLE",
    "DELETE_NAME",
    "LOAD_CLASSDEREF",
    "LOAD_FROM_DICT_OR_DEREF",
    "LOAD_FROM_DICT_OR_GLOBALS",
    "LOAD_LOCALS",
    "LOAD_NAME",
    "SETUP_ANNOTATIONS",
    "STORE_NAME",
    "IMPORT_STAR",
    "PRINT_EXPR",
    # pseudo-ops and the interpreter's own (3.13's ENTER_EXECUTOR replaces a JUMP_BACKWARD in
    # the adaptive code only; EXIT_INIT_CHECK is in the shim a specialized class call runs)
    "ENTER_EXECUTOR",
    "EXIT_INIT_CHECK",
    "INTERPRETER_EXIT",
    "RESERVED",
    "LOAD_SUPER_METHOD",
    "LOAD_ZERO_SUPER_ATTR",
    "LOAD_ZERO_SUPER_METHOD",
    "POP_BLOCK",
    "SETUP_CLEANUP",
    "SETUP_FINALLY",
    "SETUP_WITH",
    "STORE_FAST_MAYBE_NULL",
}


def test_only_instructions_functions_never_run_are_left_unmodelled() -> None:
    refused = {name for name in dis.opmap if HANDLERS[name] is refuse}
    unexpected = {n for n in refused if not n.startswith("INSTRUMENTED_")} - _NEVER_IN_FUNCTIONS
    assert not unexpected
    for name in refused:
        assert why_not_modelled(name).startswith(name + ": ")


def test_a_class_body_is_never_traced() -> None:
    code = compile("class A:\n    x: int = 1\n    y = x\n", "<m>", "exec")
    body = next(c for c in code.co_consts if hasattr(c, "co_code"))
    names = {ins.opname for ins in dis.get_instructions(body)}
    assert names & {"LOAD_NAME", "STORE_NAME", "SETUP_ANNOTATIONS"}
    assert "a class or module body" in why_not_modelled("STORE_NAME")


@pytest.mark.skipif(not PY312, reason="sys.monitoring is 3.12's")
def test_instrumented_code_reads_back_without_instrumented_opcodes() -> None:
    def f(x: int) -> int:
        for i in range(2):
            x = x + i
        return x

    monitoring = sys.monitoring  # type: ignore[attr-defined]
    tool = next(i for i in range(6) if monitoring.get_tool(i) is None)
    monitoring.use_tool_id(tool, "kiln-test")
    try:
        monitoring.register_callback(tool, monitoring.events.LINE, lambda *a: None)
        monitoring.set_events(tool, monitoring.events.LINE | monitoring.events.PY_START)
        f(1)
        assert f.__code__._co_code_adaptive != f.__code__.co_code  # instrumented now
        names = {ins.opname for ins in dis.get_instructions(f)}
        assert not {n for n in names if n.startswith("INSTRUMENTED_")}
    finally:
        monitoring.set_events(tool, 0)
        monitoring.free_tool_id(tool)
