"""Memory safety of compiled models on CUDA: repeated calls against eager, one model a process.

    python3 benchmarks/gpu_memcheck.py phi --mode training --calls 3 [--layers 12] [--batch 16]
    python3 benchmarks/gpu_memcheck.py hf_llama --preset cpu --mode inference --calls 2

``phi`` is transformers' PhiForCausalLM (partial rotary embeddings, attention and MLP in
parallel, ``gelu_new``; trained on its own causal-LM loss); any other name is an entry of
``benchmarks/models`` at ``--preset``. The model is compiled with ``kiln.compile`` (default
backend) and called ``--calls`` times on fresh inputs, each call checked against eager (float32,
TF32 off; in training every parameter's gradient). A kernel whose launch raises prints its name,
generated source and arguments first, so under ``CUDA_LAUNCH_BLOCKING=1`` or
``compute-sanitizer`` the kernel at fault is named. ``bash benchmarks/gpu_run.sh memcheck`` runs
the GPU tests and a set of these under ``compute-sanitizer --tool memcheck``.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def phi(
    layers: int, batch: int, seq: int, hidden: int, heads: int, vocab: int
) -> tuple[torch.nn.Module, Callable[[], Inputs], Callable[[Any], torch.Tensor]]:
    """PhiForCausalLM from a config, its token batches (``labels`` too: the loss is the
    model's own shifted cross entropy) and that loss."""
    from transformers import PhiConfig, PhiForCausalLM

    config = PhiConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=max(seq, 2048),
    )

    def inputs() -> Inputs:
        ids = torch.randint(0, vocab, (batch, seq), device="cuda")
        return (ids,), {"labels": ids}

    return PhiForCausalLM(config), inputs, lambda out: out.loss


def suite_model(
    name: str, preset: str
) -> tuple[torch.nn.Module, Callable[[], Inputs], Callable[[Any], torch.Tensor]]:
    """An entry of ``benchmarks/models``, with fresh inputs of its example's shapes, trained on
    a weighted sum of its main output (the suite's mean square of a final LayerNorm's output
    is nearly constant: its gradients are rounding noise, equal to eager's only by chance)."""
    from benchmarks.gpu_grad_check import weighted_loss
    from benchmarks.models import first_tensor, get

    spec = get(name)
    built = spec.build(preset)

    def fresh(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if x.is_floating_point():
            return torch.randn_like(x, device="cuda")
        low = int(x.min())
        return torch.randint(low, int(x.max()) + 1, x.shape, dtype=x.dtype, device="cuda")

    def inputs() -> Inputs:
        return tuple(map(fresh, built.args)), {k: fresh(v) for k, v in built.kwargs.items()}

    return built.model, inputs, lambda out: weighted_loss(first_tensor(out).float())


def _watch_launches() -> None:
    """Name the kernel whose launch raises (under CUDA_LAUNCH_BLOCKING, the faulting one)."""
    from kiln.codegen_triton import runtime

    call = runtime.TritonLauncher.__call__

    def watched(self: Any, *args: torch.Tensor) -> None:
        try:
            call(self, *args)
        except Exception:
            shapes = [(tuple(a.shape), tuple(a.stride()), a.dtype) for a in args]
            print(f"FAULT in kernel {self.ks.name} ({self.path}) args={shapes}", flush=True)
            raise

    runtime.TritonLauncher.__call__ = watched  # type: ignore[method-assign]


def check_calls(
    model: torch.nn.Module,
    inputs: Callable[[], Inputs],
    loss: Callable[[Any], torch.Tensor],
    mode: str,
    calls: int,
    tol: float,
) -> bool:
    """``calls`` calls of the compiled model against eager; True when every one matched."""
    import kiln
    from benchmarks.models import first_tensor

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.cuda()
    reference = copy.deepcopy(model)
    model.train(mode == "training")
    reference.train(mode == "training")
    compiled = kiln.compile(model)
    ok = True
    pairs: list[tuple[str, torch.Tensor | None, torch.Tensor | None]]
    for i in range(calls):
        args, kwargs = inputs()
        start = time.perf_counter()
        if mode == "inference":
            if "labels" in kwargs:
                kwargs = {k: v for k, v in kwargs.items() if k != "labels"}
            with torch.no_grad():
                got = first_tensor(compiled(*args, **kwargs))
                want = first_tensor(reference(*args, **kwargs))
            pairs = [("output", got, want)]
        else:
            for m in (model, reference):
                m.zero_grad(set_to_none=True)
            loss(compiled(*args, **kwargs)).backward()
            loss(reference(*args, **kwargs)).backward()
            named = zip(model.named_parameters(), reference.parameters(), strict=True)
            pairs = [(name, p.grad, q.grad) for (name, p), q in named]
        torch.cuda.synchronize()
        scale = max(float(b.abs().max()) for _, _, b in pairs if b is not None and b.numel())
        errors = {name: _error(a, b) / (scale + 1e-30) for name, a, b in pairs}
        bad = [name for name, e in errors.items() if e > tol]
        print(
            f"call {i}: {time.perf_counter() - start:.2f}s, "
            f"max error {max(errors.values()):.2e} of the largest reference value"
            + (f" MISMATCH {bad[:5]}" if bad else ""),
            flush=True,
        )
        ok = ok and not bad
    stats = kiln.stats()
    print(f"eager fallbacks {stats.eager_fallbacks}, graph breaks {stats.graph_breaks}")
    return ok and stats.eager_fallbacks == 0


def _error(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """Largest difference, a missing gradient counting as zeros (eager leaves None where no
    loss term reaches a parameter; compiled backwards give zeros there). The caller divides
    by the largest reference value of all gradients, not this one's: a parameter whose exact
    gradient is zero (a key projection's bias) has a gradient of rounding noise in both."""
    if a is None:
        if b is None:
            return 0.0
        a = torch.zeros_like(b)
    elif b is None:
        b = torch.zeros_like(a)
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="phi, or a benchmarks/models entry")
    p.add_argument("--mode", default="inference", choices=["inference", "training"])
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--preset", default="cpu", help="benchmarks/models size preset")
    p.add_argument("--layers", type=int, default=12, help="phi only, as the next four")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=51200)
    p.add_argument("--tol", type=float, default=1e-3)
    args = p.parse_args()
    _watch_launches()
    torch.manual_seed(0)
    if args.model == "phi":
        built = phi(args.layers, args.batch, args.seq, args.hidden, args.heads, args.vocab)
    else:
        built = suite_model(args.model, args.preset)
    ok = check_calls(*built, args.mode, args.calls, args.tol)
    print("PASS" if ok else "FAIL", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
