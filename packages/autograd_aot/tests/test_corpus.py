"""The differential corpus: forward values and gradients through aot_eager equal eager's."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kiln.autograd_aot import aot_eager_decomp_partition


def r(*shape, grad=True):
    return torch.randn(shape).requires_grad_(grad)


def pos(*shape):
    return (torch.rand(*shape) + 0.5).requires_grad_()


def _inplace_intermediate(x):
    y = x * 2
    y.add_(1).mul_(3)
    return y.relu_()


def _setitem(x, y):
    z = x.clone()
    z.select(0, 0).copy_(y[0] * 2)
    z[:, 1].add_(1)
    return z


def _view_mutation(x):
    z = x + 1
    v = z.view(-1)
    v[2:5].mul_(4)
    return z, z.t().contiguous()


def _transpose_mutation(x):
    z = x * 1.5
    z.t()[1].sub_(2.0)
    return z.sum(0)


def _out_variant(x, y):
    out = x.new_empty(3, 4)
    torch.add(x.detach(), y.detach(), out=out)
    return out * x


def _input_mutation(x, buf):
    buf.add_(1)
    buf[0].mul_(x.detach()[0])
    return x * buf


def _copy_into(x, y):
    z = x.new_zeros(3, 4)
    z.copy_(x)
    z[1].copy_(y[0])
    return z * y


def _masked(x):
    z = x.clone()
    z.masked_fill_(x > 0, 0.5)
    return z


def _split_mutation(x):
    z = x * 2
    z.narrow(0, 2, 2).add_(10)
    return z


def _unbind_mutation(x):
    z = x + 0
    z.select(1, 2).zero_()
    return z.exp()


def _index_put(x, v):
    z = x.clone()
    z.index_put_((torch.tensor([0, 2]),), v)
    return z


def _return_input_view(x):
    return x.view(-1), x.t(), x * 2


def _return_input(x, y):
    return x, y + x


def _mutated_returned(x, buf):
    buf.mul_(2)
    return buf, x + buf


def _non_tensor_out(x):
    return x.sin(), 3, None, x.shape[0]


def _no_grad_outputs(x):
    return x.argmax(-1), x.max(dim=1), (x > 0).float()


def _mixed_dtype_inplace(x):
    z = x.clone().to(torch.float64)
    z += x
    return z.float()


def _detach_branch(x):
    return x.detach() * x


def _same_output_twice(x):
    y = x * 2
    return y, y


def _rms_norm(x, w):
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + 1e-6))


def _rotary(x):
    pos = torch.arange(x.shape[-2], dtype=x.dtype)
    freqs = 1.0 / (10000 ** (torch.arange(0, x.shape[-1], 2, dtype=x.dtype) / x.shape[-1]))
    angles = torch.cat([pos[:, None] * freqs, pos[:, None] * freqs], -1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * angles.cos() + rotated * angles.sin()


def _swiglu(x, w1, w2, w3):
    return (F.silu(x @ w1) * (x @ w3)) @ w2


def _patch_embed(x, w, cls, pos):
    p = F.conv2d(x, w, stride=4).flatten(2).transpose(1, 2)
    return torch.cat([cls.expand(x.shape[0], -1, -1), p], 1) + pos


def _masked_attention(x):
    scores = x @ x.transpose(-1, -2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]]).bool()
    scores = scores.masked_fill(~mask, -1e9)
    return torch.softmax(scores, -1, dtype=torch.float32) @ x


def _topk_sort(x):
    values, idx = x.topk(2, dim=-1)
    s, _ = x.sort(dim=0, descending=True)
    return values * 2, s[0] + values.sum(), idx


def _token_loss(logits):
    logp = F.log_softmax(logits, -1)
    target = torch.tensor([[1], [0], [2]])
    return -logp.gather(-1, target).mean()


def _mask_fill_by_index(x):
    z = x.clone()
    z.index_put_((z > 0,), torch.tensor(0.5))
    return z * x


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _attention(x, w):
    q, k, v = (x @ w).chunk(3, dim=-1)
    s = q @ k.transpose(-2, -1) / 4.0
    return torch.softmax(s.masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf")), -1) @ v


PROGRAMS = {
    # pointwise
    "add": (lambda x, y: x + y, [r(3, 4), r(3, 4)]),
    "sub_broadcast": (lambda x, y: x - y, [r(3, 4), r(4)]),
    "mul_scalar": (lambda x: x * 3 + 1, [r(5)]),
    "div": (lambda x, y: x / y, [r(3, 4), pos(3, 4)]),
    "pow": (lambda x: x.pow(3) + x**2, [r(4, 4)]),
    "exp_log": (lambda x: x.exp() + x.log(), [pos(6)]),
    "sqrt_rsqrt": (lambda x: x.sqrt() * x.rsqrt(), [pos(6)]),
    "sigmoid_tanh": (lambda x: x.sigmoid() * x.tanh(), [r(4, 5)]),
    "relu": (lambda x: F.relu(x), [r(4, 5)]),
    "gelu": (lambda x: F.gelu(x), [r(4, 5)]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [r(4, 5)]),
    "silu": (lambda x: F.silu(x), [r(4, 5)]),
    "mish": (lambda x: F.mish(x), [r(4, 5)]),
    "hardswish": (lambda x: F.hardswish(x) + F.hardsigmoid(x), [r(4, 5)]),
    "leaky_elu": (lambda x: F.leaky_relu(x, 0.1) + F.elu(x), [r(4, 5)]),
    "softplus": (lambda x: F.softplus(x), [r(4, 5)]),
    "clamp": (lambda x: x.clamp(-0.5, 0.5) + x.clamp(min=0.1), [r(4, 5)]),
    "hardtanh_relu6": (lambda x: F.hardtanh(x) + F.relu6(x * 4), [r(4, 5)]),
    "where": (lambda x, y: torch.where(x > y, x, y * 2), [r(4, 5), r(4, 5)]),
    "max_min": (lambda x, y: torch.maximum(x, y) - torch.minimum(x, y), [r(4), r(4)]),
    "abs_neg_recip": (lambda x: x.abs() - (-x) + (x.abs() + 1).reciprocal(), [r(7)]),
    "erf_sin_cos": (lambda x: x.erf() + x.sin() * x.cos(), [r(7)]),
    "atan2": (lambda x, y: torch.atan2(x, y), [r(5), r(5)]),
    "lerp_addcmul": (lambda x, y: torch.lerp(x, y, 0.3) + torch.addcmul(x, x, y), [r(5), r(5)]),
    "float_cast": (lambda x: x.double().sin().float(), [r(5)]),
    "half_cast": (lambda x: x.to(torch.bfloat16).float() * x, [r(5)]),
    # reductions
    "sum_mean": (lambda x: x.sum() + x.mean(dim=1).sum(), [r(4, 5)]),
    "var_std": (lambda x: x.var(dim=0) + x.std(dim=1, keepdim=True), [r(4, 5)]),
    "amax_max": (lambda x: x.amax(dim=1) + x.max(dim=0).values.sum(), [r(4, 5)]),
    "logsumexp": (lambda x: x.logsumexp(dim=-1), [r(4, 5)]),
    "norm": (lambda x: x.norm(dim=-1) + torch.linalg.vector_norm(x), [r(4, 5)]),
    "cumsum_prod": (lambda x: x.cumsum(0) + x.prod(dim=1, keepdim=True), [r(4, 5)]),
    "softmax": (lambda x: torch.softmax(x, -1), [r(4, 5)]),
    "log_softmax": (lambda x: F.log_softmax(x, dim=0), [r(4, 5)]),
    # matmul family
    "mm": (lambda x, y: x @ y, [r(3, 4), r(4, 5)]),
    "bmm": (lambda x, y: torch.bmm(x, y), [r(2, 3, 4), r(2, 4, 5)]),
    "matmul_broadcast": (lambda x, y: torch.matmul(x, y), [r(2, 3, 4), r(4, 5)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [r(3, 4), r(5, 4), r(5)]),
    "addmm": (lambda b, x, y: torch.addmm(b, x, y), [r(5), r(3, 4), r(4, 5)]),
    "einsum": (lambda x, y: torch.einsum("bij,bjk->bik", x, y), [r(2, 3, 4), r(2, 4, 5)]),
    "baddbmm": (
        lambda b, x, y: torch.baddbmm(b, x, y, alpha=0.5),
        [r(2, 3, 5), r(2, 3, 4), r(2, 4, 5)],
    ),
    "attention": (_attention, [r(2, 5, 8), r(8, 24)]),
    "sdpa": (_sdpa, [r(1, 2, 5, 8), r(1, 2, 5, 8), r(1, 2, 5, 8)]),
    # views and data movement
    "view_reshape": (lambda x: x.view(4, 3).reshape(2, 6) * 2, [r(3, 4)]),
    "permute_transpose": (lambda x: x.permute(2, 0, 1).transpose(0, 1) + 1, [r(2, 3, 4)]),
    "unsqueeze_squeeze": (
        lambda x: x.unsqueeze(0).squeeze(0).unsqueeze(-1) * x.unsqueeze(-1),
        [r(3, 4)],
    ),
    "expand": (lambda x: x.expand(3, 4, 5) * 2, [r(4, 5)]),
    "slicing": (lambda x: x[1:, ::2] * x[:-1, 1::2], [r(4, 6)]),
    "select_narrow": (lambda x: x[2] + x.narrow(1, 1, 2).sum(1)[0], [r(4, 3)]),
    "gather": (lambda x: x.gather(1, torch.tensor([[0, 2], [1, 1], [2, 0]])), [r(3, 4)]),
    "index_select": (lambda x: x.index_select(0, torch.tensor([2, 0, 2])), [r(3, 4)]),
    "advanced_index": (lambda x: x[torch.tensor([0, 2]), 1:3], [r(3, 4)]),
    "chunk_split": (lambda x: x.chunk(3, 1)[2].sum(1) + x.split([1, 3], 0)[1].sum(), [r(4, 6)]),
    "unbind_stack": (lambda x: torch.stack(x.unbind(0)[::-1], 1), [r(3, 4)]),
    "cat": (lambda x, y: torch.cat([x, y, x * 2], dim=1), [r(3, 2), r(3, 4)]),
    "flatten": (lambda x: x.flatten(1) @ torch.ones(12, 2), [r(2, 3, 4)]),
    "roll_flip": (lambda x: x.roll(1, 0).flip(1) * x, [r(3, 4)]),
    "repeat": (lambda x: x.repeat(2, 3) + 1, [r(2, 2)]),
    "tril_triu": (lambda x: x.tril() - x.triu(1) * 2, [r(4, 4)]),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 1)), [r(2, 3, 4)]),
    "contiguous": (lambda x: x.t().contiguous().view(-1), [r(3, 4)]),
    # in-place and functionalization
    "inplace_intermediate": (_inplace_intermediate, [r(3, 4)]),
    "setitem": (_setitem, [r(3, 4), r(3, 4)]),
    "view_mutation": (_view_mutation, [r(3, 4)]),
    "transpose_mutation": (_transpose_mutation, [r(3, 4)]),
    "out_variant": (_out_variant, [r(3, 4), r(3, 4)]),
    "input_mutation": (_input_mutation, [r(3, 4), torch.randn(3, 4)]),
    "copy_into": (_copy_into, [r(3, 4), r(3, 4)]),
    "masked_fill": (_masked, [r(3, 4)]),
    "split_mutation": (_split_mutation, [r(4, 3)]),
    "unbind_mutation": (_unbind_mutation, [r(3, 4)]),
    "index_put": (_index_put, [r(3, 4), r(2, 4)]),
    "mixed_dtype_inplace": (_mixed_dtype_inplace, [r(3, 4)]),
    "mask_fill_by_index": (_mask_fill_by_index, [r(3, 4)]),
    # outputs
    "return_input_views": (_return_input_view, [r(3, 4)]),
    "return_input": (_return_input, [r(3), r(3)]),
    "mutated_returned": (_mutated_returned, [r(3), torch.randn(3)]),
    "non_tensor_outputs": (_non_tensor_out, [r(3)]),
    "no_grad_outputs": (_no_grad_outputs, [r(3, 4)]),
    "detach_branch": (_detach_branch, [r(3)]),
    "same_output_twice": (_same_output_twice, [r(3)]),
    "noncontiguous_input": (lambda x: x.sin() @ x.t(), [r(4, 3).t()]),
    "zero_size": (lambda x: x.sum(0) + 1, [r(0, 3)]),
    "zero_dim": (lambda x: x * x + 1, [r()]),
    "int_output": (lambda x: (x > 0).sum(), [r(5)]),
    "expanded_input": (lambda x: x * 2, [torch.randn(3, 1).expand(3, 4).requires_grad_()]),
    "input_view_mutation": (
        lambda x, b: (b.view(-1).add_(1), x * b.sum())[1],
        [r(2, 2), torch.randn(2, 2)],
    ),
    "output_view_of_mutated_input": (lambda b: b.add_(1).view(-1), [torch.randn(2, 2)]),
    # transformer/vision model idioms
    "rms_norm": (_rms_norm, [r(2, 3, 8), r(8)]),
    "rotary": (_rotary, [r(2, 5, 8)]),
    "swiglu": (_swiglu, [r(3, 8), r(8, 16), r(16, 8), r(8, 16)]),
    "patch_embed": (_patch_embed, [r(2, 3, 8, 8), r(6, 3, 4, 4), r(1, 1, 6), r(1, 5, 6)]),
    "masked_attention": (_masked_attention, [r(2, 3, 4)]),
    "topk_sort": (_topk_sort, [r(3, 5)]),
    "token_loss": (_token_loss, [r(3, 5)]),
    "normalize": (lambda x: F.normalize(x, dim=-1) * 3, [r(4, 6)]),
    "layer_scale_residual": (lambda x, g: x + g * F.gelu(x), [r(2, 4, 6), r(6)]),
    "repeat_interleave": (lambda x: x.repeat_interleave(2, dim=1) * 1.5, [r(2, 3)]),
    "cumsum_positions": (lambda x: x + torch.ones(2, 4).cumsum(-1)[..., None], [r(2, 4, 3)]),
    "embedding_padding": (
        lambda w: F.embedding(torch.tensor([0, 2, 0, 1]), w, padding_idx=0),
        [r(4, 3)],
    ),
    # losses
    "cross_entropy": (lambda x: F.cross_entropy(x, torch.tensor([1, 0, 3])), [r(3, 5)]),
    "cross_entropy_smooth": (
        lambda x: F.cross_entropy(x, torch.tensor([1, 0, 3]), label_smoothing=0.1),
        [r(3, 5)],
    ),
    "nll_loss": (lambda x: F.nll_loss(F.log_softmax(x, -1), torch.tensor([1, 0, 3])), [r(3, 5)]),
    "mse_l1": (lambda x, y: F.mse_loss(x, y) + F.l1_loss(x, y), [r(3, 5), r(3, 5)]),
    "bce_logits": (
        lambda x, y: F.binary_cross_entropy_with_logits(x, y.sigmoid()),
        [r(3, 5), r(3, 5)],
    ),
    # layers
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (5,), w, b), [r(3, 5), r(5), r(5)]),
    "group_norm": (lambda x: F.group_norm(x, 2, None, None), [r(2, 4, 3, 3)]),
    "embedding": (lambda w: F.embedding(torch.tensor([[0, 3], [3, 1]]), w), [r(5, 4)]),
    "conv2d": (
        lambda x, w, b: F.conv2d(x, w, b, padding=1, stride=2),
        [r(2, 3, 8, 8), r(4, 3, 3, 3), r(4)],
    ),
    "conv1d_grouped": (lambda x, w: F.conv1d(x, w, groups=2), [r(2, 4, 9), r(4, 2, 3)]),
    "max_pool": (lambda x: F.max_pool2d(x, 2), [r(2, 3, 6, 6)]),
    "avg_pool": (
        lambda x: F.avg_pool2d(x, 3, stride=2, padding=1) + F.adaptive_avg_pool2d(x, 1),
        [r(2, 3, 6, 6)],
    ),
    "interpolate": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), [r(1, 2, 3, 3)]),
}

MODULES = {
    "mlp": (lambda: nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3)), [r(4, 6)]),
    "batchnorm_train": (
        lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()),
        [r(2, 3, 6, 6)],
    ),
    "batchnorm_eval": (
        lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval(),
        [r(2, 3, 6, 6)],
    ),
    "batchnorm1d": (lambda: nn.Sequential(nn.BatchNorm1d(5)), [r(4, 5)]),
    "layernorm_module": (lambda: nn.Sequential(nn.Linear(5, 5), nn.LayerNorm(5)), [r(3, 5)]),
    "embedding_module": (lambda: nn.Embedding(10, 4), [torch.tensor([[1, 2], [9, 1]])]),
    "multihead_attention": (lambda: _MHA(), [r(2, 5, 8)]),
    "residual_block": (lambda: _Residual(), [r(2, 4, 5, 5)]),
}


class _MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)) + x)


def test_corpus_size():
    assert len(PROGRAMS) + len(MODULES) >= 80


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program(name, check):
    fn, inputs = PROGRAMS[name]
    check(fn, inputs)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module(name, check):
    make, inputs = MODULES[name]
    torch.manual_seed(0)
    check(make(), inputs)


# Every program passes with decompositions too; a third of them (and the ones the
# decompositions rewrite most) keep the suite short.
_DECOMPOSED = sorted(
    set(sorted(PROGRAMS)[::3])
    | {"softmax", "layer_norm", "view_mutation", "cross_entropy", "conv2d", "rms_norm"}
    | {"mask_fill_by_index"}
)


@pytest.mark.parametrize("name", _DECOMPOSED)
def test_program_decomposed(name, check):
    fn, inputs = PROGRAMS[name]
    check(fn, inputs, backend=aot_eager_decomp_partition)


@pytest.mark.parametrize("name", ["batchnorm_train", "multihead_attention"])
def test_module_decomposed(name, check):
    make, inputs = MODULES[name]
    torch.manual_seed(0)
    check(make(), inputs, backend=aot_eager_decomp_partition)
