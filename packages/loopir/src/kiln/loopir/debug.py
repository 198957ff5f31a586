"""``output_code.py``: a compiled graph's wrapper, written so that it runs on its own.

The debug folder gets the wrapper's source as a module a person reads (buffer allocation, kernel
launches, extern calls) with the sizes, strides and dtypes of its inputs, and beside it
``output_code.pkl``: the kernels, constants and ops the source names, pickled as a whole-graph
cache stores them (a C++ kernel as its source, built again or found in the library cache).
``python output_code.py`` loads both, calls the graph on random inputs of the recorded sizes and
prints the time per call, as PyTorch's own compiler's dumps do.
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from kiln.capture import artifacts
from kiln.loopir import serialize
from kiln.loopir.wrapper import WrapperCode, base_globals, load_wrapper

__all__ = ["dump_output_code", "run_standalone"]

log = logging.getLogger(__name__)

_TEMPLATE = '''"""A graph as Kiln compiled it: the wrapper that allocates buffers and launches kernels.

`python {name}` runs it standalone: random inputs of the sizes recorded below, the kernels and
constants the wrapper names loaded from {data} beside it, and the time per call printed.
{note}"""

from pathlib import Path

import torch

from kiln.loopir import debug

{source}

# (size, stride, dtype, device) of each tensor input; other inputs as values
INPUTS = [
{inputs}
]

if __name__ == "__main__":
    debug.run_standalone(call, INPUTS, Path(__file__).with_name("{data}"))
'''


def _spec(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if not all(type(s) is int for s in (*value.shape, *value.stride())):
            return "    None,  # a tensor of symbolic size: write (size, stride, dtype, device)"
        return (
            f"    ({tuple(value.shape)}, {value.stride()}, {value.dtype}, {str(value.device)!r}),"
        )
    return f"    {value!r},"


def dump_output_code(wrapper: WrapperCode, example_inputs: Sequence[Any]) -> Path | None:
    """Write ``output_code.py`` (and its ``.pkl``) for a graph when the debug folder is on."""
    if artifacts.current_frame_dir() is None:
        return None
    common = base_globals()
    names = {k: v for k, v in wrapper.globals.items() if k not in common}
    try:
        data: bytes | None = serialize.dumps(names)
        note = ""
    except Exception as exc:
        data = None
        note = f"\nIt cannot run standalone: its kernels cannot be stored ({exc}).\n"
    path = artifacts.dump("output_code.py", "")
    if path is None:
        return None
    pkl = path.with_suffix(".pkl")
    text = _TEMPLATE.format(
        name=path.name,
        data=pkl.name,
        note=note,
        source=wrapper.source.rstrip() + "\n",
        inputs="\n".join(_spec(v) for v in example_inputs),
    )
    path.write_text(text)
    if data is not None:
        pkl.write_bytes(data)
    return path


def _make(spec: Any) -> Any:
    if not isinstance(spec, tuple) or len(spec) != 4 or not isinstance(spec[2], torch.dtype):
        return spec
    size, stride, dtype, device = spec
    span = 1 + sum((s - 1) * st for s, st in zip(size, stride, strict=True) if s)
    if dtype.is_floating_point or dtype.is_complex:
        flat = torch.randn(span, dtype=dtype, device=device)
    else:
        flat = torch.randint(0, 2, (span,), device=device).to(dtype)
    return flat.as_strided(size, stride)


def run_standalone(
    call: Callable[[list[Any]], Any], specs: Sequence[Any], data: Path, repeat: int = 20
) -> float:
    """Load ``call``'s names from ``data``, call it on random inputs, print the time per call."""
    if any(s is None for s in specs):
        msg = "an input has symbolic sizes: write its (size, stride, dtype, device) in INPUTS"
        raise SystemExit(msg)
    names = serialize.loads(data.read_bytes())
    wrapper = load_wrapper(inspect.getsource(call), names)
    inputs = [_make(s) for s in specs]
    cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
    wrapper.fn(list(inputs))  # the first call builds what is built lazily
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        wrapper.fn(list(inputs))
    if cuda:
        torch.cuda.synchronize()
    per_call = (time.perf_counter() - start) / repeat
    # the script's answer, on stdout as a benchmark's is
    sys.stdout.write(f"{per_call * 1e3:.3f} ms per call ({repeat} calls)\n")
    return per_call
