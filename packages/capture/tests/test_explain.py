"""kiln.capture.explain: graph and break counts, reasons with user lines, ops and guards."""

from __future__ import annotations

import importlib
import logging

import numpy as np
import torch

from kiln.capture import ExplainOutput, GuardKind, counters, explain
from kiln.capture.breaks.reasons import REASONS

# the module itself: the package exports the function under its name
explain_module = importlib.import_module("kiln.capture.explain")


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


def two_breaks(x):
    y = x.sin()
    print("y", y.sum())
    z = y * float(np.float32(2))
    return z


def no_break(x):
    return x.cos() + 1


def test_toy_example_report():
    a, b = torch.randn(5), -torch.randn(5).abs()
    report = explain(toy_example)(a, b)
    assert isinstance(report, ExplainOutput)
    torch.testing.assert_close(report.result, toy_example(a, b))
    assert report.graph_count == 2
    assert report.graph_break_count == 1
    assert report.ops_per_graph == [["abs", "add", "truediv", "sum", "lt"], ["mul", "mul"]]
    brk = report.breaks[0]
    assert brk.kind == "data_dependent_branch"
    assert brk.frame.filename == __file__ and brk.frame.source == "if b.sum() < 0:"
    assert brk.hint == REASONS["data_dependent_branch"].hint
    kinds = {g.kind for g in report.guards[0]}
    assert GuardKind.TENSOR_MATCH in kinds and GuardKind.GLOBAL_STATE in kinds
    text = str(report)
    assert "Graph count: 2" in text and "Graph break count: 1" in text
    assert f"{__file__}:{brk.frame.lineno}" in text
    assert "if b.sum() < 0:" in text and "hint:" in text


def test_every_break_listed_in_order():
    report = explain(two_breaks)(torch.randn(3))
    lines = [b.frame.source for b in report.breaks]
    assert list(dict.fromkeys(lines)) == ['print("y", y.sum())', "z = y * float(np.float32(2))"]
    assert report.breaks[0].kind == "side_effect"  # print of a tensor
    assert report.graph_count >= 2


def test_no_break():
    report = explain(no_break)(torch.randn(3))
    assert report.graph_count == 1 and report.graph_break_count == 0
    assert "Break reasons" not in str(report)


def test_eager_frame_reported_as_break():
    def in_except(x):
        try:
            raise KeyError("k")
        except KeyError:
            if x.sum() > 0:  # cannot be resumed inside an except body: the frame runs eagerly
                return x
        return -x

    x = torch.randn(2)
    report = explain(in_except)(x)
    torch.testing.assert_close(report.result, in_except(x))
    assert report.graph_count == 0 and report.graph_break_count == 1
    assert report.breaks[0].kind == "data_dependent_branch"
    # the frame compiled nothing: which frame, and why capture gave up on it
    assert [(f.name, f.reason) for f in report.gave_up] == [
        (in_except.__qualname__, report.breaks[0])
    ]
    text = str(report)
    assert "Frames run eagerly (capture gave up on them whole):" in text
    assert f"{in_except.__qualname__}: data_dependent_branch:" in text


def test_frame_whose_capture_fails_is_reported_with_the_error(monkeypatch, caplog):
    def failing_capture(*args, **kwargs):
        raise RuntimeError("internal capture failure")

    monkeypatch.setattr(explain_module, "capture", failing_capture)
    x = torch.randn(3)
    with caplog.at_level(logging.INFO, logger="kiln.capture.graph_breaks"):
        report = explain(no_break)(x)
    torch.testing.assert_close(report.result, no_break(x))  # the frame ran eagerly
    assert report.graph_count == 0
    [frame] = report.gave_up
    assert frame.name == "no_break" and frame.reason.kind == "capture_failed"
    assert frame.reason.explanation == "RuntimeError: internal capture failure"
    assert "capture gave up on no_break, which runs eagerly: capture_failed" in caplog.text
    assert "no_break: capture_failed: RuntimeError: internal capture failure" in str(report)


def test_no_frame_given_up_when_captured():
    assert explain(toy_example)(torch.randn(3), torch.randn(3)).gave_up == []


def test_logged_and_counted(caplog):
    counters.clear()
    with caplog.at_level(logging.INFO, logger="kiln.capture.graph_breaks"):
        explain(toy_example)(torch.randn(3), torch.randn(3))
    assert "Graph break count: 1" in caplog.text
    assert "graph break in toy_example" in caplog.text
    assert counters.counters["graph_breaks"]["data_dependent_branch"] == 1


def test_module_is_explained_through_its_call():
    report = explain(torch.nn.Linear(3, 2))(torch.randn(4, 3))
    assert report.graph_count == 1 and report.graph_break_count == 0
    assert report.ops_per_graph == [["linear"]]
