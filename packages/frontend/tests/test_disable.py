"""kiln.disable runs code uncompiled, as a wrapper, decorator or context manager."""

import pytest

import kiln
from kiln.api import _disabled


def test_context_manager_sets_and_restores():
    assert not _disabled.get()
    with kiln.disable():
        assert _disabled.get()
    assert not _disabled.get()


def test_wrapper_runs_the_function_disabled():
    seen = []

    def f(x):
        seen.append(_disabled.get())
        return x * 2

    g = kiln.disable(f)
    assert g(3) == 6 and seen == [True]
    assert g.__name__ == "f" and g._kiln_disabled


def test_decorator_form():
    @kiln.disable()
    def f():
        return _disabled.get()

    assert f() is True


def test_non_callable_rejected():
    with pytest.raises(TypeError):
        kiln.disable(3)
