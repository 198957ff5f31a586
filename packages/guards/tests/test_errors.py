"""kiln.guards errors are KilnErrors with actionable messages."""

from __future__ import annotations

from kiln import guards
from kiln.capture.errors import KilnError


def test_hierarchy_and_message():
    err = guards.RecompileLimitExceeded("f (a.py:3)", 8, "L['n'] changed: expected 1, got 2")
    assert isinstance(err, guards.GuardsError) and isinstance(err, KilnError)
    text = str(err)
    assert "L['n'] changed: expected 1, got 2" in text
    assert "recompile_limit" in text
    assert issubclass(guards.UnsupportedGuard, guards.GuardsError)
