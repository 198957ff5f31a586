"""Frozen convolutions and linears as oneDNN calls on a prepacked weight, with the op after
them fused.

Why: ATen's CPU convolution hands oneDNN a plain weight, which oneDNN reorders into its
blocked layout on every call, and the activation after it is a pass over the output of its
own. In a frozen program the weight is a constant, so the reorder can run once, with the
constants (``mkldnn._reorder_convolution_weight``), and the convolution becomes
``mkldnn._convolution_pointwise``, which applies the activation (or the residual add, then
ReLU: ``_convolution_pointwise.binary``) as a oneDNN post-op while the output is in cache.

What is rewritten (:func:`prepack_convolutions`): a 2-D float32 convolution on the CPU, not
transposed, large enough (:data:`MIN_MACS`), of one group (oneDNN's prepacked depthwise and
grouped convolutions are slower
than ATen's channels-last ones here, and its binary post-ops run only for one group), with
static sizes, whose weight and bias are state and whose result (or its only reader) is not
returned (the fused op answers channels-last, where eager may answer NCHW; a backend that
compiles the graph lays further outputs out as traced). The op after it is fused where it is
the convolution's only reader and oneDNN has it as a post-op (``_UNARY``); an ``add`` of a
tensor of the output's own shape is fused as the binary post-op, and a ReLU after that too.

Linears (:func:`prepack_linears`) the same way: ``mm`` (or ``addmm``, or ``mm`` then ``* 1``
then ``+ bias``, as the core table decomposes ``addmm``) of a float32 matrix of static sizes,
with enough rows (:data:`MIN_LINEAR_ROWS`), by a 2-D weight that is state (or computed from
state alone; its transpose, ``t``/``permute``, is what linear layers multiply by), and a bias
of one dim that is state too, becomes ``mkldnn._linear_pointwise`` on the weight reordered
once (``mkldnn._reorder_linear_weight``, told the row count), with a piecewise-linear op
after it (through one reshaping ``view``; :data:`LINEAR_POST_OPS`) fused as a post-op. Its result is contiguous, as ``mm``'s:
a returned one needs no care.

The packed weight is an opaque oneDNN tensor (no strides, no storage pointer): it is only
ever a constant, produced by the constants graph and passed to the fused op. Its node's
value in the graphs is a stand-in with the plain weight's sizes, which no kernel reads; the
fused op's value is channels-last, as oneDNN returns it for any input layout.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from kiln.autograd_aot.symbolic import is_symbolic

__all__ = [
    "LINEAR_POST_OPS",
    "MIN_LINEAR_ROWS",
    "MIN_MACS",
    "PACKING_OPS",
    "enabled",
    "prepack_convolutions",
    "prepack_linears",
]

aten = torch.ops.aten

# aten unary op -> (oneDNN post-op name, its scalars from the op's arguments, its algorithm)
_UNARY: dict[Any, tuple[str, Callable[[fx.Node], list[Any]], Callable[[fx.Node], str]]] = {}


def _arg(node: fx.Node, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _no_scalars(node: fx.Node) -> list[Any]:
    return []


def _no_algorithm(node: fx.Node) -> str:
    return ""


def _register_unary() -> None:
    for op, name in (
        (aten.relu.default, "relu"),
        (aten.sigmoid.default, "sigmoid"),
        (aten.tanh.default, "tanh"),
        (aten.hardswish.default, "hardswish"),
        (aten.hardsigmoid.default, "hardsigmoid"),
        (aten.silu.default, "swish"),
    ):
        _UNARY[op] = (name, _no_scalars, _no_algorithm)
    _UNARY[aten.leaky_relu.default] = (
        "leaky_relu",
        lambda n: [_arg(n, 1, "negative_slope", 0.01)],
        _no_algorithm,
    )
    _UNARY[aten.hardtanh.default] = (
        "hardtanh",
        lambda n: [_arg(n, 1, "min_val", -1.0), _arg(n, 2, "max_val", 1.0)],
        _no_algorithm,
    )
    _UNARY[aten.clamp.default] = (  # relu6 in tables that decompose hardtanh
        "hardtanh",
        lambda n: [_arg(n, 1, "min", None), _arg(n, 2, "max", None)],
        _no_algorithm,
    )
    _UNARY[aten.gelu.default] = ("gelu", _no_scalars, lambda n: _arg(n, 1, "approximate", "none"))


_register_unary()


def enabled() -> bool:
    """Whether frozen convolutions are prepacked: oneDNN is in this torch build, not turned
    off (``torch.backends.mkldnn.flags(enabled=False)``), and ``KILN_FREEZING_PREPACK`` is not
    ``0``."""
    if os.environ.get("KILN_FREEZING_PREPACK", "1") == "0" or not torch.backends.mkldnn.enabled:
        return False
    return bool(torch.backends.mkldnn.is_available()) and hasattr(
        torch.ops.mkldnn, "_convolution_pointwise"
    )


def _packing_ops() -> frozenset[Any]:
    names = ("_reorder_convolution_weight", "_reorder_linear_weight")
    return frozenset(
        getattr(torch.ops.mkldnn, n).default for n in names if hasattr(torch.ops.mkldnn, n)
    )


PACKING_OPS = _packing_ops()
"""The ops that pack a weight: computed ahead of the calls, with the other constants."""


MIN_MACS = 1 << 22
"""The fewest multiply-adds per call (output elements times inputs per output) a convolution
must do to be prepacked. oneDNN's call costs a fixed price (its threads woken, its primitive
looked up) that ATen's direct path for small products does not pay: a squeeze-excitation
block's convolutions on 1x1 positions ran ten times slower or worse packed, and 1x1
convolutions of a few million multiply-adds lost too, while larger ones won 1.3-3x here."""


def _static_ints(values: Any) -> list[int] | None:
    if not isinstance(values, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        return None
    return list(values)


def _packable(conv: fx.Node, is_state: Callable[[fx.Node], bool]) -> bool:
    if len(conv.args) != 9 or conv.kwargs:
        return False
    x, weight, bias, stride, padding, dilation, transposed, _, groups = conv.args
    out = conv.meta.get("val")
    xval = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(out, torch.Tensor) or not isinstance(xval, torch.Tensor):
        return False
    if out.dim() != 4 or out.dtype != torch.float32 or out.device.type != "cpu":
        return False
    if is_symbolic(out) or is_symbolic(xval) or xval.dtype != torch.float32:
        return False
    if transposed or groups != 1 or not isinstance(weight, fx.Node) or not is_state(weight):
        return False
    if bias is not None and (not isinstance(bias, fx.Node) or not is_state(bias)):
        return False
    if not all(len(_static_ints(v) or ()) == 2 for v in (stride, padding, dilation)):
        return False
    wval = weight.meta.get("val")
    return isinstance(wval, torch.Tensor) and out.numel() * math.prod(wval.shape[1:]) >= MIN_MACS


def _only_user(node: fx.Node) -> fx.Node | None:
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    return user if user.op == "call_function" else None


def _same_value(a: fx.Node, b: fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (
        isinstance(va, torch.Tensor)
        and isinstance(vb, torch.Tensor)
        and va.shape == vb.shape
        and va.dtype == vb.dtype
    )


def _residual(conv: fx.Node, add: fx.Node) -> fx.Node | None:
    """The other operand of ``add`` (``conv + other`` or ``other + conv``, alpha 1) where it is
    a tensor of the convolution's own shape and dtype; None otherwise."""
    if add.target is not aten.add.Tensor or len(add.args) != 2:
        return None
    if any(k != "alpha" or v != 1 for k, v in add.kwargs.items()):
        return None
    first, second = add.args
    other = second if first is conv else first
    if not isinstance(other, fx.Node) or other is conv or conv not in (first, second):
        return None
    return other if _same_value(other, conv) and _same_value(add, conv) else None


def _unary(node: fx.Node) -> tuple[str, list[Any], str] | None:
    found = _UNARY.get(node.target)
    source = node.args[0] if node.args else None
    if found is None or len(node.all_input_nodes) != 1 or not isinstance(source, fx.Node):
        return None
    if not _same_value(node, source):
        return None
    name, scalars, algorithm = found
    values = scalars(node)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    return name, values, algorithm(node)


def prepack_convolutions(
    graph: fx.Graph, is_state: Callable[[fx.Node], bool], pinned: set[fx.Node]
) -> int:
    """Rewrite, in place, ``graph``'s packable convolutions into oneDNN calls on a packed
    weight, each with the op after it fused where oneDNN has it; returns how many. Nodes that
    ``pinned`` holds (returned, or viewed by what is) are never replaced. The nodes left dead
    are the caller's to remove."""
    if not enabled():
        return 0
    count = 0
    for conv in list(graph.find_nodes(op="call_function", target=aten.convolution.default)):
        if conv in pinned or not _packable(conv, is_state):
            continue
        if _rewrite(graph, conv, pinned):
            count += 1
    return count


def _rewrite(graph: fx.Graph, conv: fx.Node, pinned: set[fx.Node]) -> bool:
    x, weight, bias, stride, padding, dilation, _, _, groups = conv.args
    assert isinstance(x, fx.Node) and isinstance(weight, fx.Node)
    stride, padding, dilation = (_static_ints(v) or [] for v in (stride, padding, dilation))
    last, other = conv, None
    unary: tuple[str, list[Any], str] | None = None
    user = _only_user(conv)
    if user in pinned:  # a returned activation of it would come back channels-last
        return False
    if user is not None:
        other = _residual(conv, user)
        if other is not None:
            last = user
            after = _only_user(user)
            if after is not None and after not in pinned and after.target is aten.relu.default:
                last, unary = after, ("relu", [], "")
        else:
            unary = _unary(user)
            if unary is not None:
                last = user
    sizes = list(x.meta["val"].shape)
    mkldnn = torch.ops.mkldnn
    with graph.inserting_before(last):
        packed = graph.call_function(
            mkldnn._reorder_convolution_weight.default,
            (weight, list(padding), list(stride), list(dilation), groups, sizes),
        )
        # a stand-in with the plain weight's sizes: the packed tensor is opaque
        packed.meta["val"] = weight.meta["val"].clone()
        common = (list(padding), list(stride), list(dilation), groups)
        if other is not None:
            fused = graph.call_function(
                mkldnn._convolution_pointwise.binary,
                (
                    x,
                    other,
                    packed,
                    bias,
                    *common,
                    "add",
                    None,
                    unary[0] if unary else None,
                    [],
                    None,
                ),
            )
        else:
            attr, scalars, algorithm = unary if unary is not None else ("none", [], "")
            fused = graph.call_function(
                mkldnn._convolution_pointwise.default,
                (x, packed, bias, *common, attr, scalars, algorithm),
            )
    # oneDNN answers channels-last for every input layout
    fused.meta["val"] = last.meta["val"].clone(memory_format=torch.channels_last)
    last.replace_all_uses_with(fused)
    return True


MIN_LINEAR_ROWS = 8
"""The fewest rows (the static first size of the matrix multiplied by the weight) a linear
must have to be prepacked. Measured on a 2-core AVX2 machine: ``_linear_pointwise`` on the
packed weight against ``addmm`` at 1, 8, 64, 128, 512 and 3136 rows by 768x768, 768x3072,
3072x768 and 1024x1000 weights, one and two threads, in interleaved rounds, medians of wall
and process CPU time. One row (a matrix-vector product) lost at two threads (2-50x slower)
and was within noise at one; from 8 rows on the packed call was mostly 1.05-1.5x faster at
one thread and 1.1-2.2x at two, its worst cases within noise (0.9-1.0), at every weight
size, so there is no threshold on the weight's size. MKL's packed ``mkl._mkl_linear``
gained less than oneDNN's and has no post-ops."""


def _float_matrix(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 2 or is_symbolic(val):
        return None
    ok = val.dtype == torch.float32 and val.device.type == "cpu" and val.layout == torch.strided
    return val if ok else None


def _is_one(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1


def _bias_of(out: fx.Node, is_state: Callable[[fx.Node], bool]) -> tuple[fx.Node, fx.Node] | None:
    """``(bias, add)`` where ``out`` (the product, maybe times 1) is only read by an ``add`` of
    a 1-D state bias of the output's width."""
    user = _only_user(out)
    if user is not None and user.target is aten.mul.Tensor and _is_one(user.args[1]):
        if user.args[0] is not out or user.kwargs:
            return None
        out, user = user, _only_user(user)
    if user is None or user.target is not aten.add.Tensor or len(user.args) != 2:
        return None
    if any(k != "alpha" or not _is_one(v) for k, v in user.kwargs.items()):
        return None
    bias = user.args[1] if user.args[0] is out else user.args[0]
    bval = bias.meta.get("val") if isinstance(bias, fx.Node) else None
    oval = out.meta["val"]
    if not isinstance(bias, fx.Node) or not isinstance(bval, torch.Tensor) or bias is out:
        return None
    if bval.shape != (oval.shape[1],) or bval.dtype != torch.float32 or not is_state(bias):
        return None
    return bias, user


def _linear_parts(
    mm: fx.Node, is_state: Callable[[fx.Node], bool]
) -> tuple[fx.Node, fx.Node, fx.Node | None, fx.Node] | None:
    """``(x, mat2, bias, last)`` of a packable product: ``last`` is the node the linear with
    its bias computes."""
    if mm.target is aten.addmm.default:
        if len(mm.args) != 3 or any(not _is_one(v) for v in mm.kwargs.values()):
            return None
        bias, x, mat2 = mm.args
        bval = bias.meta.get("val") if isinstance(bias, fx.Node) else None
        out = mm.meta.get("val")
        if not isinstance(bval, torch.Tensor) or not isinstance(out, torch.Tensor):
            return None
        if bval.shape != (out.shape[-1],) or bval.dtype != torch.float32:
            return None
        if not isinstance(bias, fx.Node) or not is_state(bias):
            return None
        found: tuple[fx.Node | None, fx.Node] = (bias, mm)
    else:
        if len(mm.args) != 2 or mm.kwargs:
            return None
        x, mat2 = mm.args
        found = (_bias_of(mm, is_state) if _float_matrix(mm) is not None else None) or (None, mm)
    if not isinstance(x, fx.Node) or not isinstance(mat2, fx.Node) or is_state(x):
        return None
    xval, wval = _float_matrix(x), _float_matrix(mat2)
    if xval is None or wval is None or not is_state(mat2):
        return None
    if xval.shape[0] < MIN_LINEAR_ROWS or not wval.numel():  # oneDNN refuses an empty weight
        return None
    return x, mat2, found[0], found[1]


def _out_in_weight(graph: fx.Graph, mat2: fx.Node) -> fx.Node:
    """The weight as linear layers store it, (out, in): ``mat2``'s transpose."""
    if mat2.target is aten.t.default or (
        mat2.target is aten.permute.default and list(mat2.args[1]) == [1, 0]  # type: ignore[arg-type]
    ):
        source = mat2.args[0]
        if isinstance(source, fx.Node) and _float_matrix(source) is not None:
            return source
    with graph.inserting_after(mat2):
        weight = graph.call_function(aten.permute.default, (mat2, [1, 0]))
    weight.meta["val"] = mat2.meta["val"].permute(1, 0)
    return weight


LINEAR_POST_OPS = frozenset({"relu", "hardtanh", "leaky_relu"})
"""The post-ops fused into a packed linear: the piecewise-linear ones. Measured as for
:data:`MIN_LINEAR_ROWS`, a fused ReLU won or tied against the packed linear then ATen's ReLU,
while oneDNN's GELU (erf or tanh) and SiLU post-ops lost 3-15% at one thread from 64 rows on
to the same linear then ATen's kernel (which a compiler fuses with what follows anyway)."""


def _fused_unary(
    last: fx.Node,
) -> tuple[fx.Node | None, fx.Node, tuple[str, list[Any], str]] | None:
    """``(view, op, post-op)``: the unary op reading ``last`` (through one ``view`` of it)."""
    user = _only_user(last)
    view = None
    if user is not None and user.target in (aten.view.default, aten._unsafe_view.default):
        view, user = user, _only_user(user)
    unary = _unary(user) if user is not None else None
    if unary is None or user is None or unary[0] not in LINEAR_POST_OPS:
        return None
    return view, user, unary


def prepack_linears(graph: fx.Graph, is_state: Callable[[fx.Node], bool]) -> int:
    """Rewrite, in place, ``graph``'s packable matrix products by a state weight into oneDNN
    linears on a packed weight, each with the op after it fused where it gains to;
    returns how many. The nodes left dead are the caller's to remove."""
    if not enabled() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return 0
    mkldnn = torch.ops.mkldnn
    count = 0
    targets = (aten.mm.default, aten.addmm.default)
    for mm in [n for n in graph.nodes if n.op == "call_function" and n.target in targets]:
        parts = _linear_parts(mm, is_state)
        if parts is None:
            continue
        x, mat2, bias, last = parts
        weight = _out_in_weight(graph, mat2)
        fused_unary = _fused_unary(last)
        view, replaced = None, last
        attr, scalars, algorithm = "none", list[Any](), ""
        if fused_unary is not None:
            view, replaced, (attr, scalars, algorithm) = fused_unary
        with graph.inserting_before(replaced):
            packed = graph.call_function(
                mkldnn._reorder_linear_weight.default, (weight, x.meta["val"].shape[0])
            )
            packed.meta["val"] = weight.meta["val"].clone()  # a stand-in: the packed is opaque
            fused = graph.call_function(
                mkldnn._linear_pointwise.default, (x, packed, bias, attr, scalars, algorithm)
            )
            fused.meta["val"] = last.meta["val"].clone()
            result = fused
            if view is not None:
                reshape = aten.view.default  # the product is contiguous
                result = graph.call_function(reshape, (fused, *view.args[1:]))
                result.meta["val"] = replaced.meta["val"].clone()
        replaced.replace_all_uses_with(result)
        count += 1
    return count
