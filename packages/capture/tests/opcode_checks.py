"""What the opcode-family tests share: run a program eagerly and under ``explain`` and compare.

Each call draws fresh inputs, so a graph that baked in a value of the first call
shows; the graph count and the kinds of the graph breaks are asserted on every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.capture import ExplainOutput, explain


def same(actual: Any, expected: Any) -> None:
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected)
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            same(a, e)
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected)
        for k in expected:
            same(actual[k], expected[k])
    else:
        assert actual == expected


def check_calls(
    fn: Callable[..., Any],
    make_args: Callable[[int], tuple[Any, ...]],
    *,
    graphs: int,
    breaks: list[str] | None = None,
    calls: int = 3,
) -> list[ExplainOutput]:
    """``fn`` under ``explain`` equals eager on ``calls`` fresh inputs, with the graphs expected."""
    reports = []
    for i in range(calls):
        args = make_args(i)
        expected = fn(*args)
        report = explain(fn)(*args)
        same(report.result, expected)
        assert report.graph_count == graphs, str(report)
        assert [b.kind for b in report.breaks] == (breaks or []), str(report)
        reports.append(report)
    return reports
