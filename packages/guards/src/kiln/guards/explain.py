"""Guard kinds checked one at a time, with the failure said in words.

The generated check (:mod:`kiln.guards.codegen`) answers "does every guard hold?"
fast; this module answers "which guard fails first, and how?" slowly and plainly,
for recompile logs and ``failure_reason``. Both follow the same order, and every
kind here mirrors the expression codegen emits for it.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import ClosureSource, GlobalSource, Source, root_of
from kiln.guards import stamps
from kiln.guards.hooks import global_hook_dicts, module_hook_names

__all__ = [
    "describe",
    "dispatch_key_names",
    "explain",
    "explain_global_state",
    "explain_tensor",
]


def describe(source: Source) -> str:
    """How a source is named in messages: globals and closure cells say so."""
    root = root_of(source)
    if isinstance(root, GlobalSource):
        return f"global {source}"
    if isinstance(root, ClosureSource):
        return f"closure {source}"
    return str(source)


def _type_name(obj: Any) -> str:
    return type(obj).__qualname__


def dispatch_key_names(t: torch.Tensor) -> frozenset[str]:
    """The names in a tensor's dispatch key set (slow; only when capture recorded them)."""
    text = str(torch._C._dispatch_keys(t))
    inner = text[text.find("(") + 1 : text.rfind(")")]
    return frozenset(k.strip() for k in inner.split(",") if k.strip())


def explain_tensor(where: str, value: Any, meta: TensorMeta) -> str | None:
    """The first way ``value`` differs from ``meta``, or None when it matches."""
    if not isinstance(value, torch.Tensor):
        return (
            f"{where} is not a tensor: expected {meta.type.__qualname__}, got {_type_name(value)}"
        )
    if type(value) is not meta.type:
        name = _type_name(value)
        return f"tensor {where} type mismatch: expected {meta.type.__qualname__}, got {name}"
    checks: list[tuple[str, Any, Any]] = [
        ("dtype", meta.dtype, value.dtype),
        ("device", meta.device, value.device),
        ("requires_grad", meta.requires_grad, value.requires_grad),
        ("rank", len(meta.sizes), value.dim()),
        ("negative bit", meta.neg, value.is_neg()),
        ("conjugate bit", meta.conj, value.is_conj()),
    ]
    for what, expected, got in checks:
        if expected != got:
            return f"tensor {where} {what} mismatch: expected {expected}, got {got}"
    for what, expected_seq, got_seq in (
        ("size", meta.sizes, tuple(value.shape)),
        ("stride", meta.strides, tuple(value.stride())),
    ):
        for i, (expected, got) in enumerate(zip(expected_seq, got_seq, strict=True)):
            if expected != got:
                return (
                    f"tensor {where} {what} mismatch at index {i}: expected {expected}, got {got}"
                )
    if meta.dispatch_keys and dispatch_key_names(value) != meta.dispatch_keys:
        got_keys = sorted(dispatch_key_names(value))
        return f"tensor {where} dispatch keys mismatch: expected {sorted(meta.dispatch_keys)}, got {got_keys}"
    return None


def global_state_reads(expected: GlobalState) -> list[tuple[str, Any, Callable[[], Any]]]:
    """(what, expected, reader) for each piece of process state, likeliest to change first."""
    reads: list[tuple[str, Any, Callable[[], Any]]] = [
        ("grad mode", expected.grad_enabled, torch.is_grad_enabled),
        ("default dtype", expected.default_dtype, torch.get_default_dtype),
        ("cpu autocast", expected.autocast_cpu, lambda: torch.is_autocast_enabled("cpu")),
        ("cuda autocast", expected.autocast_cuda, lambda: torch.is_autocast_enabled("cuda")),
        (
            "deterministic algorithms",
            expected.deterministic,
            torch.are_deterministic_algorithms_enabled,
        ),
        ("inference mode", expected.inference_mode, torch.is_inference_mode_enabled),
    ]
    if expected.default_device is not None:
        reads.append(("default device", expected.default_device, torch.get_default_device))
    return reads


def explain_global_state(expected: GlobalState) -> str | None:
    for what, want, read in global_state_reads(expected):
        got = read()
        if got != want:
            return f"{what} changed: expected {want}, got {got}"
    return None


def _explain_equals(where: str, value: Any, expected: Any) -> str | None:
    if type(value) is type(expected):
        nan = isinstance(expected, float) and math.isnan(expected)
        if math.isnan(value) if nan else (value == expected):
            return None
    if type(value) is not type(expected):
        return (
            f"{where} changed: expected {expected!r} ({_type_name(expected)}), "
            f"got {value!r} ({_type_name(value)})"
        )
    return f"{where} changed: expected {expected!r}, got {value!r}"


def _explain_hooks(where: str, value: Any) -> str | None:
    for name in module_hook_names:
        if getattr(value, name, None):
            return f"{where} has {name.strip('_').replace('_', ' ')} now"
    if any(global_hook_dicts):
        return "global module hooks are registered now"
    return None


def explain(guard: GuardSpec, value: Any) -> str | None:
    """Why ``guard`` fails for ``value`` (its source's current value), or None if it holds."""
    kind, expected = guard.kind, guard.expected
    where = describe(guard.source) if guard.source is not None else "<global state>"
    if kind is GuardKind.TENSOR_MATCH:
        return explain_tensor(where, value, expected)
    if kind is GuardKind.TYPE_MATCH:
        ok = type(value) is expected or (
            expected in stamps.DICT_TYPES and type(value) in stamps.DICT_TYPES
        )
        return (
            None
            if ok
            else f"{where} type changed: expected {expected.__qualname__}, got {_type_name(value)}"
        )
    if kind in (GuardKind.ID_MATCH, GuardKind.MODULE_MATCH):
        what = "module" if kind is GuardKind.MODULE_MATCH else "object"
        return None if id(value) == expected else f"{where} is a different {what} (id changed)"
    if kind is GuardKind.EQUALS:
        return _explain_equals(where, value, expected)
    if kind is GuardKind.IS_NONE:
        return None if value is None else f"{where} changed: expected None, got {_type_name(value)}"
    if kind is GuardKind.NOT_NONE:
        return None if value is not None else f"{where} changed: expected not None, got None"
    if kind is GuardKind.BOOL:
        got = bool(value)
        return (
            None
            if got is bool(expected)
            else f"{where} changed: expected {bool(expected)}, got {got}"
        )
    if kind is GuardKind.DICT_KEYS:
        got_keys = tuple(value)
        return (
            None
            if got_keys == tuple(expected)
            else f"{where} keys changed: expected {tuple(expected)!r}, got {got_keys!r}"
        )
    if kind is GuardKind.SEQUENCE_LENGTH:
        n = len(value)
        return None if n == expected else f"len({where}) changed: expected {expected}, got {n}"
    if kind is GuardKind.HASATTR:
        name, want = expected
        got = hasattr(value, name)
        return (
            None
            if got is want
            else f"hasattr({where}, {name!r}) changed: expected {want}, got {got}"
        )
    if kind is GuardKind.HOOKS_EMPTY:
        return _explain_hooks(where, value)
    if kind is GuardKind.GLOBAL_STATE:
        return explain_global_state(expected)
    if kind is GuardKind.MODULE_TREE:
        if isinstance(expected, weakref.ref):
            expected = expected()  # a built check holds its modules weakly
        return None if value is expected else f"{where} is a different module object"
    return f"unknown guard kind {kind}"
