"""Failure messages, one kind at a time, and agreement with the generated check."""

from __future__ import annotations

import dataclasses

import torch

from kiln import guards
from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import LocalSource
from kiln.guards import explain
from kiln.guards.kinds import state as state_kind
from kiln.guards.kinds import tensor as tensor_kind


def test_tensor_messages_name_the_first_difference():
    meta = TensorMeta.of(torch.randn(2, 3))
    assert tensor_kind.explain_tensor("L['x']", torch.randn(2, 3), meta) is None
    assert (
        tensor_kind.explain_tensor("L['x']", torch.randn(2, 5), meta)
        == "tensor L['x'] size mismatch at index 1: expected 3, got 5"
    )
    assert (
        tensor_kind.explain_tensor("L['x']", torch.randn(2, 3, dtype=torch.float64), meta)
        == "tensor L['x'] dtype mismatch: expected torch.float32, got torch.float64"
    )
    assert "stride mismatch at index 0: expected 3, got 1" in tensor_kind.explain_tensor(
        "L['x']", torch.randn(3, 2).t(), meta
    )


def test_lazy_negative_and_conjugate_bits_are_checked_both_ways():
    """A graph compiled for a plain tensor reads a negative view (``z.conj().imag``) wrongly:
    the bits are part of the check, whichever the entry was compiled for."""
    z = torch.randn(4, dtype=torch.complex64)
    cases = [
        (torch.randn(4), torch._neg_view(torch.randn(4)), "negative bit"),
        (z, z.conj(), "conjugate bit"),
    ]
    for plain, lazy in ((a, b) for a, b, _ in cases):
        for compiled_for, other in ((plain, lazy), (lazy, plain)):
            spec = GuardSpec(LocalSource("x"), GuardKind.TENSOR_MATCH, TensorMeta.of(compiled_for))
            check = guards.build_check([spec], lambda x: x)
            assert check(compiled_for) and not check(other)
    for plain, lazy, what in cases:
        reason = tensor_kind.explain_tensor("L['x']", lazy, TensorMeta.of(plain))
        assert reason == f"tensor L['x'] {what} mismatch: expected False, got True"


def test_dispatch_keys_when_recorded():
    t = torch.randn(3)
    keys = tensor_kind.dispatch_key_names(t)
    assert "CPU" in keys
    ok = dataclasses.replace(TensorMeta.of(t), dispatch_keys=keys)
    other = dataclasses.replace(TensorMeta.of(t), dispatch_keys=frozenset({"CPU"}))
    for meta, expect in ((ok, True), (other, False)):
        check = guards.build_check(
            [GuardSpec(LocalSource("x"), GuardKind.TENSOR_MATCH, meta)], lambda x: x
        )
        assert check(torch.randn(3)) is expect
        assert (check.failure_reason(torch.randn(3)) is None) is expect
    assert "dispatch keys mismatch" in check.failure_reason(torch.randn(3))


def test_global_state_message():
    state = dataclasses.replace(GlobalState.current(), grad_enabled=False)
    assert state_kind.explain_global_state(state) == "grad mode changed: expected False, got True"
    assert state_kind.explain_global_state(GlobalState.current()) is None
    no_device = dataclasses.replace(GlobalState.current(), default_device=None)
    with torch.device("meta"):
        assert state_kind.explain_global_state(no_device) is None  # None: not checked


def test_describe_marks_globals_and_closures():
    from kiln.capture.source import ClosureSource, GlobalSource

    assert explain.describe(GlobalSource("w").attr("shape")) == "global G['w'].shape"
    assert explain.describe(ClosureSource("k")) == "closure C['k']"
    assert explain.describe(LocalSource("x").item(0)) == "L['x'][0]"
