"""What the opcode-family tests share: run a program eagerly and under ``explain`` and compare.

Each call draws fresh inputs, so a graph that baked in a value of the first call
shows; the graph count and the kinds of the graph breaks are asserted on every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from test_breaks_harness import same  # tests/ is on the path of the files that use this

from kiln.capture import ExplainOutput, explain


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
