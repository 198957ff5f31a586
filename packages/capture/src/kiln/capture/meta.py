"""Fake tensors: tensors with sizes, strides, dtype and device but no data.

Kiln evaluates user programs and traces ATen graphs without touching real data.
A :class:`FakeTensor` is a wrapper tensor subclass holding a tensor on the
``meta`` device, while reporting the device the real tensor would live on.
Every ATen op on fakes runs on the meta tensors (meta kernels compute output
metadata only) and the results are wrapped back with the right device.

API
---
``FakeTensor``
    The subclass. ``fake.meta`` is the meta tensor behind it; ``fake.device``,
    ``dtype``, ``shape``, ``stride()``, ``storage_offset()`` and
    ``requires_grad`` look like the real tensor's; ``untyped_storage()`` is the
    meta storage (shared exactly by aliasing fakes). Autograd works on fakes
    (``.backward()``, ``torch.autograd.grad``): it runs above the dispatcher,
    and the backward ops land on fakes again.
``FakeMode``
    A ``TorchDispatchMode``. Inside ``with FakeMode() as mode:`` factory
    functions (``torch.empty``, ``zeros``, ``rand``, ``tensor`` ...) return
    fakes, and real tensors that meet an op are turned into fakes (memoized by
    the mode, see :meth:`FakeMode.to_fake`).
``to_fake(real, mode=None)``
    The fake of a real tensor. With a mode, the same real tensor always maps to
    the same fake, and real tensors sharing a storage map to fakes whose meta
    tensors share a storage too (so views alias). Without a mode, a fresh fake.
``is_fake(t)``, ``meta_of(t)``, ``storage_key(t)``
    Type test; the meta tensor behind a fake (a meta tensor for a real one);
    a hashable key equal for two fakes exactly when their storages are shared.
``fake_like(meta, device)``
    Wrap a meta tensor as a fake reporting ``device``.
``with_history(fake)``
    A fake on the same meta tensor that has autograd history (not a leaf), for a
    real tensor that requires grad and is not a leaf.
``run_fake(func, args, kwargs, convert_real)``
    Run one ATen op on fakes (what ``FakeTensor`` and ``FakeMode`` do); for
    dispatch modes of other packages, such as autograd_aot's tracer.
``RESTRIDES``, ``restride_in_place(func, fake, *args)``
    The in-place restrides a view op expresses (``squeeze_``), which fakes mirror (ATen's
    composites apply them to their own intermediates); capture refuses them in user code.
``DataDependentOp``, ``NoMetaKernel``, ``MetadataMutation``
    Raised for ops whose output depends on data (``item``, ``nonzero``,
    ``unique``, ``tolist``, ``bool(t)`` ...), that have no meta kernel, or that
    change a fake's sizes or strides in place (``t_``, ``unsqueeze_``, an
    ``out=`` op resizing its output). All derive from
    :class:`kiln.capture.errors.Unsupported`, so capture can turn them into
    graph breaks.

Device propagation: an op's result takes the ``device=`` argument when given
(factories, ``_to_copy``); otherwise the device of its first tensor argument
that is not a CPU scalar (0-dim); otherwise CPU (or torch's default device for
factories).

Limits: fakes of CUDA tensors need a CUDA driver for autograd (the engine runs
device threads) and for factory calls naming ``device="cuda"`` (torch
initializes CUDA before dispatch); ops on CUDA fakes need neither.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.weak import WeakIdKeyDictionary

from kiln.capture import op_args
from kiln.capture.dynamo_free import spare_dynamo_import
from kiln.capture.eager_refusals import check_as_eager
from kiln.capture.errors import Unsupported
from kiln.capture.shapes import unbacked
from kiln.capture.shapes.dispatch import run_symbolic

__all__ = [
    "DataDependentOp",
    "FakeMode",
    "FakeTensor",
    "METADATA_MUTATIONS",
    "RESTRIDES",
    "MetadataMutation",
    "NoMetaKernel",
    "fake_like",
    "is_fake",
    "is_noop_restride",
    "meta_of",
    "restride_in_place",
    "run_fake",
    "storage_key",
    "to_fake",
    "with_history",
]

aten = torch.ops.aten

_CPU = torch.device("cpu")


class DataDependentOp(Unsupported):
    """An op whose result depends on tensor values, which fakes do not have."""

    def __init__(self, op: str) -> None:
        self.op = op
        super().__init__(
            "data-dependent operator",
            f"{op} needs the values of a tensor, and Kiln traces without data",
            "move the value-dependent code out of the compiled region, or compute it "
            "with tensor ops (torch.where instead of `if t:`)",
        )


class NoMetaKernel(Unsupported):
    """An op that PyTorch cannot run on the meta device."""

    def __init__(self, op: str, reason: str) -> None:
        self.op = op
        super().__init__(
            "operator without meta kernel",
            f"{op} cannot run on fake tensors: {reason}",
            "call it outside the compiled region",
        )


class MetadataMutation(Unsupported):
    """An in-place op that changes a tensor's sizes or strides (``t_``, ``resize_`` ...).

    A graph cannot say that a value changed its sizes in place, so user code doing it breaks
    the graph; on fakes, only the restrides a view op expresses (:data:`RESTRIDES`) are
    mirrored, for the composites that apply them to their own intermediates.
    """

    def __init__(self, op: str) -> None:
        self.op = op
        super().__init__(
            "in-place metadata change",
            f"{op} changes the sizes or strides of a tensor in place",
            "use the out-of-place op (x = x.t() instead of x.t_())",
        )


def _packets(*names: str) -> frozenset[Any]:
    return frozenset(getattr(aten, n) for n in names if hasattr(aten, n))


_DATA_DEPENDENT = _packets(
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "equal",
    "is_nonzero",
    "bincount",
)


def reads_tensor_data(e: BaseException) -> bool:
    """Whether ``e`` is what torch raises when a kernel reads the values of a fake or meta
    tensor (``tensor_split`` by a tensor of indices): the op is data-dependent although no
    table lists it, so the graph breaks there."""
    return isinstance(e, RuntimeError) and "data is not allocated yet" in str(e)


#: In-place ops that change a tensor's metadata rather than its values: sizes, strides,
#: storage (ATen tags each ``inplace_view``), or, for ``detach_``, its autograd history.
#: Fakes cannot mirror them and functionalization cannot turn them into value writes.
METADATA_MUTATIONS = _packets(
    "t_",
    "transpose_",
    "swapdims_",
    "swapaxes_",
    "squeeze_",
    "unsqueeze_",
    "as_strided_",
    "resize_",
    "resize_as_",
    "set_",
    "detach_",
    "rename_",  # dimension names (tagged so up to torch 2.11)
)
# detach_ leaves sizes and strides alone: a fake runs it as the real tensor does
_RESHAPING_MUTATIONS = METADATA_MUTATIONS - _packets("detach_")
#: The in-place restrides an out-of-place view op expresses (``squeeze_`` as ``squeeze``).
#: ATen's composites apply them to their own intermediates (``matmul`` of a vector squeezes
#: its ``mm``; torch.func's batching rules pass that down), so fakes mirror them
#: (:func:`restride_in_place`); capture refuses them in user code (``torch_calls``).
RESTRIDES = _packets("t_", "transpose_", "swapdims_", "swapaxes_", "squeeze_", "unsqueeze_")


def restride_in_place(func: Any, fake: FakeTensor, *args: Any, **kwargs: Any) -> FakeTensor:
    """Run the restride ``func`` on ``fake`` itself: its meta tensor, and the wrapper's own
    sizes and strides, which dispatch never reaches."""
    with torch._C._DisableTorchDispatch():
        func(fake.meta, *args, **kwargs)
        func(fake, *args, **kwargs)
    return fake


def _has_mask_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()
    )


def _is_data_dependent(func: Any, args: tuple[Any, ...]) -> bool:
    if func.overloadpacket in _DATA_DEPENDENT:
        return True
    if func.overloadpacket is aten.index and _has_mask_index(args):
        return True  # x[mask]: as many elements as the mask has True values
    # repeat_interleave(Tensor repeats) without output_size has a data-dependent length.
    return func is aten.repeat_interleave.Tensor


_MASKED_WRITES = _packets("index_put", "index_put_", "_index_put_impl_")


def _masked_write(func: Any, args: tuple[Any, ...], device: torch.device) -> Any:
    """``x[mask] = v``: the result is laid out like ``x`` whatever the mask holds, but
    the meta kernel turns the mask into indices (data-dependent), so skip it."""
    self = args[0]
    if func.overloadpacket is aten.index_put:
        with _disable_current_modes():
            meta = torch.empty_like(meta_of(self), memory_format=torch.contiguous_format)
        return FakeTensor(meta, device)
    return self


class FakeTensor(torch.Tensor):
    """A tensor with metadata only: a meta tensor reporting a real device."""

    meta: torch.Tensor
    fake_device: torch.device

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @staticmethod
    def __new__(
        cls, meta: torch.Tensor, device: torch.device, requires_grad: bool = False
    ) -> FakeTensor:
        assert meta.device.type == "meta" and type(meta) is torch.Tensor, type(meta)
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            meta.size(),
            strides=meta.stride(),
            storage_offset=meta.storage_offset(),
            dtype=meta.dtype,
            layout=meta.layout,
            device=device,
            requires_grad=requires_grad,
        )
        out.meta = meta
        out.fake_device = device
        _copy_lazy_bits(meta, out)
        return out  # type: ignore[no-any-return]

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        rg = ", requires_grad=True" if self.requires_grad else ""
        return f"FakeTensor(size={tuple(self.shape)}, dtype={self.dtype}, device={self.fake_device}{rg})"

    def untyped_storage(self) -> torch.UntypedStorage:
        """The meta storage behind the fake: shared exactly by fakes that alias."""
        return self.meta.untyped_storage()

    def __deepcopy__(self, memo: dict[int, Any]) -> FakeTensor:
        if id(self) not in memo:
            with _disable_current_modes():
                meta = torch.empty_strided(
                    self.meta.size(), self.meta.stride(), dtype=self.dtype, device="meta"
                )
            _copy_lazy_bits(self.meta, meta)
            memo[id(self)] = FakeTensor(meta, self.fake_device, self.requires_grad)
        return memo[id(self)]  # type: ignore[no-any-return]

    def tolist(self) -> Any:
        raise DataDependentOp("Tensor.tolist()")

    def numpy(self, *, force: bool = False) -> Any:
        raise DataDependentOp("Tensor.numpy()")

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return run_fake(func, args, kwargs or {}, _plain_meta)


def is_fake(t: object) -> bool:
    """True for Kiln's fake tensors."""
    return isinstance(t, FakeTensor)


def fake_like(meta: torch.Tensor, device: torch.device | str) -> FakeTensor:
    """Wrap ``meta`` as a fake that reports ``device``."""
    return FakeTensor(meta, _normalize(torch.device(device)))


class _History(torch.autograd.Function):
    """Identity whose output is a new fake on the input's meta tensor: not a leaf, not a view.

    Fakes of real tensors are made as leaves; an in-place op on a leaf that requires grad
    raises (autograd's check), where on a real non-leaf input it is allowed.
    """

    @staticmethod
    def forward(ctx: Any, x: FakeTensor) -> FakeTensor:
        return FakeTensor(x.meta, x.fake_device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def with_history(fake: FakeTensor) -> FakeTensor:
    """``fake`` as the fake of a non-leaf tensor that requires grad (same meta, so it aliases)."""
    with torch.enable_grad():
        out = _History.apply(fake.detach().requires_grad_(True))
    assert isinstance(out, FakeTensor) and out.grad_fn is not None
    return out


def meta_of(t: torch.Tensor) -> torch.Tensor:
    """The meta tensor behind a fake, or a fresh meta copy of a real tensor's metadata."""
    if isinstance(t, FakeTensor):
        return t.meta
    return _plain_meta(t)


def storage_key(t: torch.Tensor) -> int:
    """A key shared by exactly the tensors (fake or real) that share a storage."""
    base = t.meta if isinstance(t, FakeTensor) else t
    return int(base.untyped_storage()._cdata)


def _copy_lazy_bits(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Give ``dst`` the lazy conjugate and negative bits of ``src``.

    Composite ops read the bits (``imag`` of a conjugate is a negated view of the storage's
    imaginary part, ``resolve_conj`` copies only when set), and ATen's own handling of the
    bits runs above dispatch modes, so a graph traced on fakes with the bits holds ops that
    resolve them at run time on the real tensors, which have the same bits (guards check).
    """
    if src.is_conj():
        torch._C._set_conj(dst, True)
    if src.is_neg():
        torch._C._set_neg(dst, True)


def _plain_meta(real: torch.Tensor) -> torch.Tensor:
    with _disable_current_modes():
        meta = torch.empty_strided(
            real.size(), real.stride(), dtype=real.dtype, device="meta"
        ).as_strided(real.size(), real.stride(), real.storage_offset())
    _copy_lazy_bits(real, meta)
    return meta


def _storage_elems(real: torch.Tensor) -> int:
    return int(real.untyped_storage().nbytes()) // max(real.element_size(), 1)


def _meta_on_storage(base: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """A meta view of ``base`` (a meta byte buffer) laid out like ``real``."""
    typed = base if real.dtype == torch.uint8 else base.view(real.dtype)
    meta = typed.as_strided(real.size(), real.stride(), real.storage_offset())
    _copy_lazy_bits(real, meta)
    return meta


def to_fake(real: torch.Tensor, mode: FakeMode | None = None) -> FakeTensor:
    """The fake of a real tensor; memoized by ``mode`` when one is given."""
    if isinstance(real, FakeTensor):
        return real
    if mode is not None:
        return mode.to_fake(real)
    return FakeTensor(_plain_meta(real), real.device, requires_grad=real.requires_grad)


@functools.cache
def _device_position(func: Any) -> int | None:
    """Where ``func`` takes its device positionally (``prims.device_put(a, device)``), if it does."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == "device" and not a.kwarg_only:
            return i
    return None


def _result_device(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    at = _device_position(func)
    device = args[at] if at is not None and at < len(args) else kwargs.get("device")
    if device is not None:
        return _normalize(torch.device(device))
    cpu_scalar = meta = None
    for a in op_args.leaves((args, kwargs)):
        if not isinstance(a, torch.Tensor):
            continue
        dev = a.fake_device if isinstance(a, FakeTensor) else a.device
        if dev.type == "meta":
            meta = dev
            continue
        if dev.type == "cpu" and a.dim() == 0:
            cpu_scalar = dev
            continue
        return _normalize(dev)
    # only tensors on the meta device (the user's, or made there): the result is too
    if meta is not None:
        return meta
    if cpu_scalar is not None:
        return cpu_scalar
    return _normalize(torch.get_default_device()) if _is_factory(func) else _CPU


def _normalize(device: torch.device) -> torch.device:
    """``cuda`` means the current device, which real tensors report as ``cuda:0`` and up."""
    if device.type in ("cpu", "meta") or device.index is not None:
        return device
    index = (
        torch.cuda.current_device() if device.type == "cuda" and torch.cuda.is_available() else 0
    )
    return torch.device(device.type, index)


@functools.cache  # per op: reading its schema's arguments builds them anew each time
def _is_factory(func: Any) -> bool:
    return any(a.name == "device" and a.kwarg_only for a in func._schema.arguments)


def is_noop_restride(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """An ``as_strided_`` that changes nothing but the strides of size-1 dims: a no-op.

    ATen's ``adaptive_avg_pool2d`` to 1x1 of a channels-last input takes the mean and
    marks the ``(N, C, 1, 1)`` result channels-last this way (ConvNeXt's head).
    """
    if func.overloadpacket is not aten.as_strided_ or len(args) < 3:
        return False
    t, size, stride = args[0], args[1], args[2]
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    return (
        isinstance(t, torch.Tensor)
        and tuple(size) == tuple(t.shape)
        and (offset is None or offset == t.storage_offset())
        and all(n == 1 or a == b for n, a, b in zip(size, stride, t.stride(), strict=True))
    )


def run_fake(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    convert_real: Callable[[torch.Tensor], torch.Tensor],
) -> Any:
    """Run ``func`` on the meta tensors behind its arguments; wrap the results as fakes.

    ``convert_real`` gives the meta tensor for a real (non-fake) tensor argument.
    Results that are an argument's meta tensor (in-place and ``out=`` ops)
    come back as that very argument.
    """
    data_dependent = _is_data_dependent(func, args)
    if data_dependent and not unbacked.permits(func):
        raise DataDependentOp(str(func))
    if func.overloadpacket in _RESHAPING_MUTATIONS:
        if is_noop_restride(func, args, kwargs):
            return args[0]
        if func.overloadpacket in RESTRIDES and isinstance(args[0], FakeTensor):
            return restride_in_place(func, *args, **kwargs)
        raise MetadataMutation(str(func))
    device = _result_device(func, args, kwargs)
    if func.overloadpacket in _MASKED_WRITES and _has_mask_index(args):
        return _masked_write(func, args, device)
    check_as_eager(func, args, kwargs)
    by_meta: dict[int, FakeTensor] = {}

    def unwrap(a: Any) -> Any:
        if isinstance(a, FakeTensor):
            by_meta[id(a.meta)] = a
            return a.meta
        if isinstance(a, torch.Tensor):
            return a if a.device.type == "meta" else convert_real(a)
        return a

    meta_args, meta_kwargs = op_args.map_leaves(unwrap, (args, kwargs))
    if _is_factory(func) or meta_kwargs.get("device") is not None:
        meta_kwargs["device"] = torch.device("meta")
    at = _device_position(func)
    if at is not None and at < len(meta_args) and meta_args[at] is not None:
        meta_args = (*meta_args[:at], torch.device("meta"), *meta_args[at + 1 :])
    try:
        with _disable_current_modes():
            if data_dependent:  # permitted: its data-dependent values are unbacked symbols
                out = unbacked.run_data_dependent(func, meta_args, meta_kwargs)
                if out is NotImplemented:
                    raise DataDependentOp(str(func))
            else:
                # symbolic sizes run through decompositions: a C++ kernel would specialize
                out = run_symbolic(func, meta_args, meta_kwargs)
    except NotImplementedError as e:
        raise NoMetaKernel(str(func), str(e).splitlines()[0] if str(e) else "") from e
    except RuntimeError as e:
        if reads_tensor_data(e):
            raise DataDependentOp(str(func)) from e
        raise

    for fake in by_meta.values():
        if not _same_layout(fake.meta, fake):
            raise MetadataMutation(f"{func} (resizing its output)")

    def wrap(r: Any) -> Any:
        if isinstance(r, torch.Tensor) and r.device.type == "meta":
            if device.type == "meta":
                return r
            same = by_meta.get(id(r))
            return same if same is not None else FakeTensor(r, device)
        return r

    return op_args.map_leaves(wrap, out)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` have the same sizes and strides, compared without asking a
    shape environment: symbolic sizes are the same when they are the same expression."""
    return len(a.shape) == len(b.shape) and all(
        _same_size(x, y)
        for x, y in zip((*a.shape, *a.stride()), (*b.shape, *b.stride()), strict=True)
    )


def _same_size(x: Any, y: Any) -> bool:
    if isinstance(x, torch.SymInt) or isinstance(y, torch.SymInt):
        ex = x.node.expr if isinstance(x, torch.SymInt) else x
        ey = y.node.expr if isinstance(y, torch.SymInt) else y
        return bool(ex == ey)
    return bool(x == y)


class FakeMode(TorchDispatchMode):
    """Inside this mode, factories make fakes and real tensors meeting an op become fakes."""

    def __init__(self) -> None:
        super().__init__()
        spare_dynamo_import()  # fakes run torch's Python meta kernels
        self._fakes: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # storage key -> (meta byte buffer, weak refs to the real tensors using it)
        self._storages: dict[int, tuple[torch.Tensor, list[weakref.ref[torch.Tensor]]]] = {}

    def to_fake(self, real: torch.Tensor) -> FakeTensor:
        """The fake of ``real``: the same fake every time; views of one storage alias."""
        if isinstance(real, FakeTensor):
            return real
        found = self._fakes.get(real)
        if found is not None:
            return found  # type: ignore[no-any-return]
        with _disable_current_modes():
            meta = self._meta_for(real)
        fake = FakeTensor(meta, real.device, requires_grad=real.requires_grad)
        self._fakes[real] = fake
        return fake

    def _meta_for(self, real: torch.Tensor) -> torch.Tensor:
        if real.is_sparse or real.layout != torch.strided:
            raise NoMetaKernel("to_fake", f"layout {real.layout} is not supported")
        key = int(real.untyped_storage()._cdata)
        entry = self._storages.get(key)
        if entry is not None and any(r() is not None for r in entry[1]):
            base, refs = entry
            if base.numel() < real.untyped_storage().nbytes():
                entry = None
        else:
            entry = None
        if entry is None:
            nbytes = int(real.untyped_storage().nbytes())
            base = torch.empty(nbytes, dtype=torch.uint8, device="meta")
            refs = []
            self._storages[key] = (base, refs)
        refs.append(weakref.ref(real))
        if real.element_size() > 1 and base.numel() % real.element_size():
            return _plain_meta(real)
        return _meta_on_storage(base, real)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return run_fake(func, args, kwargs or {}, lambda r: self.to_fake(r).meta)
