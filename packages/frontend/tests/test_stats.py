"""``kiln.stats().eager_fallbacks`` counts every frame that runs eagerly, once per frame.

One test per way a frame or graph ends up uncompiled: capture rejects the whole frame (a
break it cannot resume after, a frame that raises), capture or the guard builder fails, the
backend fails on a graph, the recompile limit is reached, and each of these in a resume
function after a graph break. Each calls several times with fresh inputs, checks the answers
against eager and that the count does not grow after the first call.
"""

from __future__ import annotations

import gc
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import kiln
from kiln import api, capture, guards


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    kiln.reset()
    yield
    kiln.reset()


def _break_in_handler(x: torch.Tensor) -> torch.Tensor:
    # a data-dependent branch inside ``except`` cannot be resumed after: the frame is rejected
    try:
        raise ValueError
    except ValueError:
        if x.sum() > 0:
            return x + 1
        return x - 1


def _break_then_break_in_handler(x: torch.Tensor) -> torch.Tensor:
    # the frame compiles up to the first break; the call in its resume function is rejected
    y = x * 2
    if y.sum() > 0:
        y = y + 1
    return _break_in_handler(y) * 3


def _graph_break(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    if y.sum() > 0:
        return y + 1
    return y - 1


def _one_graph(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2


def _calls(
    f: Callable[[torch.Tensor], torch.Tensor],
    eager: Callable[[torch.Tensor], torch.Tensor],
    n: int = 4,
) -> list[int]:
    """The fallback count after each of ``n`` calls on fresh inputs (answers checked)."""
    counts = []
    for _ in range(n):
        x = torch.randn(5)
        torch.testing.assert_close(f(x), eager(x))
        counts.append(kiln.stats().eager_fallbacks)
    return counts


def test_a_frame_capture_rejects_whole_counts_once():
    f = kiln.compile(_break_in_handler, backend="eager")
    assert _calls(f, _break_in_handler) == [1, 1, 1, 1]
    s = kiln.stats()
    assert s.frames_captured == 0 and s.graph_breaks == 1


def test_a_frame_that_raises_counts_once():
    def raises(x: torch.Tensor) -> torch.Tensor:
        raise ValueError(x.shape)

    f = kiln.compile(raises, backend="eager")
    for _ in range(3):
        with pytest.raises(ValueError):
            f(torch.randn(2))
    assert kiln.stats().eager_fallbacks == 1


def test_a_rejected_frame_missed_by_threads_together_counts_once():
    f = kiln.compile(_break_in_handler, backend="eager")
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait()
            _calls(f, _break_in_handler, n=3)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert kiln.stats().eager_fallbacks == 1


def test_a_capture_failure_counts_once_with_one_warning(monkeypatch):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("capture broke")

    monkeypatch.setattr(capture, "capture", broken)
    f = kiln.compile(_one_graph, backend="eager")
    with pytest.warns(RuntimeWarning, match="capture broke") as caught:
        assert _calls(f, _one_graph) == [1, 1, 1, 1]
    assert len(caught) == 1


def test_a_guard_builder_failure_runs_the_frame_eagerly_and_counts_once(monkeypatch):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise guards.UnsupportedGuard("no check for this guard")

    monkeypatch.setattr(guards, "build_check", broken)
    f = kiln.compile(_one_graph, backend="eager")
    with pytest.warns(RuntimeWarning, match="no check for this guard") as caught:
        assert _calls(f, _one_graph) == [1, 1, 1, 1]
    assert len(caught) == 1
    assert kiln.stats().frames_captured == 0


def _failing_backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
    raise RuntimeError("backend broke")


def test_a_backend_failure_counts_once_per_graph():
    f = kiln.compile(_graph_break, backend=_failing_backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):  # both branches: three graphs (the frame's and two resumes')
            x = torch.randn(5)
            torch.testing.assert_close(f(x), _graph_break(x))
            torch.testing.assert_close(f(-x), _graph_break(-x))
    s = kiln.stats()
    assert s.eager_fallbacks == s.graphs_compiled == len(caught)
    assert s.graphs_compiled >= 2


def test_the_recompile_limit_counts_when_reached_not_on_later_calls():
    f = kiln.compile(_one_graph, backend="eager", dynamic=False, options={"recompile_limit": 2})
    counts = []
    with pytest.warns(RuntimeWarning, match="recompile limit") as caught:
        for n in (2, 3, 4, 5, 4, 2):  # the last one hits its entry
            x = torch.randn(n)
            torch.testing.assert_close(f(x), _one_graph(x))
            counts.append(kiln.stats().eager_fallbacks)
    assert counts == [0, 0, 1, 1, 1, 1] and len(caught) == 1
    assert kiln.stats().frames_captured == 2


def test_a_callee_in_a_resume_function_rejected_whole_counts_once():
    f = kiln.compile(_break_then_break_in_handler, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a rejected frame is a graph break: no warning
        counts = []
        for _ in range(4):
            x = torch.rand(5)  # positive: one path through the first break
            torch.testing.assert_close(f(x), _break_then_break_in_handler(x))
            counts.append(kiln.stats().eager_fallbacks)
    s = kiln.stats()
    assert s.frames_captured >= 1  # the frame compiled up to its break
    assert counts == [1, 1, 1, 1]


def test_a_rejected_frame_stays_skipped_when_a_cache_from_before_a_reset_dies():
    # the old cache, held in a reference cycle, dies at a collector pass after the new skip
    f = kiln.compile(_break_in_handler, backend="eager")
    f(torch.rand(5))
    cycle: list[Any] = [*_break_in_handler.__dict__[api._OWNED].values()]
    cycle.append(cycle)
    kiln.reset()
    counts = []
    for i in range(3):
        x = torch.rand(5)
        torch.testing.assert_close(f(x), _break_in_handler(x))
        if i == 0:
            del cycle
            gc.collect()
        counts.append(kiln.stats().eager_fallbacks)
    assert counts == [1, 1, 1]


def test_a_cache_dying_while_the_caches_are_iterated_is_no_error():
    # its finalizer then runs inside the iteration (kiln.reset's), which must go on
    kiln.compile(_one_graph, backend="eager")(torch.rand(3))
    dying = [kiln.compile(lambda x, k=k: x.cos() + k, backend="eager") for k in range(3)]
    for f in dying:
        f(torch.rand(3))
    del f
    seen = 0
    for _ in api._caches.values():
        seen += 1
        if dying:
            dying.clear()
            gc.collect()
    assert seen >= 1
    kiln.reset()


def test_a_resume_function_capture_failure_counts_once(monkeypatch):
    real = capture.capture

    def broken_for_resumes(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if fn.__code__ is not _graph_break.__code__:
            raise RuntimeError("resume capture broke")
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(capture, "capture", broken_for_resumes)
    f = kiln.compile(_graph_break, backend="eager")
    with pytest.warns(RuntimeWarning, match="resume capture broke") as caught:
        counts = []
        for _ in range(4):
            x = torch.rand(5)
            torch.testing.assert_close(f(x), _graph_break(x))
            counts.append(kiln.stats().eager_fallbacks)
    assert counts == [1, 1, 1, 1] and len(caught) == 1
    assert kiln.stats().frames_captured == 1


def test_uncompiled_on_request_or_by_a_user_error_is_no_fallback(monkeypatch):
    f = kiln.compile(_one_graph, backend="eager")
    with kiln.disable():
        f(torch.randn(3))
    assert kiln.stats().eager_fallbacks == 0

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("capture broke")

    def user_error(x: torch.Tensor) -> torch.Tensor:
        return x @ x.T @ torch.randn(7, 7)  # fails in eager too

    monkeypatch.setattr(capture, "capture", broken)
    g = kiln.compile(user_error, backend="eager")
    with pytest.raises(RuntimeError, match="mat"):
        g(torch.randn(3, 2))
    assert kiln.stats().eager_fallbacks == 0
