"""MODULE_TREE: guards under a module are checked by the module stamp, in O(1) while nothing changed.

The guards here are what capture records when it inlines a module's forward:
identities of modules and parameters, parameter metadata, training flags, hooks
and the constant attributes it reads.
"""

from __future__ import annotations

import pytest
import torch

from kiln import guards
from kiln.capture import capture
from kiln.capture.guard_data import GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import LocalSource
from kiln.guards import module_tree, stamps


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.eps = 1e-5
        self.sizes = [4, 4]

    def forward(self, x):
        return self.norm(torch.relu(self.fc(x)) + self.eps)


class Net(torch.nn.Module):
    def __init__(self, depth=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
        self.register_buffer("offset", torch.zeros(4))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x + self.offset


def capture_like_guards(source, module, plain_contents=True, dicts=False, ids=True):
    """What capture records while inlining ``module``'s forward (modules, tensors, constants).

    ``dicts``: module state read the way capture's sources read it, through the module's own
    dicts (``L['self']._modules['blocks']._modules['0']._parameters['weight']``); otherwise
    as attributes and container items (``L['self'].blocks[0].weight``).
    """
    out = [
        GuardSpec(source, GuardKind.MODULE_MATCH, id(module)),
        GuardSpec(source.attr("training"), GuardKind.BOOL, module.training),
        GuardSpec(source, GuardKind.HOOKS_EMPTY),
    ]
    for store in ("_parameters", "_buffers"):
        for name, t in getattr(module, store).items():
            at = source.attr(store).item(name) if dicts else source.attr(name)
            out.append(GuardSpec(at, GuardKind.TENSOR_MATCH, TensorMeta.of(t)))
            if ids:  # (capture's own guards on module state do not pin tensors' identity)
                out.append(GuardSpec(at, GuardKind.ID_MATCH, id(t)))
    for name, value in vars(module).items():
        if isinstance(value, float):
            out.append(GuardSpec(source.attr(name), GuardKind.EQUALS, value))
        if plain_contents and isinstance(value, list):  # contents of a plain list: not protected
            out.append(GuardSpec(source.attr(name), GuardKind.SEQUENCE_LENGTH, len(value)))
    for name, child in module._modules.items():
        if dicts:
            child_source = source.attr("_modules").item(name)
        else:
            child_source = source.item(int(name)) if name.isdigit() else source.attr(name)
        out += capture_like_guards(child_source, child, plain_contents, dicts, ids)
    return out


SELF = LocalSource("self")


def tree_check(model, with_tree=True, plain_contents=True, dicts=False, ids=True):
    specs = capture_like_guards(SELF, model, plain_contents, dicts, ids)
    if with_tree:
        specs.append(GuardSpec(SELF, GuardKind.MODULE_TREE, model))
    specs.append(GuardSpec(LocalSource("x"), GuardKind.IS_NONE))
    return guards.build_check(specs, Net.forward)


def passes(check, model):
    assert check.failure_reason(model, None) is None
    assert check(model, None)


def changed(check, model, part):
    reason = check.failure_reason(model, None)
    assert check(model, None) is False, reason
    assert reason is not None and part in reason, reason


def test_protected_guards_move_into_the_group():
    model = Net()
    check = tree_check(model)
    main, _, group = check.source.partition("# guards protected by the module stamp")
    # the stamp, then what it cannot follow (global hooks, buffers' metadata), then the group
    assert "___stamp[0] == ___seen[0] and not (___global_hooks" in main
    assert "___untracked.unchanged()) or ___group0(self)" in main
    assert "fc" not in main and "training" not in main  # all behind the stamp test
    assert "fc" in group and "training" in group
    # the contents of plain lists are not stamp-protected: checked on every call
    assert main.count("len(") == 3 and "len(" not in group


def test_in_place_parameter_update_passes_replacement_fails():
    model = Net()
    check = tree_check(model)
    with torch.no_grad():
        model.blocks[1].fc.weight.mul_(2.0)
    model.offset.add_(1.0)
    passes(check, model)
    model.blocks[1].fc.weight = torch.nn.Parameter(torch.randn(4, 4))
    changed(check, model, "L['self'].blocks[1].fc.weight is a different object")


def test_eval_and_submodule_training():
    model = Net()
    check = tree_check(model)
    passes(check, model)
    model.eval()
    changed(check, model, "L['self'].training changed: expected True, got False")
    model.train()
    passes(check, model)
    model.blocks[2].norm.eval()
    changed(check, model, "L['self'].blocks[2].norm.training changed: expected True, got False")


def test_attributes_and_plain_contents():
    model = Net()
    check = tree_check(model)
    model.blocks[0].eps = 1e-3
    changed(check, model, "L['self'].blocks[0].eps changed: expected 1e-05, got 0.001")
    model.blocks[0].eps = 1e-5
    passes(check, model)
    model.blocks[0].sizes.append(4)  # no stamp move: checked outside the group
    changed(check, model, "len(L['self'].blocks[0].sizes) changed: expected 2, got 3")
    model.blocks[0].sizes.pop()
    model.blocks[0].unused = 1  # an attribute no guard reads: still valid
    passes(check, model)


def test_structure_dtype_requires_grad_hooks():
    model = Net()
    check = tree_check(model)
    model.blocks[1] = Block()
    changed(check, model, "L['self'].blocks[1] is a different module")
    model = Net()
    check = tree_check(model)
    model.blocks[0].half()
    changed(check, model, "tensor L['self'].blocks[0].fc.weight dtype mismatch")
    model = Net()
    check = tree_check(model)
    model.blocks[0].requires_grad_(False)
    changed(check, model, "requires_grad mismatch")
    model.blocks[0].requires_grad_(True)
    passes(check, model)
    handle = model.blocks[1].fc.register_forward_hook(lambda *a: None)
    changed(check, model, "L['self'].blocks[1].fc has forward hooks now")
    handle.remove()
    passes(check, model)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda *a: None)
    try:
        changed(check, model, "global module hooks")
    finally:
        handle.remove()
    passes(check, model)
    assert not check(Net(), None)  # another instance of the same class


def test_direct_param_flag_is_seen():
    model = Net()
    check = tree_check(model)
    passes(check, model)
    model.blocks[0].fc.weight.requires_grad = False
    changed(check, model, "requires_grad mismatch")
    model.blocks[0].fc.weight.requires_grad_(True)
    passes(check, model)


def test_changes_below_python_need_the_escape_hatch():
    model = Net()
    check = tree_check(model)
    passes(check, model)
    weight = model.blocks[0].fc.weight
    torch._C.TensorBase.requires_grad.__set__(weight, False)  # C-level: invisible (documented)
    assert check(model, None)
    guards.config.trust_module_stamps = False
    changed(check, model, "requires_grad mismatch")
    torch._C.TensorBase.requires_grad.__set__(weight, True)
    passes(check, model)
    stamps.bump()
    torch._C.TensorBase.requires_grad.__set__(weight, False)
    guards.config.trust_module_stamps = True
    changed(check, model, "requires_grad mismatch")  # re-trusting re-checks once


def test_reach_follows_module_state_only():
    model = Net()
    model.blocks[0].cfg = object()
    root = model

    def reach(*steps):
        found = module_tree.reach(root, list(steps))
        return found and found[0]

    assert reach(("attr", "blocks"), ("item", 0), ("attr", "fc")) == "module"
    assert reach(("attr", "blocks"), ("item", 0), ("attr", "fc"), ("attr", "weight")) == "tensor"
    assert reach(("attr", "offset")) == "tensor"
    assert reach(("attr", "training")) == "value"
    assert reach(("attr", "blocks"), ("item", 0), ("attr", "eps")) == "value"
    assert reach(("attr", "blocks"), ("item", 0), ("attr", "cfg")) == "object"
    assert reach(("attr", "blocks"), ("item", 0), ("attr", "sizes"), ("item", 0)) is None
    assert reach(("attr", "forward")) is None  # a method: class state
    assert reach(("attr", "blocks"), ("item", slice(0, 2))) is None  # a new ModuleList


def test_reach_through_the_module_dicts():
    """Capture's sources read module state from ``_parameters``/``_buffers``/``_modules``."""
    model = Net()
    model.blocks[0].fc.register_parameter("gone", None)

    def reach(*steps):
        found = module_tree.reach(model, list(steps))
        return found and found[0]

    block0 = (("attr", "_modules"), ("item", "blocks"), ("attr", "_modules"), ("item", "0"))
    fc = (*block0, ("attr", "_modules"), ("item", "fc"))
    assert reach(*block0) == "module"
    assert reach(*fc, ("attr", "_parameters"), ("item", "weight")) == "tensor"
    assert reach(("attr", "_buffers"), ("item", "offset")) == "tensor"
    assert reach(*fc, ("attr", "_parameters"), ("item", "gone")) == "value"  # an empty slot
    assert reach(*block0, ("attr", "eps")) == "value"
    assert reach(*fc, ("attr", "_parameters")) is None  # the dict itself: its contents can change
    assert reach(*fc, ("attr", "_parameters"), ("item", "missing")) is None
    assert reach(("attr", "_buffers"), ("item", "blocks")) is None  # not in that dict
    assert reach(("attr", "_modules"), ("attr", "blocks")) is None


def test_dict_sources_join_the_group_and_stay_sound():
    model = Net()
    check = tree_check(model, dicts=True)
    main = check.source.partition("# guards protected by the module stamp")[0]
    assert "_parameters" not in main and "_modules" not in main  # all behind the stamp test
    passes(check, model)
    fc1 = "L['self']._modules['blocks']._modules['1']._modules['fc']"
    with torch.no_grad():
        model.blocks[1].fc.weight.mul_(2.0)  # in-place: the same artifact stays valid
    passes(check, model)
    model.blocks[1].fc.weight = torch.nn.Parameter(torch.randn(4, 4))
    changed(check, model, f"{fc1}._parameters['weight'] is a different object")
    model = Net()
    check = tree_check(model, dicts=True)
    model.blocks[1].fc.register_parameter("extra", torch.nn.Parameter(torch.ones(1)))
    passes(check, model)  # the stamp moved, the group ran again, nothing it reads changed
    del model.blocks[1].fc.bias
    changed(check, model, f"{fc1}._parameters['bias']")
    model = Net()
    check = tree_check(model, dicts=True)
    model.blocks[2].norm.eval()
    changed(check, model, "_modules['norm'].training changed: expected True, got False")
    model.blocks[2].norm.train()
    passes(check, model)
    model.blocks[0] = Block()
    changed(check, model, "L['self']._modules['blocks']._modules['0'] is a different module")
    model = Net()
    check = tree_check(model, dicts=True)
    model.offset = torch.ones(4)  # a buffer replaced through setattr
    changed(check, model, "L['self']._buffers['offset'] is a different object")


def test_dict_sources_check_the_same_at_any_depth():
    """With the stamp unchanged, a deep tree costs what a shallow one does: the same code."""
    sources = []
    for depth in (10, 100):
        model = Net(depth)
        check = tree_check(model, plain_contents=False, dicts=True)
        passes(check, model)
        sources.append(check.source.partition("# guards protected by the module stamp")[0])
    assert sources[0] == sources[1]


@pytest.mark.parametrize("depth", [10, 100])
def test_unchanged_tree_costs_the_same_at_any_depth(depth, monkeypatch):
    """Flat cost: with the stamp unchanged the check reads nothing under the root."""
    model = Net(depth)
    check = tree_check(model, plain_contents=False)
    passes(check, model)
    reads = []
    real = torch.nn.Module.__getattr__
    monkeypatch.setattr(torch.nn.Module, "__getattr__", lambda m, n: reads.append(n) or real(m, n))
    assert check(model, None)
    assert reads == []
    stamps.bump()
    assert check(model, None)
    assert len(reads) > depth  # the group ran once
    reads.clear()
    assert check(model, None)
    assert reads == []
    without = tree_check(model, with_tree=False, plain_contents=False)
    assert without(model, None)
    assert len(reads) > depth  # without the tree guard every call walks the tree


def test_modules_under_closures_and_globals_get_trees_automatically():
    model = Net()

    def call(x):
        return model(x)

    from kiln.capture.source import ClosureSource

    specs = capture_like_guards(ClosureSource("model"), model, plain_contents=False)
    check = guards.build_check(specs, call)
    assert "___group0(" in check.source
    assert check(None)
    model.eval()
    assert not check(None)
    assert (
        check.failure_reason(None)
        == "closure C['model'].training changed: expected True, got False"
    )


def test_top_level_guards_start_at_held_submodules():
    model = Net()
    check = tree_check(model)
    main = check.source.partition("# guards protected by the module stamp")[0]
    assert "self.blocks" not in main  # no walk down the tree on the common path
    passes(check, model)
    model.blocks[0].sizes.append(9)
    changed(check, model, "len(L['self'].blocks[0].sizes) changed: expected 2, got 3")
    model.blocks[0].sizes.pop()
    passes(check, model)
    replacement = Block()  # same guarded values, another object: the group catches it
    model.blocks[0] = replacement
    changed(check, model, "L['self'].blocks[0] is a different module")
    guards.config.trust_module_stamps = False
    changed(check, model, "L['self'].blocks[0] is a different module")


def test_captured_method_checks_the_same_at_any_depth():
    """Capture marks argument-rooted modules (``L['self']``) as trees: the check of a compiled
    ``model.forward`` reads nothing under the model while the stamp stands still."""
    mains = []
    for depth in (4, 40):
        model = Net(depth)
        x = torch.randn(2, 4)
        res = capture(
            model.forward,
            (x,),
            {},
            compile_graph=lambda gm, ex: gm.forward,
            wrap_callable=lambda f: f,
        )
        check = guards.build_check(res.guards, model.forward)
        assert check(model, x)
        mains.append(check.source.partition("# guards protected by the module stamp")[0])
        model.blocks[1].fc.weight = torch.nn.Parameter(torch.randn(4, 4).double())
        assert not check(model, x)
    assert mains[0] == mains[1].replace("== 40)", "== 4)")  # len(self.blocks) differs
    assert "_parameters" not in mains[0] and "_modules['0']" not in mains[0]


class _Remaining:
    """What a resume function gets for an interrupted ``for layer in self.layers``."""

    def __init__(self, items):
        self.items = items


def test_a_group_rooted_inside_a_container_reads_only_its_root():
    # BART's layer loop broken by layerdrop: the tree of the next layer hangs under the
    # resume iterator's list; its group must not read that list (the check's local),
    # or it raised once the stamp moved and the frame recompiled on every call
    model = Block()
    items = LocalSource("state").attr("items")
    root = items.item(0)
    specs = capture_like_guards(root, model)
    specs += [
        GuardSpec(items, GuardKind.SEQUENCE_LENGTH, 1),
        GuardSpec(root, GuardKind.MODULE_TREE, model),
    ]

    def resume(state, x):
        return x

    check = guards.build_check(specs, resume)
    state = _Remaining([model])
    assert check(state, None)
    torch.nn.Linear(1, 1).eval()  # any module changing moves the stamp
    assert check.failure_reason(state, None) is None
    assert check(state, None)
    model.fc.eval()
    assert check(state, None) is False


def test_group_rechecks_that_storages_still_hold_their_tensors():
    model = Net()
    check = tree_check(model)
    passes(check, model)
    model.offset.untyped_storage().resize_(0)  # sizes and strides unchanged
    assert check(model, None) is False
    model.offset.untyped_storage().resize_(16)
    assert check(model, None)


def test_group_rechecks_parameter_storages_inline():
    """A parameter's storage test is an expression over literals (a buffer's calls
    ``storage_fits``): a group re-checks every parameter each time the stamp moved."""
    model = Net()
    check = tree_check(model)
    passes(check, model)
    weight = model.blocks[0].fc.weight
    assert "storage_fits" in check.source  # the buffer's
    assert "nbytes() >= (" in check.source and f"+ {weight.numel()}) * 4" in check.source
    full = weight.untyped_storage().nbytes()
    for size, fits in ((0, False), (full - 4, False), (full, True), (full + 8, True)):
        weight.untyped_storage().resize_(size)
        assert check(model, None) is fits, size


def _counting(check, stem):
    """Wrap the check's functions named ``<prefix><stem>N``; returns the list of calls."""
    calls = []
    ns = check.fn.__globals__
    for name in [n for n in ns if n.lstrip("_").startswith(stem) and callable(ns[n])]:

        def counted(root, _fn=ns[name], _name=name):
            calls.append(_name)
            return _fn(root)

        ns[name] = counted
    return calls


def test_a_parameter_swapped_for_a_tensor_reruns_only_the_tensor_guards():
    """FSDP2 swaps each parameter of a block for its shard and back around every call: such
    a swap moves the stamp for tensors only, and the group re-checks just its tensors (their
    metadata and storages), watching the ones it finds; any other change runs it whole."""
    model = Net()
    check = tree_check(model, dicts=True, ids=False)
    passes(check, model)
    whole, tensors = _counting(check, "group"), _counting(check, "tensors")
    fc = model.blocks[0].fc
    weight = fc.weight
    twin = torch.nn.Parameter(torch.randn_like(weight))
    fc._parameters["weight"] = twin
    passes(check, model)
    assert (len(whole), len(tensors)) == (0, 1)
    twin.requires_grad_(False)  # the twin is watched now: a change of its metadata is seen
    changed(check, model, "requires_grad")
    assert len(whole) >= 1
    twin.requires_grad_(True)
    passes(check, model)
    fc._parameters["weight"] = torch.nn.Parameter(torch.randn(4, 4).t())  # other strides
    changed(check, model, "stride")
    fc._parameters["weight"] = weight
    passes(check, model)
    del whole[:], tensors[:]
    weight.untyped_storage().resize_(0)  # FSDP frees the full parameter between calls
    assert check(model, None) is False
    weight.untyped_storage().resize_(weight.numel() * 4)
    assert check(model, None)
    model.blocks[0].eps = 0.5  # anything else: the whole group
    changed(check, model, "eps")
    assert whole


def _under_no_grad(fn, *args):
    with torch.no_grad():
        return fn(*args)


def test_the_same_parameters_put_back_take_only_their_storage_test():
    """FSDP2 puts the very same unsharded parameters back before every call: a parameter
    that is the tensor that last passed the tensor part is re-checked by its storage alone,
    and not re-watched; a new tensor, a freed storage, and any change of its metadata (which
    moves the whole stamp) are still caught; without trusting the stamps every test runs."""
    model = Net()
    del model._buffers["offset"]  # (a buffer, untracked, is re-watched on every pass)
    check = tree_check(model, dicts=True, ids=False)
    passes(check, model)
    fc = model.blocks[0].fc
    params = [(m._parameters, n) for m in model.modules() for n in m._parameters]

    def put_back():
        for store, name in params:
            store[name] = store[name]

    put_back()
    passes(check, model)  # the first tensor-part pass: every tensor checked whole, watched
    ns = check.fn.__globals__
    rewatch = next(n for n in ns if n.endswith("rewatch"))
    watched = []
    ns[rewatch] = lambda tensors, _rewatch=ns[rewatch]: watched.append(tensors) or _rewatch(tensors)
    tensors = _counting(check, "tensors")
    for _ in range(3):
        put_back()
        passes(check, model)
    assert len(tensors) == 3 and watched == []  # one tensor-part run per put-back
    fc.weight.untyped_storage().resize_(0)
    put_back()
    assert check(model, None) is False
    fc.weight.untyped_storage().resize_(fc.weight.numel() * 4)
    put_back()
    assert check(model, None)
    for change, part in [
        (lambda w: w.requires_grad_(False), "requires_grad"),
        (lambda w: setattr(w, "data", torch.randn(4, 2)), "size"),
        (lambda w: _under_no_grad(w.set_, torch.randn(4, 4).t().contiguous().t()), "stride"),
    ]:
        weight = fc.weight
        keep = weight.detach().clone()
        change(weight)
        put_back()
        changed(check, model, part)
        fc._parameters["weight"] = torch.nn.Parameter(keep)
        passes(check, model)
    twin = torch.nn.Parameter(torch.randn(4, 4).t())  # a new tensor, other strides
    fc._parameters["weight"] = twin
    changed(check, model, "stride")
    fc._parameters["weight"] = torch.nn.Parameter(torch.randn(4, 4))
    passes(check, model)
    assert watched  # a new tensor is watched
    guards.config.trust_module_stamps = False
    try:
        put_back()
        passes(check, model)
        torch._C.TensorBase.requires_grad.__set__(fc.weight, False)  # unseen by the stamp
        put_back()
        assert check(model, None) is False
    finally:
        fc.weight.requires_grad_(True)
        guards.config.trust_module_stamps = True
    passes(check, model)


def test_a_tree_with_an_untracked_parameter_has_no_tensor_part():
    """A tensor in ``_parameters`` whose metadata changes the stamp cannot see (a plain
    tensor, a wrapper subclass) could be swapped in unrecorded: that tree's group runs whole
    after any move."""
    model = Net()
    model.blocks[0].fc._parameters["bias"] = torch.zeros(4)  # a plain tensor
    check = tree_check(model, dicts=True, ids=False)
    passes(check, model)
    assert "tensors" not in check.source
    fc = model.blocks[0].fc
    fc._parameters["weight"] = torch.nn.Parameter(torch.randn(4, 4))
    whole = _counting(check, "group")
    passes(check, model)
    assert whole
