"""Reading sources outside generated code: every source kind, and which need no frame."""

from __future__ import annotations

from kiln.capture.source import (
    AttrSource,
    ClosureSource,
    DefaultSource,
    GlobalSource,
    ItemSource,
    LocalSource,
)
from kiln.guards import frame

LIMIT = 7


def make():
    k = {"a": [1, 2]}

    def f(x, n=3, *, flag=True):
        return x, k, LIMIT, len

    return f


def test_resolve_every_source_kind():
    f = make()
    loc = {"x": 5}
    assert frame.resolve(LocalSource("x"), loc, f) == 5
    assert frame.resolve(GlobalSource("LIMIT"), loc, f) == 7
    assert frame.resolve(GlobalSource("len"), loc, f) is len  # builtins fallback
    assert frame.resolve(ItemSource(ItemSource(ClosureSource("k"), "a"), 1), loc, f) == 2
    assert frame.resolve(AttrSource(GlobalSource("LIMIT"), "real"), loc, f) == 7
    assert frame.resolve(DefaultSource(None, "n"), loc, f) == 3
    assert frame.resolve(DefaultSource(None, "flag", kwonly=True), loc, f) is True


def test_frame_free_sources():
    assert frame.frame_free(AttrSource(GlobalSource("m"), "w"))
    assert frame.frame_free(ClosureSource("k"))
    assert not frame.frame_free(ItemSource(LocalSource("x"), 0))
