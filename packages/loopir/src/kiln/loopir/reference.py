"""The reference backend: evaluates kernels' IR with torch ops, no code generation.

Every index symbol becomes an int64 tensor (``xindex`` of shape ``[X, 1]``,
``rindex`` of shape ``[1, R]``), every ``ops`` call the matching torch call over
the whole iteration space at once. Slow-ish, but it makes every lowering and
fusion testable inside loopir, and defines what generated code must compute.

It also defines what generated code may touch: a generated kernel loads every lane
that is not masked off (by ``ops.masked`` or the loop bounds), whatever a later
``where`` discards, so every load and store here is checked against its buffer at
the lanes ``ops.masked`` leaves active, and one outside raises
:class:`~kiln.loopir.errors.IRVerificationError` (on a GPU it would be a read of
memory that may not be mapped: an illegal memory access).
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sympy
import torch

from kiln.capture import artifacts
from kiln.loopir import random_bits, sizes, symbolic
from kiln.loopir.analysis import ReadWriteHandler
from kiln.loopir.errors import IRVerificationError
from kiln.loopir.kernel import RINDEX, XINDEX, KernelCode, KernelGroup, KernelNode
from kiln.loopir.ops import BINARY_OPS, UNARY_OPS, OpsHandlerBase
from kiln.loopir.printing import render_group
from kiln.loopir.traits import BackendTraits
from kiln.loopir.virtualized import set_ops_handler

__all__ = ["ReferenceBackend", "TorchOpsHandler", "evaluate_index"]

_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not,
    "sign": torch.sign,
}
_BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "truediv": torch.true_divide,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "mod": torch.remainder,
    "pow": torch.pow,
}


def _torch_fn(name: str) -> Callable[..., torch.Tensor]:
    fn = _UNARY.get(name) or _BINARY.get(name)
    if fn is None:
        fn = getattr(torch.special, name, None) if name in ("erfinv", "digamma") else None
        fn = fn or getattr(torch, name)
    return fn


def evaluate_index(expr: sympy.Expr | int, env: dict[sympy.Symbol, torch.Tensor]) -> Any:
    """An index expression's value: an int, or an int64 tensor over the bound symbols."""
    if isinstance(expr, int):
        return expr
    if expr.is_Integer:
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return env[expr]
    if isinstance(expr, sympy.Mul) and not expr.as_coeff_Mul()[0].is_Integer:
        coeff, rest = expr.as_coeff_Mul()  # a size divided exactly (``u0/2`` of a view)
        return evaluate_index(coeff.p * rest, env) // coeff.q  # type: ignore[attr-defined]
    args = [evaluate_index(a, env) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return functools.reduce(lambda a, b: a + b, args)
    if isinstance(expr, sympy.Mul):
        return functools.reduce(lambda a, b: a * b, args)
    if isinstance(expr, sizes.FloorDiv):
        return args[0] // args[1]
    if isinstance(expr, sizes.ModularIndexing):
        return (args[0] // args[1]) % args[2]
    if isinstance(expr, (sympy.Max, sympy.Min)):
        return functools.reduce(max if isinstance(expr, sympy.Max) else min, args)
    msg = f"reference backend cannot evaluate index {expr}"
    raise NotImplementedError(msg)


class TorchOpsHandler(OpsHandlerBase[Any]):
    """``ops`` over torch tensors, for one kernel invocation."""

    def __init__(
        self,
        group: KernelGroup,
        tensors: dict[str, torch.Tensor],
        size_values: Mapping[sympy.Symbol, Any] | None = None,
    ) -> None:
        self.group = group
        self.device = group.device
        self.flat: dict[str, torch.Tensor] = {}
        self.env: dict[sympy.Symbol, Any] = dict(size_values or {})
        """Index symbols' values (tensors), and this call's size symbols' (numbers)."""
        for name, t in tensors.items():
            layout = group.buffers.get(name)
            n = int(evaluate_index(layout.storage_size(), self.env)) if layout else t.numel()
            self.flat[name] = torch.as_strided(t, (n,), (1,), t.storage_offset())
        self.shape: tuple[int, ...] = ()
        self._indirect = itertools.count()
        self._active: torch.Tensor | None = None
        """The lanes the enclosing ``ops.masked`` calls leave on; None: every lane."""

    # -- memory --
    def _positions(self, name: str, index: sympy.Expr) -> torch.Tensor:
        pos = evaluate_index(index, self.env)
        if not isinstance(pos, torch.Tensor):
            pos = torch.tensor(pos, dtype=torch.int64, device=self.device)
        return pos

    def _check_bounds(self, what: str, name: str, index: sympy.Expr, pos: torch.Tensor) -> None:
        """Every active lane's position lies inside ``name``'s elements."""
        n = self.flat[name].numel()
        if self._active is not None:
            pos, active = torch.broadcast_tensors(pos, self._active)
            pos = pos[active]
        if pos.numel() == 0:
            return
        low, high = int(pos.min()), int(pos.max())
        if low < 0 or high >= n:
            msg = (
                f"kernel {self.group.name} {what} {name} at {index} outside its {n} elements "
                f"(positions {low}..{high} on lanes no ops.masked turns off)"
            )
            raise IRVerificationError(msg)

    def load(self, name: str, index: sympy.Expr) -> torch.Tensor:
        flat = self.flat[name]
        pos = self._positions(name, index)
        self._check_bounds("reads", name, index, pos)
        if flat.numel() == 0:
            return torch.zeros(pos.shape, dtype=flat.dtype, device=self.device)
        # masked-off lanes may hold wild indices (checked above): clamp, the mask discards them
        return flat[pos.clamp(0, flat.numel() - 1)]

    def store(
        self, name: str, index: sympy.Expr, value: torch.Tensor, mode: str | None = None
    ) -> None:
        flat = self.flat[name]
        pos = self._positions(name, index)
        self._check_bounds("writes", name, index, pos)
        value = torch.as_tensor(value, device=self.device)
        pos, value = torch.broadcast_tensors(pos, value)
        pos = pos.expand(torch.broadcast_shapes(pos.shape, self.shape)).reshape(-1)
        value = value.expand(torch.broadcast_shapes(value.shape, self.shape)).reshape(-1)
        value = value.to(flat.dtype)
        flat.index_put_((pos,), value, accumulate=mode == "atomic_add")

    def reduction(
        self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Any
    ) -> Any:
        shape = self.shape

        def full(v: Any) -> torch.Tensor:
            v = torch.as_tensor(v, device=self.device)
            return v.expand(torch.broadcast_shapes(v.shape, shape))

        if reduction_type in ("argmax", "argmin"):
            v, idx = full(value[0]), full(value[1])
            pick = (
                torch.argmax(v, 1, True) if reduction_type == "argmax" else torch.argmin(v, 1, True)
            )
            return torch.gather(idx, 1, pick).to(dtype)
        v = full(value)
        if reduction_type == "welford_reduce":
            v = v.to(dtype)
            mean = v.mean(1, keepdim=True)
            m2 = ((v - mean) ** 2).sum(1, keepdim=True)
            weight = torch.full_like(mean, v.shape[1])
            return (mean, m2, weight)
        if reduction_type == "sum":
            return v.to(dtype).sum(1, keepdim=True, dtype=dtype)
        if reduction_type == "prod":
            return v.to(dtype).prod(1, keepdim=True, dtype=dtype)
        if reduction_type == "max":
            return v.amax(1, keepdim=True).to(dtype)
        if reduction_type == "min":
            return v.amin(1, keepdim=True).to(dtype)
        if reduction_type == "any":
            return v.to(torch.bool).any(1, keepdim=True).to(dtype)
        if reduction_type == "xor_sum":
            acc = torch.zeros((v.shape[0], 1), dtype=dtype, device=self.device)
            for j in range(v.shape[1]):
                acc = acc ^ v[:, j : j + 1].to(dtype)
            return acc
        msg = f"reference backend: unknown reduction {reduction_type!r}"
        raise NotImplementedError(msg)

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> None:
        saved, self.shape = self.shape, (self.shape[0], 1)
        try:
            self.store(name, index, value)
        finally:
            self.shape = saved

    # -- indices and control --
    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(evaluate_index(expr, self.env), device=self.device).to(dtype)

    def indirect_indexing(
        self, x: torch.Tensor, size: sympy.Expr, check: bool = True
    ) -> sympy.Symbol:
        sym = sizes.index_symbol("indirect", next(self._indirect))
        x = torch.as_tensor(x, device=self.device).to(torch.int64)
        self.env[sym] = torch.where(x < 0, x + evaluate_index(size, self.env), x)
        return sym

    def masked(self, mask: Any, body: Callable[[], Any], other: bool | float) -> torch.Tensor:
        outer = self._active
        inner = torch.as_tensor(mask, device=self.device).to(torch.bool)
        self._active = inner if outer is None else outer & inner
        try:
            result = torch.as_tensor(body(), device=self.device)
        finally:
            self._active = outer
        fill = torch.tensor(other, dtype=result.dtype, device=self.device)
        return torch.where(torch.as_tensor(mask, device=self.device), result, fill)

    def where(self, cond: Any, a: Any, b: Any) -> torch.Tensor:
        return torch.where(cond, a, b)

    def to_dtype(
        self, x: Any, dtype: torch.dtype, src_dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        return torch.as_tensor(x, device=self.device).to(dtype)

    def constant(self, value: bool | float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(value, dtype=dtype, device=self.device)

    # -- randomness --
    def load_seed(self, name: str, offset: int) -> torch.Tensor:
        return self.flat[name][offset]

    def rand(self, seed: Any, offset: Any) -> torch.Tensor:
        return random_bits.rand(seed, offset)

    def randn(self, seed: Any, offset: Any) -> torch.Tensor:
        return random_bits.randn(seed, offset)

    def __getattr__(self, name: str) -> Callable[..., torch.Tensor]:
        if name in UNARY_OPS or name in BINARY_OPS:
            return _torch_fn(name)
        raise AttributeError(name)

    # -- driving --
    def run_node(self, node: KernelNode, numel: int, rnumel: int) -> None:
        self.env[XINDEX] = torch.arange(numel, device=self.device).view(numel, 1)
        self.env[RINDEX] = torch.arange(rnumel, device=self.device).view(1, rnumel)
        xr = node.mode == "xr"
        self.shape = (numel, rnumel if xr else 1)
        node.body(XINDEX, RINDEX if xr else None)


class ReferenceBackend:
    """A :class:`~kiln.loopir.backend.Backend` for any device, built on torch ops."""

    name = "reference"
    traits = BackendTraits()
    """Every choice at its default: torch ops run any program alike."""

    def fusion_veto(self, group: KernelGroup) -> str | None:
        return None

    def finalize(self) -> None:
        """Nothing is queued: each kernel is ready when generated."""

    def with_options(self, options: Mapping[str, Any]) -> ReferenceBackend:
        """No option changes how torch ops evaluate a kernel."""
        return self

    def codegen_kernel(self, group: KernelGroup) -> KernelCode:
        args = group.args
        symbols = _size_symbols(group)  # each one a size argument, in name order

        def run(*values: Any) -> None:
            tensors = values[: len(args)]
            known = dict(zip(symbols, values[len(args) :], strict=True))
            numel = int(evaluate_index(group.numel, known))
            rnumel = int(evaluate_index(group.rnumel, known))
            if numel <= 0:
                return
            handler = TorchOpsHandler(group, dict(zip(args, tensors, strict=True)), known)
            with set_ops_handler(handler):
                for node in group.nodes:
                    handler.run_node(node, numel, max(rnumel, 0))

        names = tuple(s.name for s in symbols)
        return KernelCode(group.name, _describe(group, args), run, "reference", names)


def _size_symbols(group: KernelGroup) -> list[sympy.Symbol]:
    """The size symbols ``group``'s loops, layouts and bodies hold (none in a static graph)."""
    if not symbolic.in_symbolic_graph():
        return []
    exprs = [group.numel, group.rnumel]
    for lay in group.buffers.values():
        exprs += [*lay.size, *lay.stride, lay.offset]
    handler = ReadWriteHandler()
    with set_ops_handler(handler):
        for node in group.nodes:
            node.body(XINDEX, RINDEX if node.mode == "xr" else None)
    found = symbolic.size_symbols([*exprs, *handler.addresses()])
    return sorted(found, key=lambda s: s.name)


def _describe(group: KernelGroup, args: Sequence[str]) -> str:
    header = f"# reference kernel {group.name}({', '.join(args)})\n"
    # printing every body costs sympy printing; only do it when someone will look
    wanted = logging.getLogger("kiln.loopir.output_code").isEnabledFor(logging.INFO)
    if wanted or artifacts.debug_dir() is not None:
        return header + render_group(group)
    return header + f"# {group.describe()}"
