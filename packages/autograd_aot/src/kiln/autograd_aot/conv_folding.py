"""Per-channel affine arithmetic after a convolution, folded into its weight and bias.

Eval-mode batch norm reaches the ATen graph decomposed: ``(y - mean) * invstd * gamma + beta``
on the convolution's output ``y``, each operand a per-output-channel tensor (``[C, 1, 1]``)
computed from module state. Since ``conv(x, w, b) * s + t == conv(x, w * s[:, None, None,
None], b * s + t)``, the whole chain moves into the convolution's arguments, where it is
arithmetic on state alone, which freezing computes once (:mod:`~kiln.autograd_aot.freezing`).
A pointwise op after the chain (a ReLU) then reads the convolution directly.

Working on the decomposed arithmetic rather than on a batch-norm op makes the fold independent
of how torch and Kiln decompose batch norm, and it folds any such chain (a layer scale, a
hand-written affine). The chain is followed while each step is ``mul``/``div``/``add``/``sub``
of the previous value (the only user of it) and an operand that is a number or a state tensor
varying along the channel dimension alone, with no change of size or dtype; a convolution
whose weight or bias is not state, or that is transposed, is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import torch
from torch import fx

__all__ = ["fold_conv_affine"]

aten = torch.ops.aten

_COMMUTES = (aten.mul.Tensor, aten.add.Tensor)
_STEPS = (aten.mul.Tensor, aten.div.Tensor, aten.add.Tensor, aten.sub.Tensor)

# a per-channel value: a number, or a node of shape [C]
Value: TypeAlias = "fx.Node | float"


def fold_conv_affine(graph: fx.Graph, is_state: Callable[[fx.Node], bool]) -> int:
    """Fold, in place, the affine chains after ``graph``'s convolutions whose weight, bias and
    operands ``is_state`` accepts; returns how many convolutions were rewritten. The nodes
    left dead are the caller's to remove."""
    count = 0
    for conv in list(graph.find_nodes(op="call_function", target=aten.convolution.default)):
        if _fold_one(graph, conv, is_state):
            count += 1
    return count


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _channel_operand(
    operand: object, out: torch.Tensor, is_state: Callable[[fx.Node], bool]
) -> bool:
    """Whether ``operand`` varies along ``out``'s channel dimension (1) alone: a number, or a
    state tensor of ``out``'s dtype whose other dimensions broadcast from 1."""
    if _number(operand):
        return True
    if not isinstance(operand, fx.Node) or not is_state(operand):
        return False
    val = operand.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != out.dtype or val.dim() > out.dim():
        return False
    shape = [1] * (out.dim() - val.dim()) + list(val.shape)
    return all(n == 1 for i, n in enumerate(shape) if i != 1) and shape[1] in (1, out.shape[1])


def _chain(
    conv: fx.Node, is_state: Callable[[fx.Node], bool]
) -> tuple[list[tuple[Any, Any]], fx.Node]:
    """The affine steps after ``conv`` (op, operand) and the node ending them."""
    out = conv.meta["val"]
    steps: list[tuple[Any, Any]] = []
    node = conv
    while len(node.users) == 1:
        user = next(iter(node.users))
        if user.op != "call_function" or user.target not in _STEPS or len(user.args) != 2:
            break
        if any(k != "alpha" or v != 1 for k, v in user.kwargs.items()):
            break
        first, second = user.args
        if first is node and second is not node:
            operand = second
        elif second is node and first is not node and user.target in _COMMUTES:
            operand = first
        else:
            break
        val = user.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.shape != out.shape or val.dtype != out.dtype:
            break
        if not _channel_operand(operand, out, is_state):
            break
        steps.append((user.target, operand))
        node = user
    return steps, node


def _fold_one(graph: fx.Graph, conv: fx.Node, is_state: Callable[[fx.Node], bool]) -> bool:
    x, weight, bias, *rest = conv.args
    transposed = rest[3]
    if transposed or not isinstance(weight, fx.Node) or not is_state(weight):
        return False
    if bias is not None and (not isinstance(bias, fx.Node) or not is_state(bias)):
        return False
    out = conv.meta.get("val")
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return False
    steps, last = _chain(conv, is_state)
    if not steps:
        return False
    channels = out.shape[1]
    emit = _Emitter(graph, channels)
    with graph.inserting_before(last):
        scale: Value = 1.0
        shift: Value = bias if bias is not None else 0.0
        for op, operand in steps:
            value = emit.vector(operand)
            if op is aten.div.Tensor:
                value = (
                    1.0 / value
                    if isinstance(value, float)
                    else emit.op(aten.reciprocal.default, value)
                )
            if op in (aten.mul.Tensor, aten.div.Tensor):
                scale, shift = emit.mul(scale, value), emit.mul(shift, value)
            elif op is aten.add.Tensor:
                shift = emit.add(shift, value)
            else:
                shift = emit.add(shift, emit.mul(value, -1.0))
        new_weight = weight
        if isinstance(scale, fx.Node):
            shape = [channels] + [1] * (weight.meta["val"].dim() - 1)
            new_weight = emit.op(aten.mul.Tensor, weight, emit.op(aten.view.default, scale, shape))
        elif scale != 1.0:
            new_weight = emit.op(aten.mul.Tensor, weight, scale)
        if isinstance(shift, float) and shift != 0.0:
            return False  # a constant bias on a convolution without one: left as it is
        new_bias = shift if isinstance(shift, fx.Node) else None
        folded = emit.op(aten.convolution.default, x, new_weight, new_bias, *rest)
    if folded.meta["val"].stride() != last.meta["val"].stride():
        return False  # the chain's result had another layout; dead nodes go with the DCE
    last.replace_all_uses_with(folded)
    return True


class _Emitter:
    """Inserts ATen nodes with their fake values (the op run on the inputs' fakes)."""

    def __init__(self, graph: fx.Graph, channels: int) -> None:
        self.graph = graph
        self.channels = channels

    def op(self, target: Any, *args: Any) -> fx.Node:
        node = self.graph.call_function(target, args)
        fakes = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
        node.meta["val"] = target(*fakes)
        return node

    def vector(self, operand: Any) -> Value:
        """A number as a float; a state tensor as a ``[C]`` vector."""
        if _number(operand):
            return float(operand)
        flat = self.op(aten.view.default, operand, [-1])
        if flat.meta["val"].shape[0] == self.channels:
            return flat
        return self.op(aten.expand.default, flat, [self.channels])

    def mul(self, a: Value, b: Value) -> Value:
        if isinstance(a, float) and isinstance(b, float):
            return a * b
        if isinstance(a, float):
            a, b = b, a
        if b == 1.0:
            return a
        return self.op(aten.mul.Tensor, a, b)

    def add(self, a: Value, b: Value) -> Value:
        if isinstance(a, float) and isinstance(b, float):
            return a + b
        if isinstance(a, float):
            a, b = b, a
        if b == 0.0:
            return a
        return self.op(aten.add.Tensor, a, b)
