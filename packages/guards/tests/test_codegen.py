"""The generated source: printable, one tensor expression, shared reads hoisted, safe names."""

from __future__ import annotations

import logging

import torch

from kiln import guards
from kiln.capture import artifacts
from kiln.capture.guard_data import GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import AttrSource, GlobalSource, ItemSource, LocalSource

TABLE = {"k": 3}


def f(self, x, y):
    return x


def test_source_is_printable_and_logged(caplog, tmp_path):
    s = LocalSource("self")
    specs = [
        GuardSpec(LocalSource("x"), GuardKind.TENSOR_MATCH, TensorMeta.of(torch.randn(2, 3))),
        GuardSpec(LocalSource("y"), GuardKind.TENSOR_MATCH, TensorMeta.of(torch.randn(3))),
        GuardSpec(AttrSource(AttrSource(s, "cfg"), "a"), GuardKind.EQUALS, 1),
        GuardSpec(AttrSource(AttrSource(s, "cfg"), "b"), GuardKind.EQUALS, "relu"),
        GuardSpec(ItemSource(GlobalSource("TABLE"), "k"), GuardKind.EQUALS, 3),
    ]
    artifacts.set_debug_dir(tmp_path)
    try:
        with caplog.at_level(logging.INFO, logger="kiln.guards.guards"):
            check = guards.build_check(specs, f)
    finally:
        artifacts.set_debug_dir(None)
    text = check.source
    compile(text, "<test>", "exec")
    assert text in caplog.text
    assert list(tmp_path.rglob("guards*.py"))[0].read_text() == text
    assert text.count("x.shape == (2, 3)") == 1 and "y.shape == (3,)" in text
    # both tensors in one condition
    tensor_lines = [line for line in text.splitlines() if ".shape ==" in line]
    assert len(tensor_lines) == 1
    # self.cfg is read once into a local shared by both guards
    assert text.count("self.cfg") == 1
    assert "___G['TABLE']['k']" in text


def test_parameter_names_never_collide_with_helpers():
    def g(___G, ___v0, x):
        return x

    check = guards.build_check(
        [
            GuardSpec(GlobalSource("TABLE"), GuardKind.DICT_KEYS, ("k",)),
            GuardSpec(LocalSource("x"), GuardKind.EQUALS, 1),
        ],
        g,
    )
    assert "____G" in check.source
    assert check(0, 0, 1) and not check(0, 0, 2)


def test_builtins_and_odd_attribute_names():
    class Obj:
        pass

    o = Obj()
    setattr(o, "not-an-identifier", 5)

    def h(o):
        return len

    check = guards.build_check(
        [
            GuardSpec(GlobalSource("len"), GuardKind.ID_MATCH, id(len)),
            GuardSpec(AttrSource(LocalSource("o"), "not-an-identifier"), GuardKind.EQUALS, 5),
        ],
        h,
    )
    assert check(o)
    setattr(o, "not-an-identifier", 6)
    assert not check(o)


def test_unknown_source_kinds_fall_back_to_their_resolve():
    import dataclasses

    from kiln.capture.source import Source

    @dataclasses.dataclass(frozen=True)
    class LenSource(Source):  # a kind capture might add later
        base: Source

        def __str__(self):
            return f"len({self.base})"

        def resolve(self, f_locals, f_globals, cells):
            return len(self.base.resolve(f_locals, f_globals, cells))

    def h(xs, n=1):
        return xs

    check = guards.build_check([GuardSpec(LenSource(LocalSource("xs")), GuardKind.EQUALS, 2)], h)
    assert "= locals()" in check.source
    assert check([1, 2]) and not check([1])
    assert check.failure_reason([1]) == "len(L['xs']) changed: expected 2, got 1"

    @dataclasses.dataclass(frozen=True)
    class Opaque(Source):
        def __str__(self):
            return "?"

    import pytest

    with pytest.raises(guards.UnsupportedGuard, match="no resolve"):
        guards.build_check([GuardSpec(Opaque(), GuardKind.IS_NONE)], h)


def test_binding_facts_are_not_rechecked():
    def g(*args, **kwargs):
        return args

    check = guards.build_check(
        [
            GuardSpec(LocalSource("args"), GuardKind.TYPE_MATCH, tuple),
            GuardSpec(LocalSource("kwargs"), GuardKind.TYPE_MATCH, dict),
            GuardSpec(LocalSource("kwargs"), GuardKind.DICT_KEYS, ()),
            GuardSpec(LocalSource("args"), GuardKind.SEQUENCE_LENGTH, 1),
        ],
        g,
    )
    assert "type(" not in check.source and "not kwargs" in check.source
    assert check(1) and not check(1, 2) and not check(1, k=2)
    assert check.failure_reason(1, k=2) == "L['kwargs'] keys changed: expected (), got ('k',)"
