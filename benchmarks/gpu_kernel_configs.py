"""Re-run one generated Triton kernel with several launch configs on the arguments it really got.

    python3 benchmarks/gpu_kernel_configs.py densenet121 4 kiln_red_threshold_backward \\
        [--batch 2] [--configs 1,2048,4 1,2048,8 ...] [--save DIR]

Runs one training step of the first N feature layers of a timm model under Kiln, keeps a copy
of the arguments of the first launch of the first kernel whose name starts with the prefix,
then launches that kernel with each config on fresh copies and groups the configs whose
outputs agree. ``--save`` writes the kernel source, its inputs (in files under 14 MB) and each
config's outputs, to compare with Triton's interpreter on a CPU machine. The DenseNet stem's
backward kernel gives three different wrong answers on the H100 (see docs/performance.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_grad_check import first_layers, weighted_loss

_CONFIGS = ["1,2048,4", "1,1024,8", "1,512,4", "1,2048,8", "1,4096,8", "8,512,8", "1,512,2"]


def capture(prefix: str) -> dict[str, Any]:
    """Patch the launcher so the first matching launch keeps (launcher, copied args)."""
    from kiln.codegen_triton import runtime

    seen: dict[str, Any] = {}
    launch = runtime.TritonLauncher.__call__

    def call(self: runtime.TritonLauncher, *args: torch.Tensor) -> None:
        if self.ks.name.startswith(prefix) and not seen:
            seen["launcher"] = self
            seen["args"] = [a.clone() for a in args]
        launch(self, *args)

    runtime.TritonLauncher.__call__ = call  # type: ignore[method-assign]
    return seen


def save_inputs(tensors: list[torch.Tensor], written: set[int], out: Path) -> None:
    group: dict[int, torch.Tensor] = {}
    size, n = 0, 0
    for i, t in enumerate(tensors):
        if i in written:
            continue
        if group and size + t.numel() * t.element_size() > 14e6:
            torch.save(group, out / f"inputs_{n}.pt")
            group, size, n = {}, 0, n + 1
        group[i] = t.cpu()
        size += t.numel() * t.element_size()
    torch.save(group, out / f"inputs_{n}.pt")


def agree(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to summation order: configs split reductions into different partial sums."""
    if not a.is_floating_point():
        return torch.equal(a, b)
    return torch.allclose(a, b, rtol=1e-3, atol=1e-3 * float(b.abs().max()), equal_nan=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("children", type=int)
    p.add_argument("prefix", help="start of the kernel's name")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--configs", nargs="*", default=_CONFIGS, help="XBLOCK,RBLOCK,num_warps")
    p.add_argument("--save", type=Path)
    args = p.parse_args()

    import kiln
    from kiln.codegen_triton.autotune import Config

    seen = capture(args.prefix)
    model, x = first_layers(args.model, args.children, args.batch)
    weighted_loss(kiln.compile(model)(x)).backward()
    torch.cuda.synchronize()
    if not seen:
        raise SystemExit(f"no kernel named {args.prefix}* was launched")
    launcher = seen["launcher"]
    tensors = [seen["args"][i] for i in launcher.positions]
    written = set(launcher.tuner.written)
    print(
        f"{launcher.ks.name}: sizes {launcher.scalars}, autotune candidates {launcher.tuner.configs}"
    )
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        (args.save / "kernel.py").write_text(launcher.path.read_text())
        save_inputs(tensors, written, args.save)

    groups: list[tuple[list[str], list[torch.Tensor]]] = []
    for text in args.configs:
        xb, rb, nw = map(int, text.split(","))
        copies = [t.clone() for t in tensors]
        launcher.run(Config(xb, rb, nw), copies)
        torch.cuda.synchronize()
        outs = [copies[i] for i in sorted(written)]
        if args.save:
            torch.save([o.cpu() for o in outs], args.save / f"outputs_{xb}_{rb}_{nw}.pt")
        for names, ref in groups:
            if all(agree(o, r) for o, r in zip(outs, ref, strict=True)):
                names.append(text)
                break
        else:
            groups.append(([text], outs))
    for i, (names, _) in enumerate(groups):
        print(f"outputs {i}: {' '.join(names)}")


if __name__ == "__main__":
    main()
