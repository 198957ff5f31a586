"""What a backend tells loopir about its device, in one typed object.

Lowering and the torch-level rewrites choose between equivalent programs by what runs fast
on the device a backend generates code for: a ``cat`` as one masked loop or one copy per
input, a reduction in one step or two, a convolution's layout and bias. Each such choice is
a field here, with the default that suits a device nothing is known about; a backend sets
the ones that differ in the :class:`BackendTraits` its ``traits`` attribute returns, and
loopir reads ``backend.traits.<field>``. A new trait is one new field (see the README's
"Backend traits").
"""

from __future__ import annotations

import dataclasses

__all__ = ["BackendTraits"]


@dataclasses.dataclass(frozen=True)
class BackendTraits:
    """The device-dependent choices loopir leaves to a backend; defaults suit any device."""

    pointwise_cat: bool = True
    """True: a ``cat`` is one pointwise loop over the result, loading each input under a mask.
    False: each input is stored into its window of the result, for devices where a masked
    load costs as much as a load (C++ vector lanes compute every lane of a masked load)."""

    extern_ops: frozenset[str] = frozenset()
    """ATen op names (overload packets, e.g. ``"max_pool2d_with_indices_backward"``) that run
    as ATen calls rather than through loopir's lowerings on this backend's device."""

    reduction_split_rows: int = 0
    """Reductions with fewer rows than a quarter of this are cut into pieces and reduced in
    two steps, so that about this many rows run at once (a GPU runs one program per row).
    0: never cut."""

    depthwise_nhwc: bool = False
    """Give a depthwise convolution's backward its activations in NHWC in every graph (copied
    where they are not), for a library that runs depthwise convolutions fast only in NHWC."""

    broadcast_store_ops: int = 0
    """Store a small computed value before a loop broadcasts it over at least
    ``BROADCAST_STORE_FACTOR`` times as many elements, when one element of it costs more than
    this many ops (loads and math): batch norm's ``1 / sqrt(var + eps)`` over an image is then
    computed once per channel, not at every pixel. 0: never, every broadcast value is inlined
    (a GPU has arithmetic to spare in memory-bound loops, and each stored value is one launch
    more)."""

    lowered_depthwise: bool = True
    """Compute a depthwise convolution whose window unrolls as a loop of the graph, fused with
    the ops around it like a pooling, rather than as a library call. False for a library
    that beats that loop (oneDNN on a CPU). cuDNN compiles its NHWC depthwise kernels at run
    time, 0.1 to 0.25 s per shape in each process, and the fused loop saves a pass over the
    convolution's result."""

    convolution_weight_nhwc: bool = False
    """Give the convolutions of a channels-last graph their weights channels-last too, copied
    by a kernel of the graph, for a library that would copy them itself on every call."""

    convolution_bias_pointwise: bool = False
    """Leave a convolution's bias to the kernel after it (a pointwise add that fuses with what
    follows) rather than to the library, which would add it with a launch of its own."""

    matmul_bias_pointwise: bool = False
    """Compute an ``addmm`` whose result only pointwise ops read (through views) as a matrix
    product and leave its bias to the kernel after it, where the add fuses, rather than to
    the library's product with a bias epilogue (cuBLASLt's, which picks slower kernels than
    cuBLAS's plain product for several shapes: long reductions, few rows, bfloat16)."""

    matmul_align_bytes: int = 0
    """Large matrix products whose output rows are not whole units of this many bytes are
    computed on a zero-padded width (:func:`~kiln.loopir.pad_matmuls`), for a library whose
    fast kernels want aligned rows. 0: never pad."""
