"""The ``GLOBAL_STATE`` kind: process-wide torch state a graph's meaning depends on.

It has no source: the check calls torch's own readers (the C functions behind the public
wrappers where this torch has them) and compares with ``is``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, user_function_modes
from kiln.guards.kinds.base import Emitter, Kind, Rank, register

__all__ = ["GlobalStateKind", "explain_global_state", "global_state_reads"]


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
    reads.append(("torch-function modes", expected.function_modes, user_function_modes))
    return reads


def explain_global_state(expected: GlobalState) -> str | None:
    for what, want, read in global_state_reads(expected):
        got = read()
        if got != want:
            return f"{what} changed: expected {want}, got {got}"
    return None


@register(GuardKind.GLOBAL_STATE)
class GlobalStateKind(Kind):
    """``expected`` is a :class:`GlobalState`; the guard's source is None."""

    rank = Rank.GLOBAL_STATE
    has_source = False

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        gs: GlobalState = guard.expected
        fns = {
            "grad": torch.is_grad_enabled,
            "dtype": torch.get_default_dtype,
            "autocast": torch.is_autocast_enabled,
            # the C function behind the public Python wrapper, when this torch has it
            "det": getattr(
                torch._C,
                "_get_deterministic_algorithms",
                torch.are_deterministic_algorithms_enabled,
            ),
            "inference": torch.is_inference_mode_enabled,
        }
        f = {k: out.bind(fn, k) for k, fn in fns.items()}
        parts = [
            f"{f['grad']}() is {gs.grad_enabled!r}",
            f"{f['dtype']}() is {out.bind(gs.default_dtype, 'dtype')}",
        ]
        any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)
        if any_autocast is not None and not (gs.autocast_cpu or gs.autocast_cuda):
            parts.append(f"not {out.bind(any_autocast, 'any_autocast')}()")
        else:
            parts.append(f"{f['autocast']}('cpu') is {gs.autocast_cpu!r}")
            parts.append(f"{f['autocast']}('cuda') is {gs.autocast_cuda!r}")
        parts.append(f"{f['det']}() is {gs.deterministic!r}")
        parts.append(f"{f['inference']}() is {gs.inference_mode!r}")
        if gs.default_device is not None:
            device = f"{out.bind(torch.get_default_device, 'default_device')}() == {out.bind(gs.default_device, 'dev')}"
            stack_len = getattr(torch._C, "_len_torch_function_stack", None)
            if stack_len is not None and gs.default_device == torch.device("cpu"):
                # No torch-function mode at all means no device context: the default is cpu.
                device = f"({out.bind(stack_len, 'mode_stack_len')}() == 0 or {device})"
            parts.append(device)
        modes = f"{out.bind(user_function_modes, 'function_modes')}() == {gs.function_modes!r}"
        stack_len = getattr(torch._C, "_len_torch_function_stack", None)
        if stack_len is not None and gs.function_modes == 0:
            modes = f"({out.bind(stack_len, 'mode_stack_len')}() == 0 or {modes})"
        parts.append(modes)
        return " and ".join(parts)

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        return explain_global_state(guard.expected)
