"""Row softmax 32768x4096 float32 under Kiln with several persistent-reduction limits (GPU)."""

from __future__ import annotations

import torch
from triton.testing import do_bench

import kiln
from kiln.codegen_triton import options


def main() -> None:
    x = torch.randn(32768, 4096, device="cuda")
    out = torch.empty_like(x)
    copy = do_bench(lambda: out.copy_(x), return_mode="median")
    print(f"copy {copy:.3f} ms")
    for limit in (1024, 4096, 8192):
        options.persistent_reduction_limit = limit
        for n in (4096, 1000, 8192):
            y = torch.randn(32768 * 4096 // n, n, device="cuda")
            f = kiln.compile(lambda t: torch.softmax(t, -1))
            torch.testing.assert_close(f(y), torch.softmax(y, -1))
            ms = do_bench(lambda f=f, y=y: f(y), return_mode="median")
            eager = do_bench(lambda y=y: torch.softmax(y, -1), return_mode="median")
            print(
                f"limit {limit} cols {n}: kiln {ms:.3f} ms ({copy / ms:.0%} of copy), eager {eager:.3f}"
            )
            kiln.reset()


if __name__ == "__main__":
    main()
