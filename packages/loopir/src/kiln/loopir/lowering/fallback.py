"""Extern calls: vendor-library kernels the wrapper calls on purpose, and fallbacks.

Both become an ``ExternBuffer`` the wrapper runs as an ATen call on real tensors;
their results feed the next generated kernel, where pointwise epilogues are inlined.
They differ in why:

* **Vendor kernels** (``VENDOR_KERNELS``): GEMMs, convolutions and fused attention,
  where a tuned library (oneDNN/MKL, cuBLAS, cuDNN, FlashAttention, CUTLASS) beats
  a generated loop nest. Calling them is the design, as in Inductor. Counted in
  ``extern_kernels`` for reports, not as missing work; so are the ops a backend
  names in its traits' ``extern_ops`` (ATen's max-pool backward scatter on CPUs).
* **Fallbacks**: every other op loopir can neither lower nor decompose (``sort``,
  ``topk``, ``_cdist_forward``, upsampling backwards...). Counted in
  ``fallback_ops`` and logged: each is a lowering still to write.

An extern result's layout is what the ATen kernel will really produce: the op is
run on meta tensors with the *planned* layouts of its (realized) inputs, which may
differ from the traced ones, so later kernels index the result correctly and the
wrapper's ``as_layout`` safety net never has to copy.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kiln.capture import counters
from kiln.loopir import sizes, symbolic
from kiln.loopir.errors import StaticShapesOnly, Unlowerable
from kiln.loopir.ir.buffers import Buffer, ExternBuffer, MultiOutput
from kiln.loopir.ir.layout import Layout, ordered_layout
from kiln.loopir.ir.loops import Pointwise
from kiln.loopir.ir.strided import copy_like, realize_as_tensor, realize_like
from kiln.loopir.ir.views import ReinterpretView, StorageBox, TensorBox, pointwise_copy
from kiln.loopir.lowering.pooling import depthwise_convolution
from kiln.loopir.lowering.registry import LOWERINGS, overloads, register_lowering
from kiln.loopir.virtualized import V

__all__ = [
    "fallback",
    "extern_call",
    "VENDOR_KERNELS",
    "is_vendor_kernel",
    "is_convolution",
    "is_packed_convolution",
    "packet_name",
]

log = logging.getLogger(__name__)
aten = torch.ops.aten

_ATTENTION = (
    "_scaled_dot_product_flash_attention_for_cpu",  # ATen's CPU flash attention
    "_scaled_dot_product_flash_attention",  # FlashAttention (CUDA)
    "_scaled_dot_product_efficient_attention",  # CUTLASS memory-efficient attention (CUDA)
    "_scaled_dot_product_cudnn_attention",  # cuDNN fused attention (CUDA)
)

VENDOR_KERNELS: dict[str, tuple[str, ...]] = {
    # GEMMs: MKL/oneDNN on CPU, cuBLAS(Lt) on CUDA
    "mm": ("default",),
    "bmm": ("default",),
    "addmm": ("default",),
    "baddbmm": ("default",),
    # convolutions and their gradients: oneDNN on CPU, cuDNN on CUDA
    "convolution": ("default",),
    "_convolution": ("default",),
    "convolution_backward": ("default",),
    # fused scaled-dot-product attention (tiled matmuls + online softmax), both directions
    **{name: ("default",) for name in _ATTENTION},
    **{f"{name}_backward": ("default",) for name in _ATTENTION},
}
"""ATen ops (packet → overloads) that stay library calls on purpose, and why (comments)."""


def packet_name(op: Any) -> str:
    """The ATen op's name without its overload (``convolution``), or "" for other callables."""
    return str(getattr(getattr(op, "overloadpacket", None), "__name__", ""))


def is_vendor_kernel(op: Any) -> bool:
    """Whether ``op`` (an ``OpOverload``) is one of ``VENDOR_KERNELS``."""
    return getattr(op, "_overloadname", None) in VENDOR_KERNELS.get(packet_name(op), ())


def _layout(meta: torch.Tensor, device: torch.device) -> Layout:
    size = tuple(sizes.sympify(s) for s in meta.shape)
    stride = tuple(sizes.sympify(s) for s in meta.stride())
    return Layout(device, meta.dtype, size, stride)


def _planned_meta(
    x: Buffer | ReinterpretView, value: Callable[[Any], int] = sizes.evaluate_int
) -> torch.Tensor:
    """A meta tensor with the sizes, strides and offset loopir planned for ``x`` (each
    evaluated by ``value``: as a number, or at the compiled call's hints)."""
    lay = x.layout
    size = [value(s) for s in lay.size]
    stride = [value(s) for s in lay.stride]
    offset = value(lay.offset)
    storage = value(lay.storage_size()) if all(size) else offset
    base = torch.empty((max(storage, offset),), dtype=lay.dtype, device="meta")
    return base.as_strided(size, stride, offset)


def _planned_outputs(op: Any, args: Any, kwargs: Any, traced: Any) -> Any:
    """``op``'s result on meta tensors laid out as planned; ``traced`` when that fails.

    The real kernel sees the planned layouts, so its output strides are these
    (many kernels follow their inputs' strides: attention, pointwise fallbacks).
    """

    def to_meta(x: Any) -> Any:
        return _planned_meta(x) if isinstance(x, (Buffer, ReinterpretView)) else x

    try:
        found = _meta_result(op, *pytree.tree_map(to_meta, (args, kwargs)))
    except StaticShapesOnly:  # symbolic sizes: the stride order the kernel gives at the hints
        return _ordered_at_hints(op, args, kwargs, traced)
    except Exception as exc:  # no meta kernel, or one stricter than ATen's
        log.debug("no meta result for %s on planned layouts (%s): traced strides", op, exc)
        return traced
    same = pytree.tree_structure(found) == pytree.tree_structure(traced) and all(
        not isinstance(t, torch.Tensor)
        or (isinstance(f, torch.Tensor) and f.shape == t.shape and f.dtype == t.dtype)
        for f, t in zip(pytree.tree_leaves(found), pytree.tree_leaves(traced), strict=True)
    )
    return found if same else traced


_META_RESULTS: dict[Any, Any] = {}
_META_RESULTS_KEPT = 4096


def _meta_result(op: Any, margs: Any, mkwargs: Any) -> Any:
    """``op``'s result on these meta tensors (NHWC where a convolution would pick it), kept by
    the op and its arguments' sizes, strides, offsets and dtypes: torch runs many meta kernels
    through Python decompositions (an ``addmm`` takes about 1.5 ms), and a model calls the same
    products at the same shapes in every layer. Only the layouts of the result are read."""
    leaves, spec = pytree.tree_flatten((margs, mkwargs))
    key: Any = (op, spec, *[_meta_key(leaf) for leaf in leaves])
    try:
        found = _META_RESULTS.get(key)
    except TypeError:  # an argument that cannot key it
        return _nhwc_if_conv_would_be(op, margs, op(*margs, **mkwargs))
    if found is None:
        found = _nhwc_if_conv_would_be(op, margs, op(*margs, **mkwargs))
        if len(_META_RESULTS) >= _META_RESULTS_KEPT:
            _META_RESULTS.clear()
        _META_RESULTS[key] = found
    return found


def _meta_key(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return (leaf.dtype, leaf.device, leaf.shape, leaf.stride(), leaf.storage_offset())
    return (type(leaf), leaf)


def _ordered_at_hints(op: Any, args: Any, kwargs: Any, traced: Any) -> Any:
    """``traced`` with each tensor's strides in the order ``op`` lays its result out when run
    on meta tensors planned at the compiled call's sizes (a kernel that follows its inputs'
    layout, as attention does, gives the planned inputs' order at every size); ``traced``
    where that run fails or a size is 0 or 1 there (its order is not defined). A layout
    is a tuning decision here: at a size where the kernel orders otherwise, the wrapper copies.
    """

    def to_meta(x: Any) -> Any:
        return _planned_meta(x, symbolic.hint) if isinstance(x, (Buffer, ReinterpretView)) else x

    try:
        found = _meta_result(op, *pytree.tree_map(to_meta, (args, kwargs)))
    except Exception as exc:
        log.debug("no meta result for %s at the hints (%s): traced strides", op, exc)
        return traced
    leaves, spec = pytree.tree_flatten(traced)
    at_hints = pytree.tree_leaves(found)
    if pytree.tree_structure(found) != spec:
        return traced
    return pytree.tree_unflatten(
        [_in_order(t, f) for t, f in zip(leaves, at_hints, strict=True)], spec
    )


def _in_order(t: Any, found: Any) -> Any:
    """A meta tensor shaped like ``t`` (symbolic), dense in ``found``'s stride order; ``t``
    itself unless ``found`` (the result at the hints) is dense and starts its storage."""
    if not isinstance(t, torch.Tensor) or not isinstance(found, torch.Tensor):
        return t
    if found.dtype != t.dtype or found.dim() != t.dim() or any(n <= 1 for n in found.shape):
        return t
    order = sorted(range(t.dim()), key=lambda d: (found.stride(d), -d))  # innermost first
    step_at_hints = 1
    for d in order:  # only a dense result of its own: a view keeps the traced layout
        if found.stride(d) != step_at_hints:
            return t
        step_at_hints *= found.shape[d]
    if found.storage_offset() != 0:
        return t
    strides: list[Any] = [0] * t.dim()
    step: Any = 1
    for d in order:
        strides[d] = step
        step = step * t.shape[d]
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device="meta")


def is_convolution(op: Any) -> bool:
    """Whether ``op`` is ATen's (forward) convolution, whichever overload."""
    return packet_name(op) in ("convolution", "_convolution")


def is_packed_convolution(op: Any) -> bool:
    """Whether ``op`` is oneDNN's convolution with a fused post-op, which freezing calls on a
    prepacked weight (``kiln.autograd_aot.onednn_packing``); it answers channels-last."""
    return packet_name(op) == "_convolution_pointwise" and getattr(op, "namespace", "") == "mkldnn"


def _nhwc(t: torch.Tensor) -> bool:
    """Whether ATen's convolutions take ``t`` as channels-last: ``suggest_memory_format``,
    which asks ``is_channels_last_strides_2d``, not ``is_contiguous(channels_last)``.

    The two differ where a size-1 dim's stride is 0 or out of order (a batch of one
    permuted NHWC, passed as a view with stride 0 on N: ATen answers NCHW) and for a
    1x1 weight stored channels-last (ATen answers NHWC): a plan from the other test
    cost a copy of the result on every call.
    """
    if t.dim() != 4 or t.layout != torch.strided:
        return False
    size, stride = t.shape, t.stride()
    if stride[1] == 0:
        return False
    lowest = 0
    for d in (1, 3, 2, 0):
        if size[d] == 0 or stride[d] < lowest or (d == 0 and lowest == stride[1]):
            return False
        lowest = stride[d] * size[d] if size[d] > 1 else stride[d]
    return True


def _nhwc_activations(op: Any, args: Sequence[Any]) -> tuple[int, ...]:
    """Which of a convolution's arguments (its activations, and its weight where the backend
    asks: ``convolution_weight_nhwc``) to give it channels-last.

    In a channels-last graph an NCHW input (the image into the stem) would make the
    convolution answer NCHW, and the kernels after it follow that layout: one copy of
    the input keeps the whole graph NHWC, as cuDNN wants. In other graphs (training's) the
    backward of a depthwise convolution gets its gradient and input NHWC where the backend
    asks (``depthwise_nhwc``): cuDNN runs depthwise convolutions only in NHWC, and ATen's
    own NCHW kernels for the backward are several times slower than cuDNN and a copy or
    two (a large share of a depthwise net's training step). The forward stays NCHW: its
    result is saved for the backward in the traced layout, so NHWC would cost two copies
    for a kernel ATen runs well enough.
    """
    if V.graph.channels_last:
        if not is_convolution(op):
            return ()
        weight = args[1]
        asks = (
            isinstance(weight, TensorBox)
            and V.graph.backend_traits(weight.get_device()).convolution_weight_nhwc
        )
        return (0, 1) if asks else (0,)
    if packet_name(op) != "convolution_backward":
        return ()
    weight, groups = args[2], args[9]
    if not isinstance(weight, TensorBox) or len(weight.get_size()) != 4:
        return ()
    if not isinstance(groups, int) or groups < 2 or sizes.static_int(weight.get_size()[1]) != 1:
        return ()
    return (0, 1) if V.graph.backend_traits(weight.get_device()).depthwise_nhwc else ()


def _realize_in_read_order(x: Any) -> None:
    """Store ``x``, a convolution's input not stored yet, in the dim order it reads its
    source (NHWC after a convolution that answered NHWC), where that is not NCHW.

    In an NCHW graph a convolution still answers NHWC when its input is NHWC (a LayerNorm
    over a permutation, as in vitamin's and MBConv's blocks). The activation computed from
    that result and read by the next convolution was stored NCHW, a transposing gather over
    the whole tensor, and sent the next (often depthwise) convolution down its slower NCHW
    path. Stored in its source's order, it is a plain walk and the next convolution answers
    NHWC too. A value the graph returns keeps eager's strides instead.
    """
    if not isinstance(x, TensorBox) or id(x) in V.graph.returned_args:
        return
    box = x.data
    if not (isinstance(box, StorageBox) and isinstance(box.data, Pointwise)):
        return
    order = box.read_order()
    if order is None or order == sorted(order):
        return
    loops = box.data
    layout = ordered_layout(loops.get_device(), loops.get_dtype(), loops.get_size(), order)
    box.realize(layout.stride)


def _nhwc_meta(x: Any) -> torch.Tensor | None:
    """A channels-last meta tensor shaped like ``x``, a 4-D IR value (else None)."""
    if not isinstance(x, TensorBox) or len(x.get_size()) != 4:
        return None
    size = [sizes.static_int(n) for n in x.get_size()]
    if any(n is None for n in size):
        return None
    empty = torch.empty(size, dtype=x.get_dtype(), device="meta")  # type: ignore[arg-type]
    return empty.contiguous(memory_format=torch.channels_last)


def _copied_nhwc(x: Any) -> Any:
    """``x`` (a 4-D NCHW buffer or view) copied channels-last; anything else as it is."""
    if not isinstance(x, (Buffer, ReinterpretView)) or len(x.layout.size) != 4:
        return x
    meta = _planned_meta(x)
    if not meta.is_contiguous() or meta.is_contiguous(memory_format=torch.channels_last):
        return x
    box = TensorBox(StorageBox(x) if isinstance(x, Buffer) else x)
    nhwc = meta.contiguous(memory_format=torch.channels_last)
    return copy_like(box, nhwc, "channels-last convolution input")


def _nhwc_if_conv_would_be(op: Any, margs: Sequence[Any], found: Any) -> Any:
    """A 2-D convolution's (or its backward's) results laid out as cuDNN and oneDNN do.

    ATen's meta convolution always answers NCHW, but the real kernels return NHWC
    when the input or the weight is NHWC (``suggest_memory_format``), as inputs are
    in graphs that prefer channels-last (``layout_choice.prefers_channels_last``).
    """
    if packet_name(op) == "convolution_backward" and isinstance(found, (tuple, list)):
        # grad_input and grad_weight take the format of input and weight alone, whatever
        # grad_output's (ATen makes grad_output contiguous in it); older metas followed
        # grad_output, so Swin's stem, whose output is permuted NHWC, got an NHWC plan
        # for an NCHW weight gradient and a copy on every call
        nhwc = _nhwc(margs[1]) or _nhwc(margs[2])
        fmt = torch.channels_last if nhwc else torch.contiguous_format
        return type(found)(
            t.contiguous(memory_format=fmt) if i < 2 and _4d(t) else t for i, t in enumerate(found)
        )
    if not is_convolution(op) or not _4d(found):
        return found
    if not (_nhwc(margs[0]) or _nhwc(margs[1])):
        return found
    return found.contiguous(memory_format=torch.channels_last)


def _4d(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 4


def extern_call(op: Any, args: Any, kwargs: Any, *, is_fallback: bool) -> Any:
    """An ``ExternBuffer`` calling ``op``; results as IR shaped like the op's."""
    traced = V.graph.current_meta
    rows = _is_attention(op)

    def realize(x: Any) -> Any:
        if isinstance(x, TensorBox):
            realize_like(x, V.graph.layout_hint(x))
            if rows:
                _store_rows_innermost(x)
                return _rows_contiguous(realize_as_tensor(x, f"input of {op}"))
            return realize_as_tensor(x, f"input of {op}")
        return x

    nhwc = _nhwc_activations(op, args)
    for i in nhwc:  # a value not stored yet is stored NHWC right away
        realize_like(args[i], _nhwc_meta(args[i]))
    if is_convolution(op) and not V.graph.channels_last:
        _realize_in_read_order(args[0])
    rargs, rkwargs = pytree.tree_map(realize, (tuple(args), dict(kwargs)))
    rargs = tuple(_copied_nhwc(a) if i in nhwc else a for i, a in enumerate(rargs))
    meta = _planned_outputs(op, rargs, rkwargs, traced)
    single = isinstance(meta, torch.Tensor)
    # a multi-output call's own buffer is only a handle; its parts carry layouts
    handle = Layout(V.graph.default_device, torch.uint8, (), ())
    layout = _layout(meta, V.graph.device_of(traced)) if single else handle
    buf = ExternBuffer(
        "", layout, op=op, args=rargs, kwargs=rkwargs, fallback=is_fallback, multi_output=not single
    )
    V.graph.register_buffer(buf)
    if single:
        return TensorBox(StorageBox(buf))

    leaves, spec = pytree.tree_flatten(meta)
    devices = [V.graph.device_of(t) for t in pytree.tree_leaves(traced)]  # meta's real ones
    outs: list[Any] = []
    for i, (leaf, path) in enumerate(zip(leaves, _leaf_paths(meta), strict=True)):
        if not isinstance(leaf, torch.Tensor):
            outs.append(leaf)
            continue
        part = MultiOutput("", _layout(leaf, devices[i]), parent=buf, index=path)
        V.graph.register_buffer(part)
        outs.append(TensorBox(StorageBox(part)))
    return pytree.tree_unflatten(outs, spec)


def _leaf_paths(value: Any) -> list[tuple[int, ...]]:
    """The subscripts that reach each leaf of an op's result (tuples and lists of tensors), in
    pytree order: the wrapper indexes the result directly instead of flattening it per call."""
    if not isinstance(value, (tuple, list)):
        return [()]
    return [(i, *path) for i, item in enumerate(value) for path in _leaf_paths(item)]


def _is_attention(op: Any) -> bool:
    return packet_name(op).removesuffix("_backward") in _ATTENTION


def _store_rows_innermost(x: TensorBox) -> None:
    """Store the value under ``x``'s views row-major if it is not stored yet.

    Fused attention kernels need each operand's last dim contiguous (CUDA's raises
    "last dimension must be contiguous"), but a channels-last graph would lay a new 4-D
    buffer out NHWC: Swin's padded position bias, (1, heads, 49, 56), had heads innermost.
    """
    box = x.storage()
    if not V.graph.channels_last or box is None or isinstance(box.data, Buffer):
        return
    strides = [sizes.static_int(s) for s in sizes.contiguous_strides(box.data.get_size())]
    if len(strides) == 4 and all(s is not None for s in strides):
        box.realize(strides)  # type: ignore[arg-type]


def _rows_contiguous(x: Buffer | ReinterpretView) -> Buffer | ReinterpretView:
    """``x``, or a row-major copy of it where its last dim is not contiguous.

    A value stored before attention reads it may have been laid out otherwise: a mask read by
    every block (timm's shared relative-position bias) is stored once, where it is computed,
    and a channels-last graph stores it in the order it reads its source, heads innermost.
    cuDNN's attention faults on such a mask (a misaligned address) instead of refusing it.
    The copy is made once per graph, for all the calls that read ``x``.
    """
    size, stride = x.layout.size, x.layout.stride
    if not size or sizes.static_int(size[-1]) == 1 or sizes.static_int(stride[-1]) == 1:
        return x
    key = (x.get_name(), *map(str, (*size, *stride, x.layout.offset)))
    copies = V.graph.row_major_copies
    if key not in copies:
        box = TensorBox(StorageBox(x) if isinstance(x, Buffer) else x)
        copy = pointwise_copy(box, "row-major attention operand").storage()
        assert copy is not None
        copies[key] = copy.realize(sizes.contiguous_strides(size))
    return copies[key]


def fallback(op: Any, args: Any, kwargs: Any) -> Any:
    """Call ``op`` from the wrapper because loopir has no lowering for it."""
    name = str(op)
    counters.bump("fallback_ops", name)
    log.info("no lowering for %s: calling the ATen op from the wrapper", name)
    return extern_call(op, args, kwargs, is_fallback=True)


def chosen_extern(op: Any, args: Any, kwargs: Any) -> Any:
    """Call ``op`` from the wrapper on purpose: a vendor kernel, or an op the backend
    would rather leave to ATen (its ``extern_ops``, see :mod:`kiln.loopir.traits`)."""
    counters.bump("extern_kernels", str(op))
    return extern_call(op, args, kwargs, is_fallback=False)


def _vendor_kernel(*args: Any, **kwargs: Any) -> Any:
    return chosen_extern(V.graph.current_op, args, kwargs)


register_lowering(*[op for n, ovls in VENDOR_KERNELS.items() for op in overloads(n, *ovls)])(
    _vendor_kernel
)
for _packed in ("_convolution_pointwise", "_linear_pointwise"):  # frozen programs' packed ops
    if hasattr(torch.ops.mkldnn, _packed):
        register_lowering(getattr(torch.ops.mkldnn, _packed))(_vendor_kernel)


@register_lowering(*overloads("convolution", "default"))
def _convolution(x: Any, weight: Any, bias: Any, *rest: Any) -> Any:
    """A convolution: a depthwise one as a loop of the graph where the backend asks
    (``lowered_depthwise``); else the library's, its bias added by the kernel after it
    where the backend asks (``convolution_bias_pointwise``).

    cuDNN's convolutions through ATen add a bias with a kernel of its own, one launch per
    convolution more (dozens a step in nets with squeeze-excitation blocks); as a pointwise
    add the bias joins the activation that follows, as in Inductor.
    """
    op = V.graph.current_op
    device = V.graph.device_of(V.graph.current_meta)
    traits = V.graph.backend_traits(device)
    if traits.lowered_depthwise:
        stride, padding, dilation, transposed, _, groups = rest
        with contextlib.suppress(Unlowerable):
            return depthwise_convolution(
                x, weight, bias, stride, padding, dilation, transposed, groups
            )
    if bias is None or not traits.convolution_bias_pointwise:
        return chosen_extern(op, (x, weight, bias, *rest), {})
    out = chosen_extern(op, (x, weight, None, *rest), {})
    shape = [-1] + [1] * (len(out.get_size()) - 2)  # bias over dim 1, the channels
    return LOWERINGS[aten.add.Tensor](out, LOWERINGS[aten.view.default](bias, shape))


@register_lowering(*overloads("addmm", "default"))
def _addmm(bias: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """A matrix product plus a bias; as ``mm`` and a pointwise add that joins the kernel
    reading the result, where the backend asks (``matmul_bias_pointwise``) and only pointwise
    ops read it, as Inductor does on GPUs. Otherwise the library adds the bias itself."""
    op = V.graph.current_op
    node = V.graph.current_node
    device = V.graph.device_of(V.graph.current_meta)
    if (
        beta != 1
        or alpha != 1
        or node is None
        or node.target is not op
        or not V.graph.backend_traits(device).matmul_bias_pointwise
        or not _read_pointwise(node)
    ):
        return chosen_extern(op, (bias, mat1, mat2), {"beta": beta, "alpha": alpha})
    out = chosen_extern(aten.mm.default, (mat1, mat2), {})
    return LOWERINGS[aten.add.Tensor](out, bias)


def _read_pointwise(node: torch.fx.Node) -> bool:
    """Whether every op reading ``node``'s value, through views of it, is pointwise."""
    for user in node.users:
        target = user.target
        if not isinstance(target, torch._ops.OpOverload):
            return False
        if target.is_view or target is aten._unsafe_view.default:
            if not _read_pointwise(user):
                return False
        elif torch.Tag.pointwise not in target.tags:
            return False
    return True
