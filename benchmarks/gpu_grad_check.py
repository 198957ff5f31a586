"""Training gradients of a model's first layers on CUDA: eager float32 and Kiln, each against
eager float64, so an error of Kiln's own stands out from the model's conditioning.

    python3 benchmarks/gpu_grad_check.py densenet121 4 [--batch 8] [--config 1,2048,4]

Takes the first N children of the model's ``features`` (timm). ``--config X,R,W`` launches
every looped reduction whose heuristic config has RBLOCK 2048 with (XBLOCK, RBLOCK, num_warps)
instead: DenseNet's fused max-pool/ReLU/BatchNorm backward is wrong on the H100 with
(1, 2048, 8) and right with (1, 2048, 4) or (1, 512, 4) (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import copy

import torch


def first_layers(name: str, children: int, batch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The first ``children`` of a timm model's ``features`` on CUDA, and an input batch."""
    import timm

    torch.manual_seed(0)
    full = timm.create_model(name, pretrained=False)
    model = torch.nn.Sequential(*list(full.features.children())[:children]).cuda()
    return model, torch.randn(batch, 3, 224, 224, device="cuda")


def weighted_loss(out: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient differs per output element (a plain sum's would be all ones)."""
    weights = torch.linspace(-1, 1, out.numel(), device=out.device, dtype=out.dtype)
    return (out * weights.view(out.shape)).sum()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("children", type=int)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--config", help="XBLOCK,RBLOCK,num_warps for looped reductions")
    args = p.parse_args()

    import kiln
    from kiln.codegen_triton import autotune

    if args.config:
        xb, rb, nw = map(int, args.config.split(","))
        forced = autotune.Config(xb, rb, nw)

        def choose(self: autotune.Autotuner, run: object, launch_args: object) -> autotune.Config:
            first = self.configs[0]
            return forced if first.RBLOCK == 2048 else first

        autotune.Autotuner.choose = choose  # type: ignore[method-assign]

    torch.backends.cudnn.allow_tf32 = False
    model, x = first_layers(args.model, args.children, args.batch)

    def grads(
        fn: torch.nn.Module, module: torch.nn.Module, inp: torch.Tensor
    ) -> list[torch.Tensor]:
        for q in module.parameters():
            q.grad = None
        out = fn(inp)
        weighted_loss(out).backward()
        return [q.grad.double() for q in module.parameters()]  # type: ignore[union-attr]

    state = copy.deepcopy(model.state_dict())
    m64 = copy.deepcopy(model).double()
    truth = grads(m64, m64, x.double())
    eager = grads(model, model, x)
    model.load_state_dict(state)
    compiled = grads(kiln.compile(model), model, x)  # type: ignore[arg-type]

    def err(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    names = [n for n, _ in model.named_parameters()]
    rows = [
        (n, err(e, t), err(k, t)) for n, e, k, t in zip(names, eager, compiled, truth, strict=True)
    ]
    rows.sort(key=lambda r: r[2] / max(r[1], 1e-7), reverse=True)
    print("  eager/f64   kiln/f64  parameter (worst kiln-to-eager ratio first)")
    for name, e, k in rows[:8]:
        print(f"{e:11.3g} {k:10.3g}  {name}")


if __name__ == "__main__":
    main()
