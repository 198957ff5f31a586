"""A check's compiled code kept in a ``CodeStore``: a later build of the same text loads it and
behaves the same; bytes that are not that code are compiled again."""

from __future__ import annotations

import marshal

import pytest
import torch

from kiln import guards
from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import LocalSource
from kiln.guards import check as check_module


def wide(a, b, c, d, e, f, g, h):
    return a + b + c + d + e + f + g + h


class DictStore:
    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}
        self.loads = 0

    def load(self, key: str) -> bytes | None:
        self.loads += 1
        return self.entries.get(key)

    def store(self, key: str, data: bytes) -> None:
        self.entries[key] = data


@pytest.fixture
def store(monkeypatch):
    kept = DictStore()
    monkeypatch.setattr(check_module, "code_store", kept)
    return kept


def build(t: torch.Tensor) -> guards.GuardCheck:
    specs = [GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current())]
    specs += [
        GuardSpec(LocalSource(name), GuardKind.TENSOR_MATCH, TensorMeta.of(t))
        for name in "abcdefgh"
    ]
    return guards.build_check(specs, wide)


def outcomes(check: guards.GuardCheck, t: torch.Tensor) -> list[bool]:
    calls = [(t,) * 8, (t.double(),) + (t,) * 7, (t,) * 7 + (t[:1],), (t,) * 7 + (3,)]
    return [check(*args) for args in calls]


def no_compile(*args, **kwargs):
    raise AssertionError("compiled although the store holds the code")


def test_a_second_build_loads_the_stored_code_and_behaves_the_same(store, monkeypatch):
    t = torch.randn(4, 3)
    first = build(t)
    assert len(first.source) >= check_module._STORED_FROM  # long enough to be stored
    assert len(store.entries) == 1
    monkeypatch.setattr(check_module, "compile", no_compile, raising=False)
    second = build(t)
    assert second.source == first.source
    assert outcomes(second, t) == outcomes(first, t) == [True, False, False, False]
    assert second.failure_reason(t.double(), *(t,) * 7) == first.failure_reason(
        t.double(), *(t,) * 7
    )


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not code", "other name"])
def test_stored_bytes_that_are_not_the_code_are_compiled_again(store, damage):
    t = torch.randn(4, 3)
    expected = outcomes(build(t), t)
    (key, data), *_ = store.entries.items()
    store.entries[key] = {
        "garbage": b"\x00not marshal data",
        "truncated": data[: len(data) // 2],
        "not code": marshal.dumps({"a": 1}),
        "other name": marshal.dumps(compile("x = 1", "<elsewhere>", "exec")),
    }[damage]
    again = build(t)
    assert outcomes(again, t) == expected
    assert store.entries[key] == data  # compiled and stored again


def test_a_failing_store_costs_only_the_compile(monkeypatch):
    class Broken:
        def load(self, key: str) -> bytes | None:
            raise OSError("unreadable")

        def store(self, key: str, data: bytes) -> None:
            raise OSError("full")

    monkeypatch.setattr(check_module, "code_store", Broken())
    t = torch.randn(4, 3)
    assert outcomes(build(t), t) == [True, False, False, False]


def test_short_checks_are_compiled_without_the_store(store):
    check = guards.build_check([GuardSpec(LocalSource("a"), GuardKind.TYPE_MATCH, int)], wide)
    assert len(check.source) < check_module._STORED_FROM
    assert store.loads == 0 and not store.entries
