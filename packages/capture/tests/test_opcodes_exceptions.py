"""``except*`` and exception chaining inside the traced code, in one graph."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch

from kiln.capture import explain

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from opcode_checks import check_calls  # noqa: E402


def _group(kind: int) -> BaseException:
    if kind == 0:
        return ValueError("v")
    if kind == 1:
        return ExceptionGroup("g", [ValueError("v"), TypeError("t")])
    if kind == 2:
        return ExceptionGroup("g", [KeyError("k"), ExceptionGroup("h", [ValueError("w")])])
    return TypeError("t")


def handled(x: torch.Tensor, kind: int) -> torch.Tensor:
    y = x.sin()
    try:
        raise _group(kind)
    except* ValueError:
        y = y + 1
    except* (TypeError, KeyError) as eg:
        y = y * len(eg.exceptions)
    return y.cos()


@pytest.mark.parametrize("kind", range(4))
def test_except_star_branches_per_group(kind: int) -> None:
    check_calls(handled, lambda i: (torch.randn(3), kind), graphs=1)


def reraised(x: torch.Tensor, kind: int) -> torch.Tensor:
    y = x * 2
    try:
        try:
            raise _group(kind)
        except* ValueError:
            y = y + 1
            raise
        except* TypeError:
            y = y - 1
            raise RuntimeError("new")
    except BaseException as e:
        leaves = [type(v).__name__ for v in getattr(e, "exceptions", [e])]
        return y * len(leaves) + len(type(e).__name__)
    return y


@pytest.mark.parametrize("kind", range(4))
def test_except_star_reraise_and_new_exceptions_match_python(kind: int) -> None:
    check_calls(reraised, lambda i: (torch.randn(3), kind), graphs=1)


def test_what_escapes_except_star_is_the_python_group() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        try:
            raise ExceptionGroup("g", [ValueError("v"), TypeError("t")])
        except* ValueError:
            pass
        return x

    with pytest.raises(ExceptionGroup) as info:
        explain(fn)(torch.randn(2))
    assert [type(e) for e in info.value.exceptions] == [TypeError]


def test_exception_raised_in_handler_chains_the_handled_one() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        try:
            try:
                raise KeyError("k")
            except KeyError:
                raise ValueError("v")
        except ValueError as e:
            return x * (2 if isinstance(e.__context__, KeyError) else 3)

    check_calls(fn, lambda i: (torch.randn(2),), graphs=1)


def test_stop_iteration_leaving_a_generator_is_a_runtime_error() -> None:
    def gen(x: torch.Tensor) -> Iterator[torch.Tensor]:
        yield x
        raise StopIteration

    def fn(x: torch.Tensor) -> torch.Tensor:
        try:
            return sum(gen(x))
        except RuntimeError:
            return x * 5

    check_calls(fn, lambda i: (torch.randn(2),), graphs=1)


def test_raise_from_sets_the_cause_a_handler_reads() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        try:
            try:
                raise KeyError("k")
            except KeyError as e:
                raise ValueError("v") from e
        except ValueError as e:
            return x * (2 if isinstance(e.__cause__, KeyError) else 3)

    def suppressed(x: torch.Tensor) -> torch.Tensor:
        try:
            try:
                raise KeyError("k")
            except KeyError:
                raise ValueError("v") from None
        except ValueError as e:
            return x * (5 if e.__suppress_context__ and e.__cause__ is None else 7)

    check_calls(fn, lambda i: (torch.randn(2),), graphs=1)
    check_calls(suppressed, lambda i: (torch.randn(2),), graphs=1)
