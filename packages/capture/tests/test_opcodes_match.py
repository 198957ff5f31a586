"""``match`` statements (MATCH_SEQUENCE, MATCH_MAPPING, MATCH_KEYS, MATCH_CLASS) in one graph."""

from __future__ import annotations

import collections
import dataclasses
import sys
from typing import Any, NamedTuple

import pytest
import torch

from kiln.capture import capture

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from opcode_checks import check_calls  # noqa: E402


@dataclasses.dataclass
class Scale:
    factor: float
    shift: torch.Tensor


class Pair(NamedTuple):
    left: torch.Tensor
    right: torch.Tensor


class Plain:
    """No ``__match_args__``: only keyword sub-patterns apply."""

    def __init__(self, k: int) -> None:
        self.k = k


def route(x: torch.Tensor, spec: Any) -> torch.Tensor:
    y = x.sin()
    match spec:
        case [a, b]:
            y = y * a + b
        case [a, *rest] if len(rest) > 1:
            y = y + a * len(rest)
        case {"scale": s, **rest}:
            y = y * s + len(rest)
        case Scale(f, shift=t):
            y = y * f + t
        case Pair(l, r):
            y = l * y + r
        case Plain(k=2):
            y = y - 2
        case int(n) | float(n):
            y = y * n
        case torch.Tensor():
            y = y + spec
        case "tanh":
            y = y.tanh()
        case None:
            y = y.neg()
        case _:
            y = y - 1
    return y.cos()


def _specs(x: torch.Tensor) -> list[Any]:
    return [
        [2, 3],
        (1, 2, 3, 4),
        {"scale": 3, "a": 1, "b": 2},
        Scale(2.0, torch.randn(3)),
        Pair(torch.randn(3), torch.randn(3)),
        Plain(2),
        Scale(0.5, torch.zeros(3)),
        4,
        2.5,
        torch.randn(3),
        "tanh",
        "relu",
        None,
        collections.OrderedDict(scale=2),
        [1],
    ]


@pytest.mark.parametrize("which", range(15))
def test_every_pattern_kind_in_one_graph(which: int) -> None:
    check_calls(route, lambda i: (torch.randn(3), _specs(torch.randn(3))[which]), graphs=1)


def test_the_case_taken_follows_the_subject_each_call() -> None:
    specs = [[2, 3], {"scale": 2}, Scale(1.5, torch.zeros(3)), None]
    check_calls(route, lambda i: (torch.randn(3), specs[i]), graphs=1, calls=4)


def test_keyword_sub_pattern_that_fails_falls_through() -> None:
    def fn(x: torch.Tensor, p: Plain) -> torch.Tensor:
        match p:
            case Plain(k=2):
                return x * 2
            case Plain(missing=_):
                return x * 4
            case _:
                return x * 3

    check_calls(fn, lambda i: (torch.randn(2), Plain(2 + i % 2)), graphs=1, calls=2)


def test_str_is_not_a_sequence_pattern() -> None:
    def fn(x: torch.Tensor, s: Any) -> torch.Tensor:
        match s:
            case [a, b]:
                return x * 2
            case _:
                return x * 3

    check_calls(fn, lambda i: (torch.randn(2), "ab"), graphs=1)


def test_a_tensor_subject_against_tensor_and_sequence_patterns() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        match x:
            case [a, b]:  # a tensor is no sequence pattern's subject
                return a + b
            case torch.Tensor(shape=(n,)):
                return x * n
        return x

    check_calls(fn, lambda i: (torch.randn(i + 2),), graphs=1)


def test_mapping_keys_of_a_module_config_dict() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cfg = {"act": "gelu", "scale": 2.0}
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            match self.cfg:
                case {"act": "relu"}:
                    x = self.lin(x).relu()
                case {"act": "gelu", "scale": s}:
                    x = torch.nn.functional.gelu(self.lin(x)) * s
            return x

    m = M()
    check_calls(m, lambda i: (torch.randn(2, 3),), graphs=1)


def test_class_pattern_errors_are_python_errors() -> None:
    def too_many(x: torch.Tensor, s: Any) -> torch.Tensor:
        match s:
            case Plain(a):
                return x * a
        return x

    with pytest.raises(TypeError, match="accepts 0 positional sub-patterns"):
        too_many(torch.randn(2), Plain(1))
    with pytest.raises(Exception):  # noqa: B017 - the capture refuses with Python's error
        capture(
            too_many,
            (torch.randn(2), Plain(1)),
            {},
            compile_graph=lambda gm, ex: gm.forward,
            wrap_callable=lambda f: f,
        )


def test_nested_patterns_self_matching_builtins_and_guards() -> None:
    def fn(x: torch.Tensor, spec: Any) -> torch.Tensor:
        match spec:
            case list([int(a), float() as b]) if a > 1:
                return x * a + b
            case {"inner": {"k": [_, *tail]}} if tail:
                return x - len(tail)
            case (Scale(factor=float(f)), str(name)):
                return x * f + len(name)
            case dict(d) if "q" in d:
                return x / d["q"]
        return x

    specs = [[3, 0.5], {"inner": {"k": [1, 2, 3]}}, (Scale(2.0, torch.zeros(2)), "ab"), {"q": 4}]
    check_calls(fn, lambda i: (torch.randn(2), specs[i]), graphs=1, calls=4)
