"""``index.md``: the page a person opens first in a compiled frame's debug folder.

Every package dumps its artifacts into the frame's folder as it goes; this page says what the
frame's compile did with them: why it was compiled (first call, or the guard that failed), what
was captured, each graph break with its reason and user line, the guards, the files with what
each holds, the kernels, and the time each step took.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kiln import guards
from kiln.capture import artifacts

__all__ = ["FrameIndex", "writing"]

log = logging.getLogger(__name__)

# file name prefix (or suffix) -> what the file holds, in the order the compile makes them
FILES: tuple[tuple[str, str], ...] = (
    ("bytecode_original", "the frame's bytecode before capture"),
    ("bytecode_transformed", "the bytecode capture made: graph calls, breaks, resumes"),
    ("graph", "a captured torch-level graph, with each op's user source line"),
    ("guards", "the generated check of when the compiled code may run"),
    ("aot_joint", "forward and backward as one ATen graph"),
    ("aot_inference", "the ATen graph of a call without gradients"),
    ("aot_forward", "the forward ATen graph after the partition"),
    ("aot_backward", "the backward ATen graph after the partition"),
    ("loopir_ir", "the loop-level IR of an ATen graph"),
    ("loopir_kernels", "the kernels the scheduler fused"),
    ("output_code", "the wrapper; `python output_code.py` runs it on random inputs"),
    (".cpp", "a generated C++ kernel"),
    ("kernel", "a generated Triton kernel"),
    ("repro", "the minifier's reproducer; `python repro.py` reruns it"),
)


@dataclasses.dataclass
class FrameIndex:
    """What the frontend learns of one frame's compile, written as ``index.md`` at its end."""

    name: str
    reason: str
    result: Any = None
    outcome: str = "compiled"


def _one_line(text: str, width: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _what(file: str) -> str:
    for key, text in FILES:
        if file.startswith(key) or file.endswith(key):
            return text
    return ""


@contextlib.contextmanager
def writing(
    folder: Path | None,
    name: str,
    cache: guards.CodeCache,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Iterator[FrameIndex]:
    """Collect the frame's story in the block; write ``index.md`` into ``folder`` after it."""
    reason = "first call"
    if folder is not None and cache.entries:
        try:
            reason = f"recompile: {cache.failure_reason(*args, **kwargs)}"
        except Exception as e:
            reason = f"recompile (its reason could not be computed: {e})"
    index = FrameIndex(name, reason)
    try:
        yield index
    finally:
        if folder is not None:
            try:
                (folder / "index.md").write_text(render(index, folder, artifacts.notes()))
            except Exception:
                log.warning("could not write %s", folder / "index.md", exc_info=True)


def render(index: FrameIndex, folder: Path, notes: dict[str, list[str]]) -> str:
    """The page's Markdown text."""
    result = index.result
    lines = [f"# `{index.name}`", "", f"- why compiled: {index.reason}"]
    lines.append(f"- outcome: {index.outcome}")
    if result is not None:
        lines.append(f"- graphs captured: {len(result.graphs)}")
        lines.append(f"- graph breaks: {len(result.graph_breaks)}")
        lines.append(f"- guards: {len(result.guards)} (the check: `guards.py`)")
        for effect in result.side_effects:
            lines.append(f"- side effect replayed after the graph: {effect}")
        if result.graph_breaks:
            lines += ["", "## Graph breaks", ""]
            for brk in result.graph_breaks:
                lines.append(f"- **{brk.kind}**: {brk.explanation}")
                if brk.hint:
                    lines.append(f"  - hint: {brk.hint}")
                if brk.frame:
                    lines.append("  - at:")
                    lines += [f"    {row}" for row in str(brk.frame).splitlines()]
        lines += ["", "## Guards", ""]
        lines += [f"- `{_one_line(str(guard))}`" for guard in result.guards[:40]]
        if len(result.guards) > 40:
            lines.append(f"- ... {len(result.guards) - 40} more in `guards.py`")
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != "index.md")
    kernels = [
        f for f in files if f.endswith(".cpp") or (f.startswith("kernel") and f.endswith(".py"))
    ]
    lines += ["", "## Files", "", "| file | what |", "|---|---|"]
    lines += [f"| [`{f}`]({f}) | {_what(f)} |" for f in files if not f.endswith(".pkl")]
    lines += ["", f"Kernels generated: {len(kernels)}."]
    lines += ["", "## Timings", ""]
    if result is not None:
        lines += [
            f"- capture {step}: {seconds * 1e3:.1f} ms" for step, seconds in result.timings.items()
        ]
    for section, rows in notes.items():
        lines += ["", f"{section}:", ""]
        lines += [f"- {row}" for row in rows]
    return "\n".join(lines) + "\n"
