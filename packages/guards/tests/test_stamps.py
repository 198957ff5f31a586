"""What moves the module stamp."""

from __future__ import annotations

import pytest
import torch

from kiln.guards import stamps


def moves(action) -> bool:
    stamps.install()
    before = stamps.current()
    action()
    return stamps.current() != before


def test_module_changes_move_the_stamp():
    m = torch.nn.Linear(2, 2)
    stamps.watch(m)
    assert moves(lambda: setattr(m, "foo", 1))
    assert moves(lambda: delattr(m, "foo"))
    assert moves(m.eval)
    assert moves(lambda: m.register_buffer("b", torch.ones(1)))
    assert moves(lambda: m.register_parameter("p", torch.nn.Parameter(torch.ones(1))))
    assert moves(lambda: m.add_module("child", torch.nn.ReLU()))
    assert moves(m.double)
    assert moves(lambda: m.requires_grad_(False))
    handle = None

    def register():
        nonlocal handle
        handle = m.register_forward_pre_hook(lambda *a: None)

    assert moves(register)
    assert moves(handle.remove)
    assert moves(lambda: m.register_full_backward_hook(lambda *a: None))
    assert moves(lambda: setattr(m, "__class__", torch.nn.Linear))


def test_changes_to_unwatched_modules_do_not_move_it():
    m = torch.nn.Linear(2, 2)
    assert not stamps.watched(m)
    assert not moves(lambda: setattr(m, "foo", 1))
    assert not moves(lambda: delattr(m, "foo"))
    assert not moves(m.eval)
    assert not moves(lambda: m.register_buffer("b", torch.ones(1)))
    assert not moves(lambda: m.add_module("child", torch.nn.ReLU()))
    assert not moves(m.double)
    assert not moves(lambda: m.requires_grad_(False))
    assert not moves(lambda: m.register_forward_pre_hook(lambda *a: None).remove())
    assert not moves(lambda: setattr(m.weight, "data", torch.randn(3, 3)))
    other = torch.nn.Linear(2, 2)
    params = {"weight": torch.randn(2, 2)}
    assert not moves(lambda: torch.func.functional_call(other, params, (torch.randn(1, 2),)))
    assert not moves(lambda: m.weight.untyped_storage().resize_(0))


def test_patches_leave_plain_tensors_alone():
    stamps.install()
    base = vars(torch._C.TensorBase)
    for name in ("data", "requires_grad", "set_", "resize_", "t_", "requires_grad_"):
        assert getattr(torch.Tensor, name) is base[name]  # torch's own, at C speed
        assert getattr(torch.nn.Parameter, name) is not base[name]
    assert stamps.tracks_metadata(torch.nn.Parameter(torch.ones(1)))
    assert not stamps.tracks_metadata(torch.ones(1))

    class Overrides(torch.nn.Parameter):
        def t_(self):  # its own in-place method: the stamp cannot see through it
            return self

    assert not stamps.tracks_metadata(Overrides(torch.ones(1)))


def test_functional_call_moves_it():
    m = torch.nn.Linear(2, 2)
    stamps.watch(m)
    seen = []
    m.register_forward_pre_hook(lambda *a: seen.append(stamps.current()))
    before = stamps.current()
    params = {"weight": torch.randn(2, 2), "bias": torch.randn(2)}
    torch.func.functional_call(m, params, (torch.randn(1, 2),))
    assert seen[0] != before  # moved before forward ran with the swapped-in tensors
    assert stamps.current() != seen[0]  # and again when the originals came back


def test_reads_and_in_place_math_do_not_move_it():
    m = torch.nn.Linear(2, 2)
    x = torch.randn(3, 2)
    assert not moves(lambda: m(x))
    assert not moves(lambda: m.weight.data.add_(1))
    assert not moves(lambda: m.training)


def test_install_is_idempotent():
    stamps.install()
    setattr_fn = torch.nn.Module.__setattr__
    stamps.install()
    assert torch.nn.Module.__setattr__ is setattr_fn
    assert stamps.installed()


def test_writes_into_watched_module_dicts_move_it():
    m = torch.nn.Linear(2, 2)
    stamps.install()
    assert not stamps.watched(m)
    assert stamps.watch(m) is True
    assert stamps.watched(m) and stamps.watched(m.weight) and stamps.watched(m.bias)
    assert moves(lambda: m.__dict__.__setitem__("alpha", 4.0))
    assert moves(lambda: m.__dict__.update(alpha=5.0))
    assert moves(lambda: m.__dict__.pop("alpha"))
    assert moves(lambda: m._parameters.__setitem__("bias", torch.nn.Parameter(torch.ones(2))))
    assert moves(lambda: m._buffers.setdefault("b", torch.ones(1)))
    assert moves(lambda: m._buffers.__delitem__("b"))
    assert moves(lambda: m._modules.__setitem__("c", torch.nn.ReLU()))
    assert not moves(lambda: (m.__dict__["training"], m._parameters["weight"], dict(m._modules)))


def test_watched_dicts_pickle_and_copy_as_plain_dicts():
    import collections
    import copy
    import pickle

    m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    stamps.install()
    stamps.watch(m)
    assert type(m[0]._forward_hooks) is stamps.WatchedHooks
    for other in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert type(other.__dict__) is dict
        assert type(other[0]._parameters) is dict
        assert type(other[0]._forward_hooks) is collections.OrderedDict
    assert type(copy.copy(m).__dict__) is dict  # (shallow: its submodules are m's)


def test_metadata_changes_of_watched_parameters_move_it():
    m = torch.nn.Linear(4, 4)
    stamps.watch(m)
    w = m.weight
    assert moves(lambda: setattr(w, "data", torch.randn(4, 4).t()))
    assert moves(lambda: setattr(w, "requires_grad", False))
    assert moves(lambda: w.requires_grad_(True))
    with torch.no_grad():
        assert moves(w.t_)
        assert moves(lambda: w.as_strided_((4, 4), (1, 4)))
        assert moves(lambda: w.transpose_(0, 1))
        assert moves(lambda: w.set_(torch.randn(16).view(4, 4)))
    assert moves(lambda: w.untyped_storage().resize_(128))
    with pytest.raises(RuntimeError, match="weakref"):  # torch refuses: no swap to see
        torch.utils.swap_tensors(w, torch.nn.Parameter(torch.randn(4, 4)))
    assert not moves(lambda: w.data.add_(1.0))  # values only: the graph still fits
    assert w.data.shape == (4, 4) and w.requires_grad  # reads are torch's own


def untracked_after(m, change):
    """Whether a tree's record of its untracked tensors tells ``change`` apart."""
    record = stamps.Untracked()
    stamps.watch(m, record)
    assert record.unchanged()
    change()
    return not record.unchanged()


def test_metadata_changes_of_buffers_show_in_the_untracked_record():
    def fresh():
        m = torch.nn.Linear(4, 4)
        m.register_buffer("buf", torch.randn(4))
        return m, m.buf

    m, buf = fresh()
    assert not untracked_after(m, lambda: buf.add_(1.0))  # values only
    assert not untracked_after(m, lambda: m.weight.requires_grad_(False))  # the stamp's part
    changes = [
        lambda b: b.set_(torch.randn(8)[::2]),
        lambda b: b.resize_(2),
        lambda b: b.unsqueeze_(0),
        lambda b: setattr(b, "data", torch.randn(4)),  # another storage, same sizes
        lambda b: setattr(b, "data", torch.randn(4, dtype=torch.float64)),
        lambda b: b.requires_grad_(),
    ]
    for change in changes:
        m, buf = fresh()
        assert untracked_after(m, lambda change=change, buf=buf: change(buf))
    m, buf = fresh()
    stamps.watch(m)
    assert moves(lambda: buf.untyped_storage().resize_(64))  # a watched tensor's storage


def test_a_plain_tensor_in_parameters_is_untracked():
    m = torch.nn.Linear(2, 2)
    plain = torch.randn(2)
    m._parameters["bias"] = plain  # as functional_call does for its call
    assert untracked_after(m, lambda: setattr(plain, "requires_grad", True))


def test_other_tensors_do_not_move_it():
    stamps.install()
    x = torch.nn.Parameter(torch.randn(2, 3))
    assert not moves(lambda: x.requires_grad_())
    assert not moves(lambda: setattr(x, "requires_grad", False))
    assert not moves(x.t_)
    assert not moves(lambda: setattr(x, "data", torch.randn(5)))
    with torch.no_grad():
        assert not moves(lambda: x.resize_(7))


def test_modules_added_later_are_watched_when_their_group_passes():
    from kiln import guards
    from kiln.capture.guard_data import GuardKind, GuardSpec
    from kiln.capture.source import LocalSource

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))

    def forward(self):
        return self

    root = LocalSource("self")
    specs = [
        GuardSpec(root, GuardKind.MODULE_MATCH, id(model)),
        GuardSpec(root.attr("training"), GuardKind.BOOL, True),
        GuardSpec(root, GuardKind.MODULE_TREE, model),
    ]
    check = guards.build_check(specs, forward)
    assert stamps.watched(model) and stamps.watched(model[0])
    model.append(torch.nn.Linear(2, 2))  # registered through add_module: moves the stamp
    assert not stamps.watched(model[1])
    assert check(model)
    assert stamps.watched(model[1]) and stamps.watched(model[1].weight)


def test_a_watched_dict_passes_a_dict_type_guard():
    from kiln import guards
    from kiln.capture.guard_data import GuardKind, GuardSpec
    from kiln.capture.source import LocalSource

    def f(d):
        return d

    check = guards.build_check([GuardSpec(LocalSource("d"), GuardKind.TYPE_MATCH, dict)], f)
    assert check({}) and check(stamps.WatchedDict()) and not check([])
    assert check.failure_reason(stamps.WatchedDict()) is None
    assert "type changed" in check.failure_reason([])


def test_a_storage_resize_is_seen_after_the_parameter_moved_to_that_storage():
    m = torch.nn.Linear(4, 4)
    stamps.watch(m)
    w = m.weight
    kept = [w.untyped_storage()]  # the first storage stays alive: no address is reused
    with torch.no_grad():
        assert moves(lambda: w.set_(torch.randn(16).view(4, 4)))
    kept.append(w.untyped_storage())
    assert moves(lambda: w.untyped_storage().resize_(128))
    assert moves(lambda: setattr(w, "data", torch.randn(4, 4)))
    assert moves(lambda: w.untyped_storage().resize_(128))
    assert not moves(lambda: kept[1].resize_(256))  # no longer the parameter's storage


def test_a_tree_is_walked_as_modules_walks_it():
    shared = torch.nn.Linear(2, 2)
    root = torch.nn.Sequential(
        shared, torch.nn.Sequential(shared, torch.nn.ReLU()), torch.nn.ModuleList([shared])
    )
    root.register_module("empty", None)
    assert {id(m) for m in stamps._tree(root)} == {id(m) for m in root.modules()}
    assert len(stamps._tree(root)) == len(list(root.modules()))


class _Wrapper(torch.Tensor):
    """A wrapper subclass without storage of its own, as DTensor is."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype)

    def __init__(self, elem):
        self.elem = elem

    def __tensor_flatten__(self):
        return ["elem"], None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


def test_a_wrapper_subclass_buffer_is_unchanged_until_its_inner_tensor_changes():
    m = torch.nn.Module()
    m.register_buffer("w", _Wrapper(torch.randn(4)))
    record = stamps.Untracked()
    stamps.watch(m, record)
    assert record.entries and record.unchanged() and record.unchanged()
    m.w.elem = torch.randn(4)  # another inner storage
    assert not record.unchanged()
    stamps.watch(m, record)
    assert record.unchanged()
    m.w.elem = torch.randn(8)[::2]  # other inner strides
    assert not record.unchanged()


def moves_structure(action) -> bool:
    """Whether ``action`` moves the stamp for more than tensors (``stamps.structure``)."""
    stamps.install()
    before = stamps.structure[0]
    action()
    return stamps.structure[0] != before


def test_a_parameter_swapped_for_a_tensor_moves_the_stamp_for_tensors_only():
    m = torch.nn.Linear(2, 2)
    stamps.watch(m)
    assert type(m._parameters) is stamps.WatchedParameters
    other = torch.nn.Parameter(torch.randn(2, 2))
    swap = lambda: m._parameters.__setitem__("weight", other)  # noqa: E731  (FSDP's swap)
    assert moves(swap) and not moves_structure(swap)
    resize = lambda: m.bias.untyped_storage().resize_(64)  # noqa: E731
    assert moves(resize) and not moves_structure(resize)
    # everything else moves it whole: a new name, None, a deletion, setattr, metadata
    assert moves_structure(lambda: m._parameters.__setitem__("extra", other))
    assert moves_structure(lambda: m._parameters.__setitem__("extra", None))
    assert moves_structure(lambda: m._parameters.__setitem__("extra", other))
    assert moves_structure(lambda: m._parameters.pop("extra"))
    assert moves_structure(lambda: setattr(m, "weight", torch.nn.Parameter(torch.randn(2, 2))))
    stamps.watch(m)  # the new weight too
    assert moves_structure(lambda: m.weight.requires_grad_(False))
    assert moves_structure(lambda: m._buffers.__setitem__("b", torch.ones(1)))
    assert moves_structure(lambda: m._buffers.__setitem__("b", torch.ones(2)))
