"""Dedup, implied guards and evaluation order."""

from __future__ import annotations

import pytest
import torch

from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import AttrSource, GlobalSource, ItemSource, LocalSource, RawItemSource
from kiln.guards import module_tree, plan


def raise_unsupported(g):
    raise ValueError(str(g))


x = LocalSource("x")
TENSOR = GuardSpec(x, GuardKind.TENSOR_MATCH, TensorMeta.of(torch.randn(2)))


def order(guards):
    return plan.order(guards, raise_unsupported)


def test_duplicates_and_implied_guards_go():
    ordered = order(
        [
            TENSOR,
            TENSOR,
            GuardSpec(x, GuardKind.NOT_NONE),
            GuardSpec(x, GuardKind.TYPE_MATCH, torch.Tensor),
        ]
    )
    assert ordered.flat() == [TENSOR]


def test_cheap_first_then_state_then_tensors_then_hooks():
    s = LocalSource("self")
    guards = [
        GuardSpec(s, GuardKind.HOOKS_EMPTY),
        TENSOR,
        GuardSpec(LocalSource("xs"), GuardKind.SEQUENCE_LENGTH, 2),
        GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current()),
        GuardSpec(AttrSource(s, "n"), GuardKind.EQUALS, 1),
        GuardSpec(s, GuardKind.TYPE_MATCH, torch.nn.Linear),
    ]
    kinds = [g.kind for g in order(guards).flat()]
    assert kinds == [
        GuardKind.TYPE_MATCH,  # depth 0 before the attribute's depth 1
        GuardKind.EQUALS,
        GuardKind.GLOBAL_STATE,
        GuardKind.SEQUENCE_LENGTH,
        GuardKind.TENSOR_MATCH,
        GuardKind.HOOKS_EMPTY,
    ]


def test_malformed_guards_are_reported():
    with pytest.raises(ValueError):
        order([GuardSpec(x, GuardKind.GLOBAL_STATE, GlobalState.current())])
    with pytest.raises(ValueError):
        order([GuardSpec(x, GuardKind.MODULE_TREE, 3)])


def test_tree_groups_what_its_stamp_protects():
    class Cfg:
        hidden = 4

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    model.eps = 0.5
    model.cfg = Cfg()
    s = LocalSource("self")
    first = s.item(0)
    # the trees' own identity tests check these
    implied = [
        GuardSpec(s, GuardKind.MODULE_MATCH, id(model)),
        GuardSpec(first, GuardKind.MODULE_MATCH, id(model[0])),
    ]
    protected = [
        GuardSpec(s.attr("training"), GuardKind.BOOL, True),
        GuardSpec(first, GuardKind.HOOKS_EMPTY),
        GuardSpec(first.attr("weight"), GuardKind.TENSOR_MATCH, TensorMeta.of(model[0].weight)),
        GuardSpec(first.attr("in_features"), GuardKind.EQUALS, 2),
        GuardSpec(s.attr("eps"), GuardKind.EQUALS, 0.5),
        GuardSpec(s.attr("cfg"), GuardKind.TYPE_MATCH, Cfg),
        GuardSpec(first, GuardKind.MODULE_TREE, model[0]),  # a nested tree joins the outer group
    ]
    unprotected = [
        GuardSpec(s.attr("cfg").attr("hidden"), GuardKind.EQUALS, 4),  # inside a plain object
        GuardSpec(first.attr("forward"), GuardKind.ID_MATCH, 123),  # a class attribute
        GuardSpec(s.attr("eps"), GuardKind.EQUALS, 0.25),  # does not hold now: fails every call
        GuardSpec(LocalSource("x"), GuardKind.EQUALS, 1),  # outside the tree
    ]
    tree = GuardSpec(s, GuardKind.MODULE_TREE, model)
    p = order([*implied, *protected, tree, *unprotected])
    assert {str(g) for g in p.group(tree)} == {str(g) for g in protected}
    assert {str(g) for g in p.top} == {str(g) for g in [tree, *unprotected]}
    assert p.flat() == [*p.top, *p.group(tree)]  # groups run after the top level


def test_a_tree_with_nothing_under_its_stamp_has_no_group():
    """A frame that only calls its module (a compiled wrapper module's trampoline) matches the
    module by identity and reads nothing of its state: the tree's own identity test is the
    whole check on it, so there is no group to run again (nor a tree to watch) whenever the
    stamp moves."""
    model = torch.nn.Linear(2, 2)
    s = LocalSource("self")
    tree = GuardSpec(s, GuardKind.MODULE_TREE, model)
    p = order([GuardSpec(s, GuardKind.MODULE_MATCH, id(model)), tree])
    assert p.top == [tree]
    assert p.group(tree) == []
    other = GuardSpec(s, GuardKind.MODULE_MATCH, id(model) + 1)  # another object: kept
    assert other in order([other, tree]).flat()


def _steps_below_reference(source, root):
    """The walk ``plan`` made for every (guard, tree) pair before paths were indexed."""
    steps = []
    while source is not None and str(source) != root:
        if isinstance(source, AttrSource):
            steps.append(("attr", source.name))
        elif isinstance(source, ItemSource):
            steps.append(("item", source.index))
        else:
            return None
        source = source.base
    return tuple(steps[::-1]) if source is not None else None


def _assert_trees_match_the_walk(guards):
    trees = plan._Trees(guards)
    assert [str(t) for t in trees.trees] == [
        str(t)
        for t in sorted(
            (g for g in guards if g.kind is GuardKind.MODULE_TREE),
            key=lambda g: plan.source_depth(g.source),
        )
    ]
    for g in guards:
        expected = []
        for t in trees.trees:
            steps = _steps_below_reference(g.source, str(t.source))
            if t is not g and steps is not None:
                expected.append((t, steps))
        assert [(trees.trees[i], steps) for i, steps in trees.above(g)] == expected, str(g)
        assert [trees.reach(i, steps) for i, steps in trees.above(g)] == [
            module_tree.reach(t.expected, steps) for t, steps in expected
        ]


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.norms = torch.nn.ModuleDict({"a": torch.nn.LayerNorm(4)})
        self.scale = 2.0

    def forward(self, x):
        return self.norms["a"](self.fc(x)) * self.scale


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer() for _ in range(3)])
        self.head = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU())

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_tree_lookup_equals_the_walk_over_a_captured_model():
    """The indexed lookup finds the same trees, with the same steps, in the same order, as
    walking each guard's source up to each tree's root did."""
    from kiln.capture import capture

    model = _Net()
    res = capture(
        model.forward,
        (torch.randn(2, 4),),
        {},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
    )
    s = LocalSource("self")
    layer = s.attr("_modules").item("layers").attr("_modules").item("1")
    extra = [  # nested trees, one rooted on its own path, and a guard outside every tree
        GuardSpec(s, GuardKind.MODULE_TREE, model),
        GuardSpec(layer, GuardKind.MODULE_TREE, model.layers[1]),
        GuardSpec(layer.attr("fc"), GuardKind.MODULE_TREE, model.layers[1].fc),
        GuardSpec(LocalSource("x"), GuardKind.EQUALS, 1),
    ]
    guards = [*res.guards, *extra]
    assert sum(g.kind is GuardKind.MODULE_TREE for g in guards) >= 3
    _assert_trees_match_the_walk(guards)
    _assert_uses_match_the_walk(guards, model.forward)


def _assert_uses_match_the_walk(guards, fn):
    """Codegen's count of the guards reading each source (itself or below it), passed up
    once per distinct source, equals walking every guard's chain to its root."""
    from collections import Counter

    from kiln.guards.codegen import CheckSource

    walked = Counter()
    for g in guards:
        source = g.source
        while source is not None:
            walked[str(source)] += 1
            source = source.base if isinstance(source, (AttrSource, ItemSource)) else None
    cs = CheckSource(fn.__func__)
    cs.count_uses(guards)
    assert +cs._uses == +walked and any(n > 1 for n in walked.values())


def test_tree_lookup_equals_the_walk_on_other_roots():
    """Roots that are not attribute/item chains end the walk: a tree on one still matches,
    a guard past one matches no tree above it; a source printed like a tree's matches it."""
    d = LocalSource("d")
    raw = RawItemSource(d, "m", dict)
    m = torch.nn.Linear(2, 2)
    tree_raw = GuardSpec(raw, GuardKind.MODULE_TREE, m)
    tree_d = GuardSpec(d, GuardKind.MODULE_TREE, m)
    tree_g = GuardSpec(GlobalSource("net"), GuardKind.MODULE_TREE, m)
    guards = [
        tree_d,
        tree_raw,
        tree_g,
        GuardSpec(raw.attr("weight"), GuardKind.TENSOR_MATCH, TensorMeta.of(m.weight)),
        GuardSpec(raw.attr("_parameters").item("bias"), GuardKind.NOT_NONE),
        GuardSpec(GlobalSource("net").attr("weight").item(0), GuardKind.EQUALS, 1),
        GuardSpec(d.item((1, "k")).attr("x"), GuardKind.EQUALS, 1),
        GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current()),
        GuardSpec(AttrSource(LocalSource("e"), "d"), GuardKind.EQUALS, 1),
    ]
    _assert_trees_match_the_walk(guards)
    trees = plan._Trees(guards)
    assert trees.above(guards[3]) == [(trees.trees.index(tree_raw), (("attr", "weight"),))]
    assert trees.above(tree_raw) == []  # not d's: the raw item ends the path
