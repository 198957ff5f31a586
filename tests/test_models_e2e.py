"""Small real models end to end against eager: attention (MHA, GPT-2) and a convolutional net.

Each runs through the default ``kiln`` backend (C++ kernels on CPU) and ``loopir_reference``,
for inference and for training (gradients of every parameter). MHA and GPT-2 gave wrong
results until extern kernels' outputs got the strides ATen really produces; the counters
show that no extern result is copied to other strides and that nothing falls back to ATen.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import kiln
from kiln.capture import counters

BACKENDS = ["kiln", "loopir_reference"]
TOL = {"atol": 2e-4, "rtol": 2e-4}


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _check(model, args, mode, backend, loss=None, device="cpu"):
    """``model`` compiled against eager on ``args``: outputs, and in training gradients."""
    torch.manual_seed(0)
    model = model.to(device)
    args = tuple(a.to(device) for a in args)
    reference = copy.deepcopy(model)
    model.train(mode == "training")
    reference.train(mode == "training")
    compiled = kiln.compile(model, backend=backend)
    loss = loss or (lambda out: out.float().square().mean())
    if mode == "inference":
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), reference(*args), **TOL)
    else:
        loss(compiled(*args)).backward()
        loss(reference(*args)).backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            assert p.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")
    stats = kiln.stats()
    assert stats.eager_fallbacks == 0
    assert stats.graph_breaks == 0
    snap = counters.snapshot()
    assert "extern_copies" not in snap, snap["extern_copies"]
    return snap


class _Attention(torch.nn.Module):
    def __init__(self, need_weights: bool) -> None:
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(32, 4, bias=True)
        self.need_weights = need_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.mha(x, x, x, need_weights=self.need_weights)
        return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention(backend, mode, need_weights):
    torch.manual_seed(0)
    model = _Attention(need_weights)
    x = torch.randn(10, 3, 32)  # (sequence, batch, embedding)
    snap = _check(model, (x,), mode, backend)
    assert "fallback_ops" not in snap


def _gpt2(vocab: int = 100):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=vocab, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=vocab - 1, eos_token_id=vocab - 1,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).logits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_gpt2(backend, mode):
    model = _Logits(_gpt2())
    ids = torch.randint(0, 100, (2, 16))
    snap = _check(model, (ids,), mode, backend)
    assert "fallback_ops" not in snap
    assert snap["extern_kernels"]  # GEMMs (and attention when SDPA is used)


@pytest.fixture
def small_products_padded(monkeypatch):
    """The matmul padding for products this small (real graphs pad only large ones)."""
    from kiln.loopir import matmul_padding  # noqa: PLC0415

    monkeypatch.setattr(matmul_padding, "MIN_ROWS", 8)
    monkeypatch.setattr(matmul_padding, "MIN_OUTPUT", 64)


@pytest.mark.usefixtures("small_products_padded")
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_gpt2_logits_on_a_padded_width(mode, monkeypatch):
    """With a backend asking for 16-byte GEMM rows (Triton's), the 98 float32 logits per
    token are computed 100 wide (TF32 on) and narrowed: graph outputs keep the padded rows
    and no copy is made; gradients agree."""
    from kiln.loopir import BackendTraits, ReferenceBackend  # noqa: PLC0415

    monkeypatch.setattr(ReferenceBackend, "traits", BackendTraits(matmul_align_bytes=16))
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)  # no effect on CPU
    model, ids = _Logits(_gpt2(vocab=98)), torch.randint(0, 98, (2, 16))
    snap = _check(model, (ids,), mode, "loopir_reference")
    assert "output_copies" not in snap
    if mode == "inference":
        with torch.no_grad():
            logits = kiln.compile(model, backend="loopir_reference")(ids)
        assert logits.stride() == (16 * 100, 100, 1)


def _convnet():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, 1),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=2),
        torch.nn.GroupNorm(2, 8),
        torch.nn.GELU(),
        torch.nn.AvgPool2d(2),
        torch.nn.Conv2d(8, 16, 1),
        torch.nn.AdaptiveAvgPool2d((3, 2)),
        torch.nn.Flatten(),
        torch.nn.Linear(96, 10),
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_convnet_with_pooling(backend, mode):
    x = torch.randn(2, 3, 17, 15)
    snap = _check(_convnet(), (x,), mode, backend)
    assert "fallback_ops" not in snap
    assert set(snap["extern_kernels"]) <= {
        "aten.convolution.default",
        "aten.convolution_backward.default",
        "aten.addmm.default",
        "aten.mm.default",
        "aten.max_pool2d_with_indices_backward.default",  # the C++ backend's extern_ops
    }


CUDA = [
    pytest.param(
        "cuda",
        marks=pytest.mark.gpu,
    )
]


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_attention_models_on_cuda(device, mode):
    """Triton kernels around cuBLAS and the fused CUDA attention kernels: their results'
    planned strides match what the kernels produce (no extern copies)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(10, 3, 32)
    snap = _check(_Attention(False), (x,), mode, "kiln", device=device)
    assert "fallback_ops" not in snap
    kiln.reset()
    ids = torch.randint(0, 100, (2, 16))
    snap = _check(_Logits(_gpt2()), (ids,), mode, "kiln", device=device)
    assert "fallback_ops" not in snap
    assert any("scaled_dot_product" in k for k in snap["extern_kernels"]), snap["extern_kernels"]


class _WrittenAttention(torch.nn.Module):
    """Self-attention with the softmax written out, as many models still have it."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (z.unflatten(-1, (4, 8)).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        probs = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1)
        return (probs @ v).transpose(1, 2).flatten(2)


@pytest.mark.parametrize("device", ["cpu", *CUDA])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_written_out_attention_runs_as_one_fused_attention(device, mode):
    torch.backends.cuda.matmul.allow_tf32 = False
    snap = _check(_WrittenAttention(), (torch.randn(3, 10, 32),), mode, "kiln", device=device)
    fused = [k for k in snap["extern_kernels"] if "scaled_dot_product" in k]
    assert len(fused) == (1 if mode == "inference" else 2), snap["extern_kernels"]
    assert "fallback_ops" not in snap


class _ShiftedWindowAttention(torch.nn.Module):
    """Swin's window attention of a shifted block, as timm writes it: q scaled first, a
    learned relative position bias, the shift's window mask through a 5-D view of the
    scores, and a dropout of rate 0 before ``@ v``."""

    windows, heads, tokens = 4, 2, 9

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.bias = torch.nn.Parameter(torch.randn(self.heads, self.tokens, self.tokens))
        mask = torch.where(torch.rand(self.windows, self.tokens, self.tokens) > 0.3, 0.0, -100.0)
        self.register_buffer("window_mask", mask)
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * 0.25) @ k.transpose(-2, -1) + self.bias.unsqueeze(0)
        shape = (-1, self.windows, self.heads, n, n)
        attn = attn.view(shape) + self.window_mask.unsqueeze(1).unsqueeze(0)
        attn = self.drop(attn.view(-1, self.heads, n, n).softmax(dim=-1))
        return (attn @ v).transpose(1, 2).reshape(b, n, c)


@pytest.mark.parametrize("device", ["cpu", *CUDA])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_shifted_window_attention_runs_as_one_fused_attention(device, mode):
    """The bias and the window mask are added into one mask; the bias's gradient matches
    eager's. (CPU's fused kernel has no gradient for a mask: its training step runs ATen's
    composite.)"""
    torch.backends.cuda.matmul.allow_tf32 = False
    model, x = _ShiftedWindowAttention(), torch.randn(8, 9, 16)
    snap = _check(model, (x,), mode, "kiln", device=device)
    fused = [k for k in snap["extern_kernels"] if "scaled_dot_product" in k]
    assert fused or (mode == "training" and device == "cpu"), snap["extern_kernels"]
    assert "fallback_ops" not in snap


class _StemThenBiasedAttention(torch.nn.Module):
    """A convolution stem, then attention with a relative position bias gathered keys-first
    and permuted heads-first (timm's Swin): on CUDA the inference graph is channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.qkv = torch.nn.Linear(16, 48)
        self.table = torch.nn.Parameter(torch.randn(17, 2))
        self.register_buffer("index", torch.randint(0, 17, (81,)))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image).flatten(2).transpose(1, 2)
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, 2, -1).permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.table[self.index].view(n, n, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
        attn = (q * 0.25) @ k.transpose(-2, -1) + bias
        return (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, c)


@pytest.mark.parametrize("device", ["cpu", *CUDA])
def test_attention_bias_in_a_channels_last_graph(device):
    """CUDA's memory-efficient kernel pads the bias's rows (9 keys to 16); the padded buffer
    must keep its rows innermost though the graph lays 4-D buffers out NHWC."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model, image = _StemThenBiasedAttention(), torch.randn(4, 3, 3, 3)
    snap = _check(model, (image,), "inference", "kiln", device=device)
    assert [k for k in snap["extern_kernels"] if "scaled_dot_product" in k]
    assert "fallback_ops" not in snap


class _PositionMaskedAttention(torch.nn.Module):
    """Masks built from positions, as HuggingFace builds them while a compiler captures:
    an all-true padding mask and a causal one (both constants of the graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (z.unflatten(-1, (4, 8)).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        i = torch.arange(x.shape[1], device=x.device)
        keep = (i[None, :] >= 0).expand(x.shape[0], 1, x.shape[1], -1)  # rows contiguous (CUDA)
        causal = i[None, :] <= i[:, None]
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        out = torch.nn.functional.scaled_dot_product_attention(a, k, v, attn_mask=causal)
        return out.transpose(1, 2).flatten(2)


@pytest.mark.parametrize("device", ["cpu", *CUDA])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_constant_attention_masks_are_dropped(device, mode):
    """No kernel builds either mask: the all-true one is dropped, the causal one becomes
    ``is_causal`` (so CUDA can run FlashAttention); gradients still match eager's."""
    torch.backends.cuda.matmul.allow_tf32 = False
    snap = _check(
        _PositionMaskedAttention(), (torch.randn(3, 10, 32),), mode, "kiln", device=device
    )
    if mode == "inference":  # (training has kernels of its own: the qkv gradient's)
        assert "kernels" not in snap, snap["kernels"]  # without the rewrite: one per mask
    fused = [k for k in snap["extern_kernels"] if "scaled_dot_product" in k]
    assert fused, snap["extern_kernels"]


@pytest.mark.usefixtures("small_products_padded")
@pytest.mark.parametrize("device", CUDA)
def test_unaligned_bfloat16_logits_on_cuda(device):
    """Triton's backend asks for 16-byte GEMM rows: 98 bfloat16 logits are computed 104 wide."""
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 98).to(device, torch.bfloat16)
    x = torch.randn(2, 16, 64, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        got, want = kiln.compile(head)(x), head(x)
    assert got.stride() == (16 * 104, 104, 1)
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)


def _depthwise_block():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.SiLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=16),  # depthwise
        torch.nn.BatchNorm2d(16),
        torch.nn.SiLU(),
        torch.nn.Conv2d(16, 8, 1),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
    )


@pytest.mark.parametrize("device", ["cpu", *CUDA])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_depthwise_separable_block(device, mode):
    """MobileNet's block. On CUDA the depthwise convolution is a kernel of the graph, fused
    with its batch norm and SiLU, and its backward runs NHWC (cuDNN) in a training graph
    that is otherwise NCHW: its results' planned strides must be cuDNN's (no extern copies)."""
    torch.backends.cudnn.allow_tf32 = False
    snap = _check(_depthwise_block(), (torch.randn(4, 3, 12, 10),), mode, "kiln", device=device)
    assert "fallback_ops" not in snap
    if mode == "inference":
        library = 2 if device == "cuda" else 3  # oneDNN runs the depthwise one on CPUs
        assert snap["extern_kernels"]["aten.convolution.default"] == library


def _numpy_statistic(x: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x)
    scale = float(np.tanh(h.detach().cpu().numpy().mean())) + 1.0
    return h * scale


@pytest.mark.parametrize("device", ["cpu", *CUDA])
def test_a_statistic_taken_through_numpy_compiles_up_to_float(device):
    """The numpy calls join the graph (on the GPU: a device copy to the CPU inside it), and
    only ``float()`` breaks it. On CUDA the copy once ran ``prims.device_put`` on meta data."""
    x = torch.randn(64, 64, device=device)
    compiled = kiln.compile(_numpy_statistic)
    torch.testing.assert_close(compiled(x), _numpy_statistic(x))
    stats = kiln.stats()
    assert stats.eager_fallbacks == 0
    assert stats.graph_breaks == 1


class _ChannelsLastHead(torch.nn.Module):
    """ConvNeXt's head: a channels-last feature map (permuted back from NHWC), pooled."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.fc(self.pool(x).flatten(1))


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_pooling_a_channels_last_map_to_one_pixel_is_one_graph(mode):
    """ATen pools it with a mean and an ``as_strided_`` that only restrides size-1 dims:
    no graph break, no eager fallback."""
    _check(_ChannelsLastHead(), (torch.randn(2, 8, 5, 6),), mode, "kiln")
    assert kiln.stats().graphs_compiled == 1
