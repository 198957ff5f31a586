"""Programs whose kernels once read or wrote outside their buffers, over repeated calls
against eager.

transformers' Phi (partial rotary embeddings: ``rotate_half`` cats the halves of a slice of
each head, shifted) compiled with the default backend raised an illegal memory access on a
GPU: a cat's last piece was loaded unmasked, its index shifted back before its input on the
other pieces' lanes. On CPU the ``loopir_reference`` backend checks every load and store
against its buffer (so these fail there without a GPU); on CUDA an out-of-bounds read lands in
mapped memory most of the time, so ``bash benchmarks/gpu_run.sh memcheck`` runs this file under
``compute-sanitizer``, where every one is an error.

A tensor whose strides leave gaps (``h[:, 0]`` of a 3-d ``h``) loses them in ``clone``: the
copies the autotuner benchmarks written tensors through, and a CUDA graph's static inputs, are
laid out as the original instead (``kiln.loopir.wrapper.clone_strided``).
"""

from __future__ import annotations

import copy

import pytest
import torch

import kiln

CUDA = pytest.param(
    "cuda",
    "kiln",
    marks=pytest.mark.gpu,
)


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _phi(vocab: int) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.PhiConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, partial_rotary_factor=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.PhiForCausalLM(config)


def _repeated_calls(model, device, backend, mode, calls=3, vocab=96):
    """``calls`` calls on fresh token batches, each against eager: logits, or in training
    the model's own causal-LM loss and every parameter's gradient."""
    model = model.to(device)
    reference = copy.deepcopy(model)
    model.train(mode == "training")
    reference.train(mode == "training")
    compiled = kiln.compile(model, backend=backend)
    tol = {"atol": 2e-4, "rtol": 2e-4}
    for _ in range(calls):
        ids = torch.randint(0, vocab, (2, 24), device=device)
        if mode == "inference":
            with torch.no_grad():
                torch.testing.assert_close(compiled(ids).logits, reference(ids).logits, **tol)
            continue
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
        loss = compiled(ids, labels=ids).loss
        expected = reference(ids, labels=ids).loss
        loss.backward()
        expected.backward()
        torch.testing.assert_close(loss, expected, **tol)
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m, n=name: f"{n}: {m}")
    assert kiln.stats().eager_fallbacks == 0


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize(("device", "backend"), [("cpu", "loopir_reference"), CUDA])
def test_phi_partial_rotary(device, backend, mode, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    _repeated_calls(_phi(vocab=96), device, backend, mode)


class _FirstToken(torch.nn.Module):
    """A BERT-style pooler's input: the first token of a layer-normed residual sum, returned
    as the view eager returns (strides with gaps), computed by one kernel of its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x + residual)[:, 0]


@pytest.mark.gpu
def test_an_output_with_gaps_is_autotuned_in_its_own_layout():
    """Autotuning benchmarks a kernel's written tensors through scratch copies: a plain clone
    of this output is contiguous and 256 times smaller than the kernel's indexing reaches,
    and its benchmark wrote megabytes past it (an illegal memory access in DPR)."""
    model = _FirstToken(768).cuda()
    compiled = kiln.compile(model)
    for _ in range(3):
        x, residual = (torch.randn(16, 256, 768, device="cuda") for _ in range(2))
        with torch.no_grad():
            out = compiled(x, residual)
            torch.testing.assert_close(out, model(x, residual), atol=1e-4, rtol=1e-4)
        assert out.stride() == (256 * 768, 1)
    torch.cuda.synchronize()
    assert kiln.stats().eager_fallbacks == 0


@pytest.mark.gpu
def test_a_cuda_graph_copies_an_input_with_gaps_in_its_layout():
    """Under ``reduce-overhead`` every non-parameter input is copied into a static buffer the
    recording reads; the kernels index it with the traced input's strides, so the buffer must
    have them (a contiguous clone of ``x[:, 0]`` is smaller than that indexing reaches)."""

    def f(rows: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(rows) * 2 + 1

    compiled = kiln.compile(f, mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(64, 512, 1024, device="cuda")
        rows = x[:, 3]
        torch.testing.assert_close(compiled(rows), f(rows))
    torch.cuda.synchronize()
    assert kiln.stats().eager_fallbacks == 0
