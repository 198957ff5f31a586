"""nn.Module capture: attributes, submodules, containers, hooks, train/eval, and real models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kiln.capture import GuardKind, LocalSource, capture


def _capture(fn, *args, **kwargs):
    return capture(
        fn, args, kwargs, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f
    )


def check(module, *args, graphs=1, seed=True):
    """Capture ``module.forward``, run it and eager with one seed, compare."""
    r = _capture(module.forward, *args)
    assert len(r.graphs) == graphs
    torch.manual_seed(0)
    expected = module(*args)
    torch.manual_seed(0)
    actual = r.function(*args)
    torch.testing.assert_close(actual, expected)
    return r


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)
        self.scale = 2

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x))) * self.scale


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.register_buffer("offset", torch.randn(4))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) + self.offset
        x = self.seq(x)
        x = self.layers[-1](x)
        return {k: head(x) for k, head in self.heads.items()}


class TrainEval(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        if self.training:
            x = x * 2
        return self.drop(self.bn(x))


class WithParam(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 3))

    def forward(self, x):
        return x @ self.w + self.w.sum()


class Child(MLP):
    def forward(self, x):
        return super().forward(x) + 1


class Caller(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = MLP()

    def forward(self, x):
        return self.inner(x) - self.helper(x)

    def helper(self, x):
        return x.sum(-1, keepdim=True)


class PropertyModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    @property
    def weight_t(self):
        return self.lin.weight.t()

    def forward(self, x):
        return x @ self.weight_t


class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.norm = nn.LayerNorm(4)
        self.emb = nn.Embedding(10, 4)

    def forward(self, x, ids):
        y = self.pool(self.conv(x)).flatten(1)
        return self.norm(y) + self.emb(ids).mean(1)


def test_mlp_guards_parameters_as_inputs():
    m = MLP()
    r = check(m, torch.randn(2, 4))
    placeholders = [n for n in r.graphs[0].graph.nodes if n.op == "placeholder"]
    assert [str(n.meta["source"]) for n in placeholders] == [
        "L['x']",
        "L['self']._modules['fc1']._parameters['weight']",
        "L['self']._modules['fc1']._parameters['bias']",
        "L['self']._modules['fc2']._parameters['weight']",
        "L['self']._modules['fc2']._parameters['bias']",
    ]
    kinds = {(str(g.source), g.kind) for g in r.guards}
    assert ("L['self']", GuardKind.MODULE_MATCH) in kinds
    assert ("L['self'].scale", GuardKind.EQUALS) in kinds
    assert ("L['self']._modules['fc1']._parameters['weight']", GuardKind.TENSOR_MATCH) in kinds
    assert (None.__str__(), GuardKind.GLOBAL_STATE) in {(str(g.source), g.kind) for g in r.guards}


def test_containers_unrolled():
    check(Stack(), torch.randn(2, 4))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_train_eval_specialized(mode):
    m = getattr(TrainEval(), mode)()
    r = check(m, torch.randn(4, 4))
    assert any(
        str(g.source) == "L['self'].training" and g.expected == (mode == "train") for g in r.guards
    )


def test_parameter_used_twice_is_one_input():
    r = check(WithParam(), torch.randn(2, 3))
    placeholders = [n for n in r.graphs[0].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 2


def test_super_forward():
    check(Child(), torch.randn(2, 4))


def test_submodule_and_method():
    check(Caller(), torch.randn(2, 4))


def test_property():
    check(PropertyModule(), torch.randn(2, 3))


def test_conv_norm_embedding():
    check(Convs(), torch.randn(2, 3, 6, 6), torch.randint(0, 10, (2, 5)))


def test_forward_hooks_are_inlined():
    m = MLP()
    m.fc1.register_forward_hook(lambda mod, args, out: out * 0.5)
    m.fc2.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    check(m, torch.randn(2, 4))


def test_module_called_directly():
    m = MLP()
    r = _capture(m.__call__, torch.randn(2, 4))
    x = torch.randn(2, 4)
    torch.testing.assert_close(r.function(x), m(x))


def test_a_module_subclass_call_override_is_traced():
    """A submodule whose class (or a base between it and Module) overrides ``__call__`` runs
    that override, not forward alone."""

    class Doubled(nn.Linear):
        def __call__(self, x):
            return super().__call__(x) * 2

    class Inherits(Doubled):
        pass

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Doubled(2, 2), Inherits(2, 2)

        def forward(self, x):
            return self.b(self.a(x))

    m = Outer()
    x = torch.randn(3, 2)
    r = check(m, x)
    torch.testing.assert_close(r.function(x), m.b.forward(m.a.forward(x) * 2) * 2)


def test_attribute_store_is_replayed():
    class Recorder(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls = self.calls + 1
            self.last = x * 2
            return x + 1

    m = Recorder()
    r = _capture(m.forward, torch.randn(2))
    assert m.calls == 0
    x = torch.randn(2)
    r.function(x)
    assert m.calls == 1
    torch.testing.assert_close(m.last, x * 2)
    assert r.side_effects


def test_input_list_mutation_is_replayed():
    def fn(xs, x):
        xs.append(x * 2)
        return x + 1

    lst = []
    r = _capture(fn, lst, torch.randn(2))
    assert lst == []
    x = torch.randn(2)
    out_list = []
    r.function(out_list, x)
    assert len(out_list) == 1
    torch.testing.assert_close(out_list[0], x * 2)


def test_root_source_names():
    m = MLP()
    r = _capture(m.forward, torch.randn(2, 4))
    assert any(g.source == LocalSource("x") for g in r.guards)


# --- real models as one graph ----------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_timm_resnet18_one_graph(mode):
    timm = pytest.importorskip("timm")
    m = getattr(timm.create_model("resnet18", pretrained=False, num_classes=10), mode)()
    x = torch.randn(2, 3, 32, 32)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    r = _capture(m.forward, x)
    assert len(r.graphs) == 1
    m.load_state_dict(state)
    expected = m(x)
    m.load_state_dict(state)
    actual = r.function(x)
    torch.testing.assert_close(actual, expected)


def _small_bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        vocab_size=100,
        max_position_embeddings=64,
    )
    return transformers.BertModel(cfg)


def _small_gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64)
    return transformers.GPT2Model(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("make", [_small_bert, _small_gpt2], ids=["bert", "gpt2"])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_transformers_one_graph(make, mode):
    m = getattr(make(), mode)()
    ids = torch.randint(0, 100, (2, 8))
    r = _capture(m.forward, ids)
    assert len(r.graphs) == 1
    torch.manual_seed(0)
    expected = m(ids)
    torch.manual_seed(0)
    actual = r.function(ids)
    assert type(actual) is type(expected)
    torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state)


@pytest.mark.slow
@pytest.mark.parametrize("make", [_small_bert, _small_gpt2], ids=["bert", "gpt2"])
def test_transformers_export(make):
    """One exported graph, equal to eager on new inputs (also on the newest transformers)."""
    from kiln.capture import export

    m = make().eval()
    exported = export(m, torch.randint(0, 100, (2, 8)), use_cache=False)
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        expected = m(ids, use_cache=False).last_hidden_state
        actual = exported(ids, use_cache=False).last_hidden_state
    torch.testing.assert_close(actual, expected)


@pytest.mark.slow
def test_bert_with_mask_and_classification_loss():
    transformers = pytest.importorskip("transformers")
    bert = _small_bert()
    model = transformers.BertForSequenceClassification(bert.config).eval()
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 5:] = 0
    kwargs = {"attention_mask": mask, "labels": torch.tensor([0, 1])}
    r = capture(
        model.forward,
        (ids,),
        kwargs,
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
    )
    assert len(r.graphs) == 1
    actual, expected = r.function(ids, **kwargs), model(ids, **kwargs)
    torch.testing.assert_close(actual.loss, expected.loss)
    torch.testing.assert_close(actual.logits, expected.logits)


@pytest.mark.slow
def test_gpt2_lm_head_with_labels():
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2LMHeadModel(_small_gpt2().config).eval()
    ids = torch.randint(0, 100, (2, 8))
    r = capture(
        model.forward,
        (ids,),
        {"labels": ids},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
    )
    assert len(r.graphs) == 1
    torch.testing.assert_close(r.function(ids, labels=ids).loss, model(ids, labels=ids).loss)


@pytest.mark.slow
def test_llama_causal_lm_one_graph():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 100, (2, 8))
    r = _capture(model.forward, ids)
    assert len(r.graphs) == 1
    torch.testing.assert_close(r.function(ids).logits, model(ids).logits)


def test_module_list_slice_keeps_sources():
    class Trunk(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(4)])

        def forward(self, x):
            for layer in self.layers[1:3]:
                x = layer(x)
            return x

    r = check(Trunk(), torch.randn(1, 2))
    sources = [str(n.meta["source"]) for n in r.graphs[0].graph.nodes if n.op == "placeholder"]
    assert "L['self']._modules['layers']._modules['1']._parameters['weight']" in sources
    assert not any("_modules['0']" in s for s in sources)


def test_backward_through_captured_function_matches_eager():
    m = MLP()
    x = torch.randn(3, 4)
    r = _capture(m.forward, x)
    r.function(x).sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for got, want in zip(grads, [p.grad for p in m.parameters()]):
        torch.testing.assert_close(got, want)


def test_nodes_know_their_user_frame():
    r = _capture(MLP().forward, torch.randn(2, 4))
    frames = [n.meta["user_frame"] for n in r.graphs[0].graph.nodes if n.op == "call_function"]
    assert frames and all(f.filename for f in frames)
    assert any("self.fc2(F.relu(self.fc1(x)))" in f.source for f in frames)


def _small_bart():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BartConfig(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        vocab_size=100,
        max_position_embeddings=64,
    )
    return transformers.BartModel(cfg)


def _small_t5():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(
        d_model=32, d_ff=37, num_layers=1, num_heads=2, vocab_size=100, d_kv=16
    )
    return transformers.T5Model(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("make", [_small_bart, _small_t5], ids=["bart", "t5"])
def test_encoder_decoder_one_graph(make):
    model = make().eval()
    ids = torch.randint(0, 100, (2, 8))
    r = _capture(model.forward, ids, decoder_input_ids=ids)
    assert len(r.graphs) == 1
    actual = r.function(ids, decoder_input_ids=ids)
    expected = model(ids, decoder_input_ids=ids)
    torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state)


class _ObservedDict(dict):
    """A dict subclass that only observes writes (as kiln.guards' watched module dicts do)."""

    __kiln_plain_dict__ = True


class IteratesItsDicts(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        for _, child in self._modules.items():
            x = child(x)
        return x + len(self._parameters) + len(self.__dict__)


def test_dict_subclass_marked_plain_is_traced_as_a_dict():
    m = IteratesItsDicts()
    for child in (m, m.a, m.b):
        state = _ObservedDict(vars(child))
        state["_modules"] = _ObservedDict(child._modules)
        state["_parameters"] = _ObservedDict(child._parameters)
        object.__setattr__(child, "__dict__", state)
    r = check(m, torch.randn(2, 4))  # one graph: no break on the subclass
    assert any(
        str(g.source) == "L['self']._modules" and g.expected is _ObservedDict
        for g in r.guards
        if g.kind is GuardKind.TYPE_MATCH
    )
