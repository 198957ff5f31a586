"""Guards recorded as data: kinds, sources, expected values, deduplication."""

from __future__ import annotations

import functools
import inspect

import pytest
import torch
from torch import nn

from kiln.capture import (
    AttrSource,
    GlobalSource,
    GuardKind,
    ItemSource,
    LocalSource,
    TensorMeta,
    Unsupported,
    capture,
)
from kiln.capture.guard_data import storage_fits
from kiln.capture.source import root_of

SCALE = 2


def _guards(fn, *args, **kwargs):
    r = capture(
        fn, args, kwargs, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f
    )
    return r.guards


def _by(guards):
    return {(str(g.source), g.kind): g.expected for g in guards}


def test_tensor_match_for_every_tensor_input():
    x, y = torch.randn(2, 3), torch.randn(3, requires_grad=True)
    g = _by(_guards(lambda x, y: x + y, x, y))
    assert g[("L['x']", GuardKind.TENSOR_MATCH)] == TensorMeta.of(x)
    assert g[("L['y']", GuardKind.TENSOR_MATCH)].requires_grad


def test_constants_none_and_globals():
    def fn(x, n, flag, opt):
        return x * n * SCALE if flag and opt is None else x

    g = _by(_guards(fn, torch.randn(2), 3, True, None))
    assert g[("L['n']", GuardKind.EQUALS)] == 3
    assert g[("L['flag']", GuardKind.EQUALS)] is True
    assert ("L['opt']", GuardKind.IS_NONE) in g
    assert g[("G['SCALE']", GuardKind.EQUALS)] == 2


def test_containers_guard_type_length_and_keys():
    def fn(xs, d):
        return xs[0] + d["a"]

    g = _by(_guards(fn, [torch.randn(2), torch.randn(2)], {"a": torch.randn(2)}))
    assert g[("L['xs']", GuardKind.SEQUENCE_LENGTH)] == 2
    assert g[("L['xs']", GuardKind.TYPE_MATCH)] is list
    assert g[("L['d']", GuardKind.DICT_KEYS)] == ("a",)
    assert ("L['xs'][1]", GuardKind.TENSOR_MATCH) in g


def test_module_identity_and_training():
    m = nn.Linear(2, 2)
    guards = _guards(m.forward, torch.randn(1, 2))
    g = _by(guards)
    assert g[("L['self']", GuardKind.MODULE_MATCH)] == id(m)
    assert g[("L['self']", GuardKind.MODULE_TREE)] is m  # guards check under it by the stamp
    # parameters are read from the module's dict, not through Module.__getattr__
    assert ("L['self']._parameters['weight']", GuardKind.TENSOR_MATCH) in g

    class M(nn.Module):
        def forward(self, x):
            return x * 2 if self.training else x

    m2 = M().eval()
    g2 = _by(_guards(m2.forward, torch.randn(2)))
    assert g2[("L['self'].training", GuardKind.EQUALS)] is False


def test_global_state_guard_and_dedupe():
    def fn(x):
        return x + x + x.sum()

    guards = _guards(fn, torch.randn(2))
    assert len(guards) == len({(str(g.source), g.kind, repr(g.expected)) for g in guards})
    (state,) = [g for g in guards if g.kind == GuardKind.GLOBAL_STATE]
    assert state.source is None and state.expected.grad_enabled == torch.is_grad_enabled()


def test_dedupe_keys_constants_and_metadata_by_value_classes_and_modules_by_identity():
    from kiln.capture.guard_data import GuardSpec, dedupe

    x = LocalSource("x")

    def named_a():
        class A:
            pass

        return A

    a1, a2 = named_a(), named_a()  # print alike, are different classes
    m1, m2 = nn.Linear(2, 2), nn.Linear(2, 2)
    guards = [
        GuardSpec(x, GuardKind.TENSOR_MATCH, TensorMeta.of(torch.randn(2, 3))),
        GuardSpec(x, GuardKind.TENSOR_MATCH, TensorMeta.of(torch.randn(2, 3))),
        GuardSpec(x, GuardKind.TENSOR_MATCH, TensorMeta.of(torch.randn(3, 2))),
        GuardSpec(x, GuardKind.EQUALS, 1),
        GuardSpec(x, GuardKind.EQUALS, True),  # equal to 1, not the same guard
        GuardSpec(x, GuardKind.EQUALS, 1.0),
        GuardSpec(x, GuardKind.EQUALS, 1),
        GuardSpec(x, GuardKind.EQUALS, float("nan")),
        GuardSpec(x, GuardKind.EQUALS, float("nan")),  # prints alike: one guard
        GuardSpec(x, GuardKind.TYPE_MATCH, a1),
        GuardSpec(x, GuardKind.TYPE_MATCH, a2),
        GuardSpec(x, GuardKind.TYPE_MATCH, a1),
        GuardSpec(x, GuardKind.MODULE_TREE, m1),
        GuardSpec(x, GuardKind.MODULE_TREE, m2),
        GuardSpec(x, GuardKind.MODULE_TREE, m1),
    ]
    kept = dedupe(guards)
    assert [next(i for i, h in enumerate(guards) if h is g) for g in kept] == [
        0,
        2,
        3,
        4,
        5,
        7,
        9,
        10,
        12,
        13,
    ]


def test_placeholders_stay_first_in_input_order():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = (nn.Linear(2, 2) for _ in range(3))

        def forward(self, x):
            return self.c(self.b(self.a(x).relu()).relu())

    r = capture(
        M().forward,
        (torch.randn(1, 2),),
        {},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
    )
    ops = [n.op for n in r.graphs[0].graph.nodes]
    first_op = ops.index("call_function")
    assert ops.count("placeholder") == 7 and "placeholder" not in ops[first_op:]
    names = [n.name for n in r.graphs[0].graph.nodes if n.op == "placeholder"]
    assert names[0] == "l_x" or "x" in names[0]
    assert [n for n in names if "weight" in n or "bias" in n] == names[1:]
    assert [n.split("_modules_")[1][0] for n in names[1:]] == ["a", "a", "b", "b", "c", "c"]


def test_sources_resolve_against_the_frame():
    src = ItemSource(AttrSource(LocalSource("self"), "layers"), 0)
    assert str(src) == "L['self'].layers[0]"
    assert str(GlobalSource("torch")) == "G['torch']"


def test_property_getter_globals_are_guarded():
    class P:
        @property
        def scaled(self):
            return SCALE * 3

    g = _by(_guards(lambda x, p: x * p.scaled, torch.randn(2), P()))
    assert g[("G['SCALE']", GuardKind.EQUALS)] == 2


def test_identity_of_objects_is_guarded():
    import enum

    class Mode(enum.Enum):
        A = 1
        B = 2

    sentinel = object()

    def fn(x, mode, marker):
        y = x * 2 if mode is Mode.A else x
        return y + 1 if marker is sentinel else y

    g = _by(_guards(fn, torch.randn(2), Mode.A, sentinel))
    assert g[("L['mode']", GuardKind.ID_MATCH)] == id(Mode.A)
    assert g[("L['marker']", GuardKind.ID_MATCH)] == id(sentinel)


def test_unrolled_module_containers_guard_length_and_keys():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
            self.heads = nn.ModuleDict({"a": nn.Linear(2, 1)})

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return [h(x) for h in self.heads.values()], len(self.layers)

    g = _by(_guards(M().forward, torch.randn(1, 2)))
    assert g[("L['self']._modules['layers']", GuardKind.SEQUENCE_LENGTH)] == 2


def test_aliased_inputs_get_separate_placeholders():
    x = torch.randn(3)
    r = capture(
        lambda a, b: a + b,
        (x, x),
        {},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
    )
    assert len([n for n in r.graphs[0].graph.nodes if n.op == "placeholder"]) == 2
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(r.function(a, b), a + b)


def test_inlined_hooks_are_pinned_by_their_handles():
    m = nn.Linear(2, 2)
    handle = m.register_forward_hook(lambda mod, args, out: out * 2)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = m

        def forward(self, x):
            return self.inner(x)

    g = _by(_guards(Outer().forward, torch.randn(1, 2)))
    assert g[("L['self']._modules['inner']._forward_hooks", GuardKind.DICT_KEYS)] == (handle.id,)


def _decorated(func):
    """A ``functools.wraps`` decorator passing everything through (transformers' ``forward``s)."""

    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        return func(self, *args, **kwargs) * 2

    return wrapper


class _Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @_decorated
    def forward(self, input_ids=None, scale=1.0):
        return self.fc(input_ids) * scale


def test_a_decorated_frame_binds_its_own_parameters_not_the_wrapped_ones(check):
    m = _Decorated()
    x = torch.randn(3, 4)
    assert list(inspect.signature(m.forward).parameters) == ["input_ids", "scale"]
    result = check(m.forward, (x,), {"scale": 3.0})
    g = _by(result.guards)
    assert g[("L['args'][0]", GuardKind.TENSOR_MATCH)] == TensorMeta.of(x)
    assert g[("L['args']", GuardKind.SEQUENCE_LENGTH)] == 1
    assert g[("L['kwargs']", GuardKind.DICT_KEYS)] == ("scale",)
    # Only the wrapper's own parameters are locals (guards can bind nothing else).
    roots = {str(root_of(s.source)) for s in result.guards if s.source is not None}
    assert {r for r in roots if r.startswith("L[")} == {"L['self']", "L['args']", "L['kwargs']"}
    torch.testing.assert_close(result.function(x, scale=3.0), m(x, scale=3.0))


def test_an_assigned_signature_does_not_change_how_a_frame_binds(check):
    def fn(*args, **kwargs):
        return args[0] + kwargs["y"]

    fn.__signature__ = inspect.signature(lambda x, y=None: None)  # type: ignore[attr-defined]
    result = check(fn, (torch.randn(2),), {"y": torch.randn(2)})
    assert {str(g.source) for g in result.guards} >= {"L['args'][0]", "L['kwargs']['y']"}


def test_tensor_outgrowing_its_storage_is_refused():

    x = torch.randn(4)
    assert storage_fits(x) and storage_fits(x[2:]) and storage_fits(torch.empty(0))
    x.untyped_storage().resize_(8)
    assert not storage_fits(x)

    def f(t):
        return t + 1

    with pytest.raises(Unsupported, match="storage is smaller"):
        capture(
            f, (x,), {}, compile_graph=lambda gm, _: gm, wrap_callable=lambda fn: fn, fullgraph=True
        )
