"""Failure messages, one kind at a time, and agreement with the generated check."""

from __future__ import annotations

import dataclasses

import torch

from kiln import guards
from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import LocalSource
from kiln.guards import explain


def test_tensor_messages_name_the_first_difference():
    meta = TensorMeta.of(torch.randn(2, 3))
    assert explain.explain_tensor("L['x']", torch.randn(2, 3), meta) is None
    assert (
        explain.explain_tensor("L['x']", torch.randn(2, 5), meta)
        == "tensor L['x'] size mismatch at index 1: expected 3, got 5"
    )
    assert (
        explain.explain_tensor("L['x']", torch.randn(2, 3, dtype=torch.float64), meta)
        == "tensor L['x'] dtype mismatch: expected torch.float32, got torch.float64"
    )
    assert "stride mismatch at index 0: expected 3, got 1" in explain.explain_tensor(
        "L['x']", torch.randn(3, 2).t(), meta
    )


def test_dispatch_keys_when_recorded():
    t = torch.randn(3)
    keys = explain.dispatch_key_names(t)
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
    assert explain.explain_global_state(state) == "grad mode changed: expected False, got True"
    assert explain.explain_global_state(GlobalState.current()) is None
    no_device = dataclasses.replace(GlobalState.current(), default_device=None)
    with torch.device("meta"):
        assert explain.explain_global_state(no_device) is None  # None: not checked


def test_describe_marks_globals_and_closures():
    from kiln.capture.source import ClosureSource, GlobalSource

    assert explain.describe(GlobalSource("w").attr("shape")) == "global G['w'].shape"
    assert explain.describe(ClosureSource("k")) == "closure C['k']"
    assert explain.describe(LocalSource("x").item(0)) == "L['x'][0]"
