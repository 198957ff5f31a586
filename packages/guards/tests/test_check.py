"""Soundness of generated checks: each change between calls passes or fails exactly as it should.

Every case also asserts that ``failure_reason`` agrees with the generated function.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

from kiln import guards
from kiln.capture import capture
from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import AttrSource, ClosureSource, GlobalSource, ItemSource, LocalSource

SCALE = 2


def tensor_guard(name, t):
    return GuardSpec(LocalSource(name), GuardKind.TENSOR_MATCH, TensorMeta.of(t))


def global_state_guard():
    return GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current())


def scaled(x, y):
    return x * SCALE + y


def assert_passes(check, *args, **kwargs):
    assert check.failure_reason(*args, **kwargs) is None
    assert check(*args, **kwargs) is True


def assert_fails(check, reason_part, *args, **kwargs):
    reason = check.failure_reason(*args, **kwargs)
    assert check(*args, **kwargs) is False
    assert reason is not None and reason_part in reason, reason


@pytest.fixture
def two_tensors():
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    return guards.build_check([tensor_guard("x", x), tensor_guard("y", y)], scaled), x, y


def test_fresh_tensors_of_same_meta_pass(two_tensors):
    check, _, _ = two_tensors
    assert_passes(check, torch.randn(8, 4), torch.randn(8, 4))
    assert_passes(check, x=torch.randn(8, 4), y=torch.randn(8, 4))


def test_tensor_dtype_device_shape_stride_requires_grad(two_tensors):
    check, x, y = two_tensors
    assert_fails(check, "dtype mismatch", x.double(), y)
    assert_fails(check, "device mismatch", x.to("meta"), y)
    assert_fails(
        check, "tensor L['x'] size mismatch at index 0: expected 8, got 16", torch.randn(16, 4), y
    )
    assert_fails(check, "rank mismatch", torch.randn(8, 4, 1), y)
    assert_fails(check, "stride mismatch at index 0", torch.randn(4, 8).t(), y)
    assert_fails(check, "requires_grad mismatch", x, y.clone().requires_grad_())
    assert_fails(check, "type mismatch", torch.nn.Parameter(x), y)
    assert_fails(check, "is not a tensor", 3, y)
    assert_passes(check, x, y)


def test_meta_device_tensor_guard():
    x = torch.empty(3, device="meta")
    check = guards.build_check([tensor_guard("x", x)], lambda x: x)
    assert_passes(check, torch.empty(3, device="meta"))
    assert_fails(check, "device mismatch: expected meta, got cpu", torch.empty(3))


def test_global_changes_fail_and_restore():
    global SCALE
    check = guards.build_check([GuardSpec(GlobalSource("SCALE"), GuardKind.EQUALS, 2)], scaled)
    x = torch.randn(2)
    assert_passes(check, x, x)
    SCALE = 3
    try:
        assert_fails(check, "global G['SCALE'] changed: expected 2, got 3", x, x)
        SCALE = 2.0
        assert_fails(check, "(float)", x, x)  # == holds but the type changed
    finally:
        SCALE = 2
    assert_passes(check, x, x)


def test_closure_cell_change():
    k = 5

    def f(x):
        return x + k

    check = guards.build_check([GuardSpec(ClosureSource("k"), GuardKind.EQUALS, 5)], f)
    assert_passes(check, 1)
    k = 6  # noqa: F841 - rebinding the cell is the point
    assert_fails(check, "closure C['k'] changed: expected 5, got 6", 1)


class Box:
    def __init__(self):
        self.n = 4
        self.items = [1, 2, 3]
        self.table = {"a": 1, "b": 2}


def use_box(box, x):
    return x


def test_attribute_list_length_and_dict_keys():
    box = Box()
    src = LocalSource("box")
    check = guards.build_check(
        [
            GuardSpec(src, GuardKind.TYPE_MATCH, Box),
            GuardSpec(AttrSource(src, "n"), GuardKind.EQUALS, 4),
            GuardSpec(AttrSource(src, "items"), GuardKind.SEQUENCE_LENGTH, 3),
            GuardSpec(AttrSource(src, "table"), GuardKind.DICT_KEYS, ("a", "b")),
            GuardSpec(ItemSource(AttrSource(src, "items"), 0), GuardKind.EQUALS, 1),
        ],
        use_box,
    )
    assert_passes(check, box, None)
    box.n = 5
    assert_fails(check, "L['box'].n changed: expected 4, got 5", box, None)
    box.n = 4
    box.items.append(4)
    assert_fails(check, "len(L['box'].items) changed: expected 3, got 4", box, None)
    box.items.pop()
    box.table["c"] = 3
    assert_fails(check, "L['box'].table keys changed", box, None)
    del box.table["c"]
    box.table.update({"a": 9})  # values are not guarded by DICT_KEYS
    assert_passes(check, box, None)
    assert_fails(check, "type changed: expected Box, got int", 3, None)


def test_none_bool_hasattr_id():
    obj = Box()
    check = guards.build_check(
        [
            GuardSpec(LocalSource("a"), GuardKind.IS_NONE),
            GuardSpec(LocalSource("b"), GuardKind.NOT_NONE),
            GuardSpec(LocalSource("c"), GuardKind.BOOL, True),
            GuardSpec(LocalSource("d"), GuardKind.HASATTR, ("n", True)),
            GuardSpec(LocalSource("e"), GuardKind.ID_MATCH, id(obj)),
        ],
        lambda a, b, c, d, e: None,
    )
    assert_passes(check, None, 1, [1], obj, obj)
    assert_fails(check, "L['a'] changed: expected None", 0, 1, [1], obj, obj)
    assert_fails(check, "expected not None, got None", None, None, [1], obj, obj)
    assert_fails(check, "L['c'] changed: expected True, got False", None, 1, [], obj, obj)
    assert_fails(check, "hasattr(L['d'], 'n') changed", None, 1, [1], object(), obj)
    assert_fails(check, "L['e'] is a different object", None, 1, [1], obj, Box())


def test_grad_mode_and_global_state():
    check = guards.build_check([global_state_guard()], lambda x: x)
    assert_passes(check, 1)
    with torch.no_grad():
        assert_fails(check, "grad mode changed: expected True, got False", 1)
    with torch.inference_mode():
        assert_fails(check, "mode changed", 1)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert_fails(check, "default dtype changed", 1)
    finally:
        torch.set_default_dtype(old)
    with torch.autocast("cpu"):
        assert_fails(check, "cpu autocast changed: expected False, got True", 1)
    torch.use_deterministic_algorithms(True)
    try:
        assert_fails(check, "deterministic algorithms changed", 1)
    finally:
        torch.use_deterministic_algorithms(False)
    with torch.device("meta"):
        assert_fails(check, "default device changed: expected cpu, got meta", 1)
    with torch.overrides.BaseTorchFunctionMode():
        assert_fails(check, "torch-function modes changed: expected 0, got 1", 1)
        with torch.device("cpu"):  # a device context is a mode the default device covers
            assert_fails(check, "torch-function modes changed: expected 0, got 1", 1)
    with torch.device("cpu"):
        assert_passes(check, 1)
    assert_passes(check, 1)


def forward(self, x):
    return self[2](self[1](self[0](x)))


def test_module_param_replaced_vs_in_place_and_eval():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    check = guards.build_check(
        [
            GuardSpec(LocalSource("self"), GuardKind.MODULE_MATCH, id(model)),
            GuardSpec(AttrSource(LocalSource("self"), "training"), GuardKind.BOOL, True),
            tensor_guard("x", torch.randn(3, 4)),
            GuardSpec(
                AttrSource(ItemSource(LocalSource("self"), 0), "weight"),
                GuardKind.ID_MATCH,
                id(model[0].weight),
            ),
        ],
        forward,
    )
    x = torch.randn(3, 4)
    assert_passes(check, model, x)
    with torch.no_grad():
        model[0].weight.add_(1.0)  # in-place value change: same artifact stays valid
    assert_passes(check, model, x)
    model.eval()
    assert_fails(check, "L['self'].training changed: expected True, got False", model, x)
    model.train()
    model[0].weight = torch.nn.Parameter(torch.randn(4, 4))
    assert_fails(check, "L['self'][0].weight is a different object", model, x)


def test_defaults_kwonly_varargs_bind_like_the_function():
    def f(a, /, b=2, *rest, c, d=4, **extra):
        return a

    check = guards.build_check(
        [
            GuardSpec(LocalSource("b"), GuardKind.EQUALS, 2),
            GuardSpec(LocalSource("d"), GuardKind.EQUALS, 4),
            GuardSpec(LocalSource("rest"), GuardKind.SEQUENCE_LENGTH, 0),
            GuardSpec(LocalSource("extra"), GuardKind.DICT_KEYS, ()),
        ],
        f,
    )
    assert "def f(a, /, b=" in check.source
    assert_passes(check, 1, c=3)
    assert_fails(check, "L['b'] changed", 1, 5, c=3)
    assert_fails(check, "len(L['rest'])", 1, 2, 9, c=3)
    assert_fails(check, "L['extra'] keys changed", 1, c=3, z=1)
    # c missing: the check refuses to bind exactly as the function does.
    assert "do not fit" in check.failure_reason(1)
    with pytest.raises(TypeError, match=r"f\(\) missing 1 required keyword-only argument: 'c'"):
        check(1)


def test_bound_method_takes_self_first():
    box = Box()

    class Holder:
        def apply(self, x):
            return x

    h = Holder()
    check = guards.build_check([GuardSpec(LocalSource("self"), GuardKind.ID_MATCH, id(h))], h.apply)
    assert_passes(check, h, 1)
    assert_fails(check, "different object", Holder(), 1)
    del box


def test_unsupported_guards_raise():
    with pytest.raises(guards.UnsupportedGuard, match="not a parameter"):
        guards.build_check([GuardSpec(LocalSource("nope"), GuardKind.IS_NONE)], scaled)
    with pytest.raises(guards.UnsupportedGuard, match="no such free variable"):
        guards.build_check([GuardSpec(ClosureSource("nope"), GuardKind.IS_NONE)], scaled)
    with pytest.raises(guards.UnsupportedGuard):
        guards.build_check([GuardSpec(None, GuardKind.EQUALS, 1)], scaled)
    with pytest.raises(guards.GuardsError):
        guards.build_check([], len)  # not a Python function


def test_hooks_present():
    model = torch.nn.Linear(2, 2)
    check = guards.build_check([GuardSpec(LocalSource("self"), GuardKind.HOOKS_EMPTY)], forward)
    assert_passes(check, model, None)
    handle = model.register_forward_pre_hook(lambda *a: None)
    assert_fails(check, "L['self'] has forward pre hooks now", model, None)
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert_fails(check, "global module hooks", model, None)
    finally:
        handle.remove()
    assert_passes(check, model, None)


def test_nan_constant_and_parameter_defaults():
    def f(x, scale=float("nan"), sizes=[1, 2], *, mode="a"):  # noqa: B006 - guarded default
        return x

    from kiln.capture.source import DefaultSource

    check = guards.build_check(
        [
            GuardSpec(LocalSource("scale"), GuardKind.EQUALS, float("nan")),
            GuardSpec(DefaultSource(None, "sizes"), GuardKind.SEQUENCE_LENGTH, 2),
            GuardSpec(DefaultSource(None, "mode", kwonly=True), GuardKind.EQUALS, "a"),
        ],
        f,
    )
    assert_passes(check, 1)
    assert_fails(check, "L['scale'] changed: expected nan, got 1.0", 1, 1.0)
    f.__defaults__[1].append(3)  # the mutable default grew: guards see it
    assert_fails(check, "len(__defaults__['sizes']) changed: expected 2, got 3", 1)
    f.__defaults__[1].pop()
    f.__kwdefaults__["mode"] = "b"
    assert_fails(check, "__kwdefaults__['mode'] changed", 1, mode="a")


def test_generated_check_and_failure_reason_always_agree():
    """Random perturbations of every argument: the fast and the slow path give one answer."""
    import random

    def f(x, n, flag, xs, d, y=None):
        return x

    def guards_for(x, n, flag, xs, d, y):
        L = LocalSource
        return [
            tensor_guard("x", x),
            GuardSpec(L("n"), GuardKind.EQUALS, n),
            GuardSpec(L("flag"), GuardKind.BOOL, flag),
            GuardSpec(L("xs"), GuardKind.TYPE_MATCH, type(xs)),
            GuardSpec(L("xs"), GuardKind.SEQUENCE_LENGTH, len(xs)),
            GuardSpec(ItemSource(L("xs"), 0), GuardKind.TENSOR_MATCH, TensorMeta.of(xs[0])),
            GuardSpec(L("d"), GuardKind.DICT_KEYS, tuple(d)),
            GuardSpec(L("y"), GuardKind.IS_NONE if y is None else GuardKind.NOT_NONE),
            global_state_guard(),
        ]

    rng = random.Random(0)
    base = (torch.randn(4, 3), 3, True, [torch.randn(2)], {"a": 1}, None)
    check = guards.build_check(guards_for(*base), f)
    perturb = [
        lambda v: v.double() if rng.random() < 0.5 else torch.randn(5, 3),
        lambda v: rng.choice([4, 3.0, "3", True]),
        lambda v: rng.choice([False, 0, [], 1]),
        lambda v: rng.choice([[], [torch.randn(3)], (v[0],), [1], [v[0], v[0]]]),
        lambda v: rng.choice([{}, {"b": 1}, {"a": 2}, {"a": 1, "b": 2}]),
        lambda v: rng.choice([None, 0, torch.randn(1)]),
    ]
    agreed = 0
    for _ in range(300):
        args = list(base)
        for i in rng.sample(range(len(args)), rng.randint(0, 3)):
            args[i] = perturb[i](args[i])
        assert check(*args) is (check.failure_reason(*args) is None), args
        agreed += 1
    assert agreed == 300


def _passes_through(func):
    """A ``functools.wraps`` decorator, as transformers puts on ``forward`` (can_return_tuple)."""

    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        return func(self, *args, **kwargs)

    return wrapper


class _Decorated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    @_passes_through
    def forward(self, input_ids=None, scale=1.0):
        return self.fc(input_ids) * scale


def test_a_decorated_function_is_checked_with_its_own_parameters():
    # inspect.signature follows __wrapped__ to (self, input_ids=None, scale=1.0); the frame
    # binds (self, *args, **kwargs), and so must the check.
    x = torch.randn(3, 4)
    wrapper = _Decorated.forward
    check = guards.build_check(
        [
            GuardSpec(LocalSource("args"), GuardKind.SEQUENCE_LENGTH, 0),
            GuardSpec(LocalSource("kwargs"), GuardKind.DICT_KEYS, ("input_ids",)),
            GuardSpec(ItemSource(LocalSource("kwargs"), "input_ids"), GuardKind.TENSOR_MATCH,
                      TensorMeta.of(x)),
        ],
        wrapper,
    )  # fmt: skip
    assert "def forward(self, *args, **kwargs):" in check.source
    assert_passes(check, None, input_ids=x)
    assert_fails(check, "size mismatch", None, input_ids=torch.randn(5, 4))
    assert_fails(check, "len(L['args'])", None, x)
    assert_fails(check, "keys changed", None, input_ids=x, scale=2.0)


def test_an_assigned_signature_does_not_change_the_checks_parameters():
    def fn(a, *rest, k=3):
        return a

    fn.__signature__ = inspect.signature(lambda x, y: None)  # type: ignore[attr-defined]
    check = guards.build_check([GuardSpec(LocalSource("k"), GuardKind.EQUALS, 3)], fn)
    assert "def fn(a, *rest, k=" in check.source
    assert_passes(check, 1, 2, 3)
    assert_fails(check, "L['k'] changed", 1, k=4)


def test_a_captured_decorated_forward_gets_a_working_check():
    # hf_bart: the frontend captures a module's decorated forward on its own (after a graph
    # break, or through its trampoline) and builds the check for that very function.
    m = _Decorated()
    x = torch.randn(3, 4)
    result = capture(
        m.forward, (), {"input_ids": x}, compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
    )  # fmt: skip
    assert len(result.graphs) == 1
    check = guards.build_check(result.guards, m.forward)
    assert_passes(check, m, input_ids=x)
    assert_passes(check, m, input_ids=torch.randn(3, 4))
    assert_fails(check, "size mismatch", m, input_ids=torch.randn(2, 4))
    assert_fails(check, "L['args']", m, x)
    torch.testing.assert_close(result.function(input_ids=x), m(input_ids=x))
