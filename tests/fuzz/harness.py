"""Run one program in eager and through Kiln, call by call, and say where they differ.

This module imports only torch and kiln: a repro file embeds its whole text, so a failing
program runs anywhere Kiln is installed without the fuzzer beside it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

import kiln

DTYPE = {"f32": torch.float32, "f64": torch.float64}


@dataclass(frozen=True)
class Call:
    """One call of the program: input sizes, dtype, layout, the Python float, global changes."""

    n: int
    m: int
    dtype: str
    layout: str  # contiguous | transposed | sliced | same (y is x) | siblings (views of one base)
    s: float
    seed: int
    set_g: float | None = None  # assign the global G before this call
    flip_flag: bool = False  # toggle CONFIG["flag"] before this call
    s_by_keyword: bool = False  # call f(x, y, s=s) rather than f(x, y, s)
    under_no_grad: bool = False  # the caller is in a torch.no_grad() block


@dataclass
class Outcome:
    """What running a program taught: invalid (eager raised on the first call), a finding, or clean."""

    invalid: bool = False
    finding: str | None = None  # "<kind>: <detail>"
    fallbacks: list[str] = field(default_factory=list)  # Kiln's fall-back-to-eager warnings
    calls_run: int = 0

    @property
    def kind(self) -> str | None:
        return None if self.finding is None else self.finding.split(":", 1)[0]


def make_inputs(call: Call, grad: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """x and y of size (n, m) laid out as the call says, from the call's seed (same every time)."""
    gen = torch.Generator().manual_seed(call.seed)
    dtype = DTYPE[call.dtype]
    n, m = call.n, call.m

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, dtype=dtype).requires_grad_(grad)

    if call.layout == "transposed":
        bx, by = randn(m, n), randn(m, n)
        return bx.t(), by.t(), call.s
    if call.layout == "sliced":
        bx, by = randn(n + 1, m + 2), randn(n + 1, m + 2)
        return bx[1:, 1:-1], by[:-1, 2:], call.s
    if call.layout == "same":
        x = randn(n, m)
        return x, x, call.s
    if call.layout == "siblings":
        base = randn(n, 2 * m)
        return base[:, :m], base[:, m:], call.s
    return randn(n, m), randn(n, m), call.s


def _tolerance(lossy: bool) -> dict[str, float]:
    if lossy:
        return {"rtol": 4e-2, "atol": 4e-2}
    # float64 results too: they often hold float32 rounding (a float32 global, an .item() of a
    # float32 sum that Kiln adds up in another order, a float32 value converted up).
    return {"rtol": 2e-4, "atol": 2e-4}


def _same_value(a: Any, b: Any, lossy: bool, where: str) -> str | None:
    """None when a and b agree (a from eager, b from Kiln), else what differs."""
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return f"{where}: eager gave {type(a).__name__}, kiln {type(b).__name__}"
    if not isinstance(a, torch.Tensor):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return None
        if type(a) is not type(b):
            return f"{where}: eager gave {type(a).__name__}, kiln {type(b).__name__}"
        if isinstance(a, float) and math.isclose(
            a, b, rel_tol=4e-2 if lossy else 1e-4, abs_tol=1e-4
        ):
            return None
        if a != b and not isinstance(a, float):
            return f"{where}: eager {a!r}, kiln {b!r}"
        if a != b:
            return f"{where}: eager {a!r}, kiln {b!r}"
        return None
    for attr in ("shape", "dtype", "requires_grad"):
        if getattr(a, attr) != getattr(b, attr):
            return f"{where}: {attr} eager {getattr(a, attr)}, kiln {getattr(b, attr)}"
    ea, eb = a.detach(), b.detach()
    if a.dtype.is_floating_point or a.dtype.is_complex:
        try:
            torch.testing.assert_close(eb, ea, equal_nan=True, **_tolerance(lossy))
        except AssertionError as e:
            return f"{where}: values differ: {str(e).splitlines()[:4]}\neager {ea}\nkiln  {eb}"
        return None
    if not torch.equal(ea, eb):
        return f"{where}: values differ\neager {ea}\nkiln  {eb}"
    return None


def _aliases(out: Any, inputs: tuple[torch.Tensor, ...]) -> list[tuple[int, ...]]:
    """For each tensor output, which inputs it shares storage with (outputs of views alias)."""
    found = []
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.Tensor):
            ptr = leaf.untyped_storage().data_ptr()
            found.append(
                tuple(i for i, t in enumerate(inputs) if t.untyped_storage().data_ptr() == ptr)
            )
    return found


def compare(eager: Any, compiled: Any, lossy: bool, where: str) -> str | None:
    """Structure (the pytree spec) first, then leaf by leaf."""
    leaves_e, spec_e = pytree.tree_flatten(eager)
    leaves_k, spec_k = pytree.tree_flatten(compiled)
    if spec_e != spec_k:
        return f"{where}: structure eager {spec_e}, kiln {spec_k}"
    for i, (a, b) in enumerate(zip(leaves_e, leaves_k, strict=True)):
        problem = _same_value(a, b, lossy, f"{where}[{i}]")
        if problem:
            return problem
    return None


def _grads(out: Any, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor | None] | None:
    terms = [
        (t.double() * (k + 1)).sum()
        for k, t in enumerate(pytree.tree_leaves(out))
        if isinstance(t, torch.Tensor) and t.requires_grad and t.dtype.is_floating_point
    ]
    if not terms:
        return None
    grads = torch.autograd.grad(sum(terms), inputs, allow_unused=True)
    # An input that reaches a compiled graph is an input of its autograd node, so its gradient
    # is zeros where eager's is None when no output used depends on it (torch.compile does the
    # same): both read as None here. So does a gradient that is zero but for rounding (of a
    # sum of softmax outputs, say: one order of additions gives exact zeros, another 1e-9 in float32).
    return [g if g is None or bool((g.abs() > 1e-6).any()) else None for g in grads]


def _state(ns: dict[str, Any]) -> tuple[Any, ...]:
    return (ns["G"], ns["COUNT"], list(ns["LOG"]), dict(ns["CONFIG"]), ns["GT"].clone())


def _run(
    fn: Any, inputs: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> tuple[Any, BaseException | None]:
    try:
        with warnings.catch_warnings():
            # torch's own warnings (var() of one element, ...) come from both runs alike.
            warnings.filterwarnings("ignore", category=UserWarning)
            return fn(*inputs, **(kwargs or {})), None
    except Exception as e:
        return None, e


def _call(fn: Any, inputs: tuple[Any, ...], call: Call) -> tuple[Any, BaseException | None, bool]:
    """Call as the Call says; also the grad mode the function left set (before it is reset)."""
    torch.set_grad_enabled(not call.under_no_grad)
    try:
        if call.s_by_keyword:
            out, err = _run(fn, inputs[:2], {"s": inputs[2]})
        else:
            out, err = _run(fn, inputs)
        mode = torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)
    return out, err, mode


def _leaves_of(inputs: tuple[torch.Tensor, torch.Tensor, float]) -> tuple[torch.Tensor, ...]:
    x, y, _ = inputs
    return (x,) if x is y else (x, y)


def run_program(
    source: str, calls: tuple[Call, ...] | list[Call], backend: str, grad: bool
) -> Outcome:
    """Run ``f`` of ``source`` eagerly and compiled on each call in turn; the first difference wins."""
    lossy = "bfloat16" in source
    namespaces: list[dict[str, Any]] = [{}, {}]
    for ns in namespaces:
        exec(compile(source, "<fuzz program>", "exec"), ns)
    eager_fn = namespaces[0]["f"]
    compiled_fn = kiln.compile(namespaces[1]["f"], backend=backend)
    outcome = Outcome()
    try:
        for index, call in enumerate(calls):
            for ns in namespaces:
                if call.set_g is not None:
                    ns["G"] = call.set_g
                if call.flip_flag:
                    ns["CONFIG"]["flag"] = not ns["CONFIG"]["flag"]
            ins_e, ins_k = make_inputs(call, grad), make_inputs(call, grad)
            out_e, err_e, mode_e = _call(eager_fn, ins_e, call)
            if index == 0 and err_e is not None:
                outcome.invalid = True
                return outcome
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out_k, err_k, mode_k = _call(compiled_fn, ins_k, call)
            outcome.fallbacks += [
                str(w.message) for w in caught if str(w.message).startswith("kiln:")
            ]
            outcome.calls_run += 1
            where = f"call {index}"
            if mode_e != mode_k:
                outcome.finding = f"grad mode: after {where}: eager left {mode_e}, kiln {mode_k}"
                return outcome
            if err_e is not None or err_k is not None:
                if type(err_e) is not type(err_k):
                    outcome.finding = (
                        f"exception: {where}: eager raised {type(err_e).__name__}: {err_e}; "
                        f"kiln raised {type(err_k).__name__}: {err_k}"
                    )
                    return outcome
                continue
            problem = compare(out_e, out_k, lossy, f"output {where}")
            if problem:
                outcome.finding = f"output: {problem}"
                return outcome
            if _aliases(out_e, ins_e[:2]) != _aliases(out_k, ins_k[:2]):
                outcome.finding = (
                    f"aliasing: {where}: outputs sharing storage with inputs: eager "
                    f"{_aliases(out_e, ins_e[:2])}, kiln {_aliases(out_k, ins_k[:2])}"
                )
                return outcome
            problem = compare(ins_e[:2], ins_k[:2], lossy, f"inputs after {where}")
            if problem:
                outcome.finding = f"mutation: {problem}"
                return outcome
            problem = compare(
                _state(namespaces[0]), _state(namespaces[1]), lossy, f"globals after {where}"
            )
            if problem:
                outcome.finding = f"globals: {problem}"
                return outcome
            if grad:
                grads_e, err_e = _run(_grads, (out_e, _leaves_of(ins_e)))
                grads_k, err_k = _run(_grads, (out_k, _leaves_of(ins_k)))
                if type(err_e) is not type(err_k):
                    outcome.finding = (
                        f"backward: {where}: eager raised {type(err_e).__name__}: {err_e}; "
                        f"kiln raised {type(err_k).__name__}: {err_k}"
                    )
                    return outcome
                problem = compare(grads_e, grads_k, lossy, f"grads {where}")
                if problem:
                    outcome.finding = f"grad: {problem}"
                    return outcome
    finally:
        kiln.reset()
        torch.set_grad_enabled(True)
    return outcome
